"""One client-DP anomaly federation, run as a 1-round run then resumed for a 2nd round, shared by the anomaly
module's tests (rounds, resume, what the server receives, the published model) and the client-DP module's (clipping,
the released noise, the accountant's card): a Flower simulation on Ray costs ~25 s of start-up whatever it trains,
and both modules' properties hold on the same recorded messages.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fedfraud.training.anomaly.federated.task import RunSettings, build_model
from fedfraud.training.anomaly.federated.trainer import run_federated
from fedfraud.training.anomaly.run import Checkpoint, checkpoint_dir
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.training.data.synthetic import generate_dataset
from tests.integration.tiny_run import TINY_RUN

#: client-level DP of the shared run: a clipping norm well below the tiny model's update norm (~0.5), so every
#: update is clipped; fedavg, since the mean's noise std z·C/n is what the DP tests check (robust rules scale it)
SHARED_RUN: dict[str, Any] = {
    **TINY_RUN,
    "pooling": "sag",
    "dp-enabled": True,
    "dp-noise-multiplier": 0.8,
    "dp-clipping-norm": 0.05,
    "dp-delta": 1e-5,
    "aggregation": "fedavg",
}


@pytest.fixture(scope="session", name="resumed_dp_run")
def resumed_dp_run_fixture(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The run's data, outputs and every train/evaluate reply the server received, by run (``first``: round 1,
    ``resumed``: round 2), with, for each train round, the global model the banks were sent."""
    root: Path = tmp_path_factory.mktemp("fed")
    data, out = root / "data", root / "artifacts"
    generate_dataset(
        data, GeneratorConfig(banks=2, cardholders=16, days=21, fraud_rate=0.03, seed=6), raw_csv=False, progress=False
    )
    flat = {**SHARED_RUN, "data-dir": str(data), "out-dir": str(out)}
    settings = RunSettings.from_flat(flat)
    seen: dict[str, list[Any]] = {"first": [], "resumed": []}
    trained: list[tuple[int, dict[str, torch.Tensor], list[Any]]] = []

    def observer(run: str):
        def record(kind: str, rnd: int, replies: list[Any]) -> None:
            seen[run].append((kind, rnd, replies))
            if kind == "train":  # the global model these replies were trained from: the initial one, else the
                before = Checkpoint.load(checkpoint_dir(out, "federated"))  # last round's as released
                assert before is None or before.round == rnd - 1
                trained.append((rnd, build_model(settings).state_dict() if rnd == 1 else before.state_dict, replies))
        return record

    first = run_federated(RunSettings.from_flat({**flat, "rounds": 1}), observer=observer("first"))
    after_first = Checkpoint.load(checkpoint_dir(out, "federated"))
    resumed = run_federated(RunSettings.from_flat({**flat, "rounds": 2, "resume": True}), observer=observer("resumed"))
    return {"data": data, "out": out, "first": first, "resumed": resumed, "seen": seen, "trained": trained,
            "after_first": after_first, "settings": settings,
            "final": Checkpoint.load(checkpoint_dir(out, "federated"))}

"""Client-level DP on the anomaly federation, checked on the real messages of a real Flower simulation on Ray.

One 2-bank, 2-round run with DP on: every update a bank sends is within the
clipping norm of the global model it received; the global model the server
releases is the equal-weight mean of those updates plus Gaussian noise of std
noise_multiplier × clip / banks (measured on the real aggregated
parameters); the published card carries the accountant's (ε, δ).
"""

import math

import numpy as np
import pytest
import torch

from fedfraud.training.anomaly.run import Checkpoint, checkpoint_dir
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.training.data.synthetic import generate_dataset
from fedfraud.training.federated.accountant import gaussian_epsilon
from fedfraud.training.anomaly.federated.task import RunSettings, build_model
from fedfraud.training.anomaly.federated.trainer import run_federated
from fedfraud.training.registry import ModelRegistry
from tests.integration.tiny_run import TINY_RUN

pytestmark = pytest.mark.integration

CLIP = 0.05  # well below the tiny model's update norm (~0.5), so every update is clipped
NOISE = 0.8
SMALL = {
    **TINY_RUN,
    "rounds": 2,
    "dp-enabled": True,
    "dp-noise-multiplier": NOISE,
    "dp-clipping-norm": CLIP,
    "dp-delta": 1e-5,
    "aggregation": "fedavg",  # the mean's noise std z·C/n is what this test checks (robust rules scale it)
}


def _flat(state: dict[str, torch.Tensor]) -> np.ndarray:
    return torch.cat([v.reshape(-1).double() for v in state.values()]).numpy()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("dp")
    data, out = root / "data", root / "artifacts"
    generate_dataset(
        data, GeneratorConfig(banks=2, cardholders=16, days=21, fraud_rate=0.03, seed=6), raw_csv=False, progress=False
    )
    settings = RunSettings.from_flat({**SMALL, "data-dir": str(data), "out-dir": str(out)})
    seen: list[tuple[int, dict[str, torch.Tensor], list]] = []

    def observer(kind, rnd, replies):
        if kind != "train":
            return
        # the global model these replies were trained from: the initial one, else the last round's as released
        before = Checkpoint.load(checkpoint_dir(out, "federated"))
        received = build_model(settings).state_dict() if rnd == 1 else before.state_dict
        assert before is None or before.round == rnd - 1
        seen.append((rnd, received, replies))

    result = run_federated(settings, observer=observer)
    return {"settings": settings, "out": out, "result": result, "seen": seen,
            "final": Checkpoint.load(checkpoint_dir(out, "federated"))}


def test_every_update_a_bank_sends_is_clipped(run):
    assert [rnd for rnd, _, _ in run["seen"]] == [1, 2]
    for _, received, replies in run["seen"]:
        assert len(replies) == 2
        base = _flat(received)
        for reply in replies:  # the real message that crossed the bank boundary
            assert reply.content["metrics"]["equal-weight"] == 1
            sent = _flat(reply.content["arrays"].to_torch_state_dict())
            norm = float(np.linalg.norm(sent - base))
            # at the bound (clipping was active), never above it
            assert norm == pytest.approx(CLIP, rel=1e-4), norm


def test_released_model_is_the_mean_plus_noise_of_the_stated_std(run):
    sigma = NOISE * CLIP / 2  # Flower's fixed-clipping wrappers: z · C / number of sampled banks
    history = {rnd: replies for rnd, _, replies in run["seen"]}
    released = {1: run["seen"][1][1], 2: run["final"].state_dict}  # round 1's global came back in round 2
    for rnd in (1, 2):
        mean = np.mean([_flat(r.content["arrays"].to_torch_state_dict()) for r in history[rnd]], axis=0)
        residual = _flat(released[rnd]) - mean
        n = residual.size
        assert n > 10_000
        std = residual.std()
        # std of a sample std ≈ σ/√(2n): 5 standard errors
        assert abs(std - sigma) < 5 * sigma / math.sqrt(2 * n), (std, sigma)
        assert abs(residual.mean()) < 5 * sigma / math.sqrt(n)
        # Gaussian, not e.g. uniform: the fourth standardized moment is 3
        assert abs(np.mean(((residual - residual.mean()) / std) ** 4) - 3.0) < 0.15


def test_the_published_card_carries_the_accountants_epsilon(run):
    assert run["result"].version is not None
    version = ModelRegistry(run["out"]).get("anomaly", "latest")
    dp = version.privacy["client_dp"]
    assert dp["dp"] == "on" and dp["rounds"] == 2 and dp["banks"] == 2
    assert dp["noise_multiplier"] == NOISE and dp["clipping_norm"] == CLIP and dp["delta"] == 1e-5
    assert dp["epsilon"] == pytest.approx(gaussian_epsilon(NOISE, 2, 1e-5))
    assert dp["noise_std"] == [pytest.approx(NOISE * CLIP / 2)]
    assert version.privacy["formal_guarantee"].startswith(f"({dp['epsilon']:.3g}, 1e-05)-DP for one bank")
    assert "accountant: dp_accounting RDP" in version.model_card
    assert len(run["final"].dp_ledger) == 2

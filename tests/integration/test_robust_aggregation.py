"""One malicious bank in a real Flower simulation (3 banks, 2 rounds): the scaled-update attack breaks FedAvg, and
every robust rule (FedMedian, FedTrimmedAvg, Krum, MultiKrum) still yields a model as good as the clean one.

Bank 0 sends ``received − 50 × (its update)`` every round (``attack-mode = "scale:-50"``). "Survives" is measured
on the banks' own held-out data: the global model's mean validation loss (next-event NLL) after the last round,
against the initial model's: a surviving federation has learned something (lower loss), a broken one has not.
"""

import numpy as np
import pytest

from fedfraud.training.data.config import GeneratorConfig
from fedfraud.training.data.synthetic import generate_dataset
from fedfraud.training.anomaly.engine import evaluate_selection
from fedfraud.training.anomaly.federated.task import RunSettings, bank_data, build_model
from fedfraud.training.anomaly.federated.trainer import run_federated
from tests.integration.tiny_run import TINY_RUN

pytestmark = [pytest.mark.integration, pytest.mark.long]

SCALE = -50.0
SMALL = {
    **TINY_RUN,
    "rounds": 2,
    "publish": False,
    "trim-beta": 0.34,  # 3 banks: cut one at each end of every coordinate
}
ROBUST = ("fedmedian", "fedtrimmedavg", "krum", "multikrum")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("robust")
    data = root / "data"
    generate_dataset(
        data, GeneratorConfig(banks=3, cardholders=24, days=21, fraud_rate=0.03, seed=11), raw_csv=False, progress=False
    )
    base = RunSettings.from_flat({**SMALL, "data-dir": str(data), "out-dir": str(root / "initial")})
    model = build_model(base)
    initial = float(np.nanmean([evaluate_selection(model, bank_data(base, b))["val_loss"] for b in range(3)]))
    out: dict[str, dict] = {"initial": {"loss": initial}}
    for aggregation in ("fedavg", *ROBUST):
        spread: list[float] = []

        def observer(kind, rnd, replies, spread=spread):
            if kind != "train":
                return
            # read before the robust rules pop the arrays: how far bank 0's weights are from the honest banks'
            # mean, in units of the honest banks' distance to each other
            w = {
                int(r.content["metrics"]["partition-id"]): np.concatenate(
                    [a.numpy().ravel() for a in r.content["arrays"].values()]
                )
                for r in replies
            }
            honest = (w[1] + w[2]) / 2
            spread.append(float(np.linalg.norm(w[0] - honest) / np.linalg.norm(w[1] - w[2])))

        settings = RunSettings.from_flat(
            {**SMALL, "data-dir": str(data), "out-dir": str(root / aggregation), "aggregation": aggregation,
             "attack-mode": f"scale:{SCALE:g}", "attack-bank": 0}
        )
        result = run_federated(settings, observer=observer)
        out[aggregation] = {"loss": result.summary["val_loss_mean"], "spread": spread, "rounds": result.rounds}
    return out


def test_the_attacker_really_sent_scaled_updates(runs):
    for aggregation in ("fedavg", *ROBUST):
        run = runs[aggregation]
        assert run["rounds"] == 2 and len(run["spread"]) == 2
        assert min(run["spread"]) > 10, (aggregation, run["spread"])


def test_fedavg_does_not_survive_the_scaled_update(runs):
    initial, attacked = runs["initial"]["loss"], runs["fedavg"]["loss"]
    assert np.isfinite(initial)
    assert not np.isfinite(attacked) or attacked > initial, (attacked, initial)


@pytest.mark.parametrize("aggregation", ROBUST)
def test_each_robust_rule_survives_the_scaled_update(runs, aggregation):
    initial, attacked = runs["initial"]["loss"], runs[aggregation]["loss"]
    assert np.isfinite(attacked) and attacked < initial, (aggregation, attacked, initial)
    assert attacked < runs["fedavg"]["loss"]

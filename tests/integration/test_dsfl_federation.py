"""aggregation: dsfl in a real Flower simulation of the anomaly model, checked on the real messages.

One 2-bank, 1-round run with the shared public slice: every update a bank sends is its clipped update plus
Laplace noise whose scale is ``l1_clip/epsilon_top`` on a ``top_fraction`` of the coordinates and
``l1_clip/epsilon_rest`` on the others (the two scales are 10⁵ apart, so the magnitudes tell the groups apart);
the released model is the received one plus the contribution-weighted mean of those updates; the card carries
DSFL's accountant.
"""

import math

import numpy as np
import pytest
import torch

from fedfraud.training.anomaly.federated.task import RunSettings, build_model
from fedfraud.training.anomaly.federated.trainer import run_federated
from fedfraud.training.anomaly.run import Checkpoint, checkpoint_dir
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.training.data.synthetic import generate_dataset
from fedfraud.training.federated.dsfl import contribution_errors, contribution_weights, dsfl_epsilon
from fedfraud.training.registry import ModelRegistry
from tests.integration.tiny_run import TINY_RUN

pytestmark = pytest.mark.integration

CLIP, TOP, REST, FRACTION = 1e-3, 100.0, 1e-3, 0.1  # Laplace scales 1e-5 (selected) and 1.0 (the others)
SMALL = {
    **TINY_RUN,
    "rounds": 1,
    "aggregation": "dsfl",
    "dsfl-l1-clip": CLIP,
    "dsfl-epsilon-top": TOP,
    "dsfl-epsilon-rest": REST,
    "dsfl-epsilon-select": 0.1,
    "dsfl-top-fraction": FRACTION,
    "dsfl-seed": 17,
    "dsfl-public-cardholders": 8,  # the shared public slice: every bank also trains on it
}


def _flat(state: dict[str, torch.Tensor]) -> np.ndarray:
    return torch.cat([v.reshape(-1).double() for v in state.values() if v.is_floating_point()]).numpy()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("dsfl")
    data, out = root / "data", root / "artifacts"
    generate_dataset(
        data, GeneratorConfig(banks=2, cardholders=16, days=21, fraud_rate=0.03, seed=6), raw_csv=False, progress=False
    )
    settings = RunSettings.from_flat({**SMALL, "data-dir": str(data), "out-dir": str(out)})
    seen: list = []
    received = build_model(settings).state_dict()

    def observer(kind, rnd, replies):
        if kind == "train":
            seen.append([_flat(r.content["arrays"].to_torch_state_dict()) for r in replies])

    result = run_federated(settings, observer=observer)
    return {"out": out, "result": result, "seen": seen, "received": _flat(received), "settings": settings,
            "final": Checkpoint.load(checkpoint_dir(out, "federated"))}


def test_each_bank_sends_laplace_noise_of_the_configured_scale_per_dimension(run):
    assert len(run["seen"]) == 1 and len(run["seen"][0]) == 2
    base = run["received"]
    n = base.size
    m = round(FRACTION * n)
    assert n > 10_000
    for sent in run["seen"][0]:
        noise = sent - base  # the clipped update has L1 ≤ 1e-3 in all: negligible against these scales
        small = np.abs(noise) < 30 * CLIP / TOP  # a Laplace(1e-5) value exceeds 3e-4 with probability e^-30
        # selected: m of them, plus the few of Laplace(1) that fall below 3e-4 (probability ≈ 3e-4)
        expected = m + (n - m) * (1 - math.exp(-30 * CLIP / TOP))
        assert abs(small.sum() - expected) < 6 * math.sqrt(n * 3e-4) + 2, (small.sum(), expected)
        # median |Laplace(b)| = b ln 2, in each group
        assert np.median(np.abs(noise[small])) / math.log(2) == pytest.approx(CLIP / TOP, rel=0.06)
        assert np.median(np.abs(noise[~small])) / math.log(2) == pytest.approx(CLIP / REST, rel=0.06)


def test_released_model_is_the_contribution_weighted_mean(run):
    base = run["received"]
    updates = np.stack([sent - base for sent in run["seen"][0]])
    weights = contribution_weights(contribution_errors(updates))
    assert weights.sum() == pytest.approx(1.0)
    released = _flat(run["final"].state_dict)
    np.testing.assert_allclose(released, (base + weights @ updates).astype(np.float32), rtol=0, atol=1e-5)


def test_the_card_carries_dsfls_epsilon(run):
    version = ModelRegistry(run["out"]).get("anomaly", "latest")
    dp = version.privacy["client_dp"]
    settings = RunSettings.from_flat(SMALL).federated.dsfl
    n = run["received"].size
    assert dp["noise"] == "dsfl" and dp["rounds"] == 1 and dp["banks"] == 2 and dp["coordinates"] == n
    assert dp["epsilon"] == pytest.approx(dsfl_epsilon(settings, 1, n, 1e-5, "cardholder"))
    assert dp["epsilon_bank"] == pytest.approx(dsfl_epsilon(settings, 1, n, 1e-5, "bank"))
    assert version.privacy["formal_guarantee"].startswith(f"({dp['epsilon']:.3g}, 1e-05)-DP per cardholder")


def test_every_bank_trained_on_the_same_public_slice_featurised_as_its_own(run):
    root = run["settings"].cache_dir / "dsfl-public-8-20230"
    assert (root / "manifest.json").exists() and (root / "bank_0" / "transactions.parquet").exists()
    assert (root / "bank_1").is_symlink() and (root / "bank_1" / "transactions.parquet").exists()
    assert not list(root.parent.glob(".dsfl-public-*"))  # no copy left aside

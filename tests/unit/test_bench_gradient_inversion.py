"""`fedfraud bench attacks` section 5: the gradient-inversion attack on generated ego graphs (a tiny model)."""

import numpy as np
import pandas as pd
import pytest
import torch

from fedfraud.bench.gradient_inversion import (
    THESIS_VIEW, NOISE_OFF, GradientInversion, _cosine_distance, _gradient, _loss, attack_batch, sample_ego_graphs,
)
from fedfraud.feature_store.config import EgoGraphConfig, EncoderConfig, PrivacyConfig
from fedfraud.feature_store.encoders import encode_location, encode_location_torch
from fedfraud.feature_store.privacy import PrivateFeaturizer
from fedfraud.training.anomaly.config import AnomalyConfig
from fedfraud.training.anomaly.model import AnomalyModel, collate_graphs

ENC = EncoderConfig(dim=16, merchant_buckets=64)
PRIV = PrivacyConfig(mechanism="thesis", secret_seed="test-gradient-inversion")
EGO = EgoGraphConfig(max_nodes=4)


def _frame(rows: int = 60, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    merchant = rng.integers(0, 8, rows)
    return pd.DataFrame({
        "transaction_id": [f"t{i}" for i in range(rows)],
        "cardholder_id": [f"c{i % 3}" for i in range(rows)],
        "merchant_id": [f"m{m}" for m in merchant],
        "timestamp": pd.Timestamp("2022-01-01", tz="UTC") + pd.to_timedelta(np.arange(rows) * 1800, unit="s"),
        "lat": 30.0 + merchant * 0.7, "lon": -100.0 + merchant * 0.9,
        "amount": rng.uniform(1, 200, rows), "mcc": rng.choice(["grocery_pos", "travel", "misc_net"], rows),
    })


def _views() -> dict:
    return {THESIS_VIEW: PrivateFeaturizer(ENC, PRIV, b"bank"),
            NOISE_OFF: PrivateFeaturizer(ENC, PRIV.model_copy(update={"delta": 0.0}), b"bank")}


def test_sampled_graphs_carry_the_nodes_true_places_and_both_views():
    samples = sample_ego_graphs(_frame(), _views(), EGO, graphs=3, seed=1)
    assert len(samples) == 3
    f = _views()[NOISE_OFF]
    for s in samples:
        x = s.graphs[NOISE_OFF].x.numpy()
        assert x.shape == (len(s.lat), ENC.dim) and len(s.lat) >= 2
        # noise off: L' is exactly the permuted encoding of each node's true place
        np.testing.assert_allclose(x, encode_location(s.lat, s.lon, ENC)[:, f.permutation], atol=1e-6)
        assert not np.allclose(s.graphs[THESIS_VIEW].x.numpy(), x)
        assert torch.equal(s.graphs[THESIS_VIEW].edge_index, s.graphs[NOISE_OFF].edge_index)


def test_merchant_rows_of_the_observed_gradient_match_the_sparse_table_gradient():
    torch.manual_seed(0)
    model = AnomalyModel(AnomalyConfig(hidden=8, disc_hidden=8), ENC, EGO.max_nodes).eval()
    s = sample_ego_graphs(_frame(), _views(), EGO, graphs=2, seed=2)
    batch = collate_graphs([p.graphs[THESIS_VIEW] for p in s])
    priors, events = np.stack([p.prior for p in s]), np.stack([p.event for p in s])
    rows = _gradient(model, batch, batch.x.clone().requires_grad_(True), priors, events)[-1]
    model.zero_grad()
    _loss(model, batch, priors, events).backward()
    table = model.encoder.merchant.weight.grad.coalesce()
    order = torch.argsort(table.indices()[0])
    np.testing.assert_allclose(rows.numpy(), table.values()[order].numpy(), atol=1e-6)


def test_encode_location_torch_equals_the_numpy_encoder():
    lat, lon = np.array([40.7, -33.9, 0.0]), np.array([-74.0, 151.2, 0.0])
    got = encode_location_torch(torch.tensor(lat), torch.tensor(lon), ENC).numpy()
    np.testing.assert_allclose(got, encode_location(lat, lon, ENC), atol=1e-6)


def test_the_attack_reduces_the_gradient_distance_and_moves_towards_the_truth():
    torch.manual_seed(0)
    model = AnomalyModel(AnomalyConfig(hidden=8, disc_hidden=8), ENC, EGO.max_nodes)
    s = sample_ego_graphs(_frame(), _views(), EGO, graphs=1, seed=3)[0]
    truth = s.graphs[NOISE_OFF].x.numpy()
    rng = np.random.default_rng(0)
    start = (truth + 0.3 * rng.standard_normal(truth.shape)).astype(np.float32)
    x, end, first = attack_batch(model, [s.graphs[NOISE_OFF]], s.prior[None], s.event[None], [start], steps=300,
                                 lr=0.01)
    assert end < first / 2
    assert np.linalg.norm(x - truth) < np.linalg.norm(start - truth)


def test_cosine_distance_is_zero_for_equal_gradients_and_skips_zero_tensors():
    a = [torch.tensor([1.0, 2.0]), torch.zeros(3)]
    assert float(_cosine_distance(a, a)) == pytest.approx(0.0, abs=1e-6)
    assert float(_cosine_distance([torch.tensor([-1.0, -2.0]), torch.ones(3)], a)) == pytest.approx(2.0)


def test_markdown_of_a_gradient_inversion_only_run_and_contradicting_switches(tmp_path, capsys):
    from fedfraud.bench.attacks import AttacksBench
    from fedfraud.training.bootstrap import Interval
    from fedfraud.cli.app import main

    one = Interval(1.0, 0.5, 1.5)
    row = {"label": "gradient inversion: X", "model": "fresh", "view": THESIS_VIEW, "batch": 4, "targets": "known",
           "distance": "0.3 → 0.01", "errors": {s: one for s in ("median km", "p90 km", "≤ 1 km", "≤ 10 km")}}
    md = AttacksBench("x.csv", {}, gradient=GradientInversion(graphs=3, nodes=9, rows=[row]),
                      gradient_only=True).to_markdown()
    assert "### 5. An iterative gradient-inversion attack" in md and "--gradient-inversion-only" in md
    assert "| gradient inversion: X | fresh | thesis LDP | 4 | known | 0.3 → 0.01 | 1.000 [0.500, 1.500] |" in md
    assert "### 1." not in md and "### 4." not in md
    assert "Not run" in AttacksBench("x.csv", {})._gradient_section()[0]
    assert main(["bench", "attacks", "--data", str(tmp_path), "--inversion-only", "--gradient-inversion-only"]) == 2
    assert "pick one" in capsys.readouterr().err.strip().splitlines()[-1]

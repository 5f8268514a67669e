"""Engine, scorer and registry on a tiny generated bank: loss goes down, round trip keeps scores identical."""

import math

import numpy as np
import pytest
import torch

from fedfraud.feature_store.config import EgoGraphConfig, EncoderConfig, PrivacyConfig
from fedfraud.feature_store.privacy import PrivateFeaturizer
from fedfraud.training.anomaly.config import AnomalyConfig
from fedfraud.training.anomaly.data import load_bank_data
from fedfraud.training.anomaly.engine import (
    anomaly_metrics,
    evaluate_fraud,
    evaluate_selection,
    evaluate_task,
    sources_of,
    train_model,
)
from fedfraud.training.anomaly.model import AnomalyModel
from fedfraud.training.anomaly.run import RoundRecord, publish_run, summarize_banks
from fedfraud.training.anomaly.scorer import AnomalyScorer
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.feature_store.layout import read_bank
from fedfraud.training.data.synthetic import generate_dataset
from fedfraud.training.federated.accountant import dp_card, gaussian_epsilon
from fedfraud.training.registry import ModelRegistry

ENC = EncoderConfig(dim=32, merchant_buckets=512)
EGO = EgoGraphConfig()
CFG = AnomalyConfig(
    pooling="topk",
    hidden=32,
    disc_hidden=16,
    max_train_pairs=300,
    max_test_pairs=60,
    max_eval_normal=80,
    batch_size=32,
    samples_per_epoch=64,
)
THESIS = CFG.model_copy(update={"readout": "thesis", "layers": 5})  # the thesis setting
READOUTS = {
    "next-event": CFG,
    "contrastive": CFG.model_copy(update={"readout": "contrastive"}),
    "thesis": THESIS,
}


@pytest.fixture(scope="module")
def bank(tmp_path_factory):
    root = tmp_path_factory.mktemp("anomaly-data")
    generate_dataset(
        root, GeneratorConfig(banks=1, cardholders=24, days=21, fraud_rate=0.03, seed=11), raw_csv=False, progress=False
    )
    return root, load_bank_data(root, 0, CFG, ENC, PrivacyConfig(), EGO, cache_dir=root / "cache")


def test_bank_data_is_bounded_and_cached(bank):
    root, data = bank
    assert 0 < len(data.train) <= 300 and 0 < len(data.test) <= 60
    assert len(data.test_negatives) == len(data.test)
    assert data.fraud_labels.sum() == data.counts["fraud_test_pairs"]
    assert math.isfinite(data.privacy.mu_gdp) and data.privacy.cardholders == 24
    again = load_bank_data(root, 0, CFG, ENC, PrivacyConfig(), EGO, cache_dir=root / "cache")
    assert len(again.train) == len(data.train)
    assert torch.equal(again.train.current[0].x, data.train.current[0].x)


@pytest.mark.parametrize("readout", sorted(READOUTS))
def test_training_lowers_the_loss_and_produces_metrics(bank, readout):
    _, data = bank
    cfg = READOUTS[readout]
    torch.manual_seed(0)
    model = AnomalyModel(cfg, ENC, EGO.max_nodes)
    sources = sources_of([data], cfg, EGO.max_nodes)
    before = evaluate_selection(model, data)
    stats, _ = train_model(
        model, sources, epochs=8, samples_per_epoch=64, batch_size=32, lr=3e-3, seed=0, proximal_mu=0.01
    )
    assert stats.loss_last < stats.loss_first
    assert stats.steps == 16 and stats.examples == 8 * 64
    metrics = evaluate_task(model, data)
    if readout == "thesis":
        assert set(metrics) == {"loss", "accuracy", "precision", "recall", "f1", "roc_auc"}
        assert all(0.0 <= metrics[k] <= 1.0 for k in ("accuracy", "precision", "recall", "f1", "roc_auc"))
        assert evaluate_selection(model, data) == {}  # thesis readouts select the last round
    else:
        assert set(metrics) == {"loss"} and math.isfinite(metrics["loss"])
        # the validation loss (held-out cardholders) also went down: the model generalises, not memorises
        assert evaluate_selection(model, data)["val_loss"] < before["val_loss"]
    fraud = evaluate_fraud(model, data)
    assert set(fraud) == {"fraud_roc_auc", "fraud_pr_auc", "fraud_n"}


def test_fedprox_term_keeps_weights_closer(bank):
    _, data = bank
    sources = sources_of([data], CFG, EGO.max_nodes)
    dist = {}
    for mu in (0.0, 10.0):
        torch.manual_seed(0)
        model = AnomalyModel(CFG, ENC, EGO.max_nodes)
        start = [p.detach().clone() for p in model.parameters()]  # next-event readout
        train_model(model, sources, epochs=2, samples_per_epoch=64, batch_size=32, lr=3e-3, seed=0, proximal_mu=mu)
        dist[mu] = sum(float(((p.detach() - s) ** 2).sum()) for p, s in zip(model.parameters(), start, strict=True))
    assert dist[10.0] < dist[0.0]


@pytest.mark.parametrize("readout", ["thesis", "next-event"])
def test_registry_round_trip_gives_identical_scores(bank, tmp_path, readout):
    root, data = bank
    cfg = READOUTS[readout]
    torch.manual_seed(1)
    model = AnomalyModel(cfg, ENC, EGO.max_nodes).eval()
    record = RoundRecord(1, 0.5, {0: evaluate_task(model, data)}, 1.0)
    version = publish_run(
        ModelRegistry(tmp_path),
        model.state_dict(),
        mode="federated",
        anomaly_cfg=cfg,
        encoder_cfg=ENC,
        ego_cfg=EGO,
        config={"anomaly": CFG.model_dump()},
        history=[record],
        privacy={0: data.privacy},
        client_dp=dp_card([{"noise_multiplier": 1.0, "clipping_norm": 0.5, "banks": 2}] * 3, 1e-5, 2),
    )
    dp = version.privacy["client_dp"]
    assert dp["dp"] == "on" and dp["rounds"] == 3 and dp["noise_multiplier"] == 1.0 and dp["clipping_norm"] == 0.5
    assert dp["epsilon"] == pytest.approx(gaussian_epsilon(1.0, 3, 1e-5)) and dp["delta"] == 1e-5
    assert "unit_of_privacy: one bank" in version.model_card and "accountant: dp_accounting RDP" in version.model_card
    assert version.tag == "anomaly:v1"
    assert version.privacy["mu_gdp_per_bank"]["0"] == pytest.approx(data.privacy.mu_gdp)
    assert ("1 - f(q_prev, q_cur)" in version.model_card) == (readout == "thesis")
    assert ("NLL" in version.model_card) == (readout == "next-event")

    scorer = AnomalyScorer.from_registry(tmp_path, "latest", device="cpu")
    direct = AnomalyScorer(model, EGO)
    prev, cur = data.test.previous[:20], data.test.current[:20]
    priors, events = data.test.priors[:20], data.test.events[:20]
    q_prev, q_cur = scorer.embed(prev), scorer.embed(cur)
    assert q_cur.shape == (20, scorer.q_dim)
    if readout == "thesis":
        a = scorer.score(q_prev, q_cur)
        assert np.array_equal(a, direct.score(direct.embed(prev), direct.embed(cur)))
    else:
        a = scorer.score_events(q_prev, priors, events)
        assert np.array_equal(a, direct.score_events(direct.embed(prev), priors, events))
    assert np.allclose(a, scorer.score_graphs(prev, cur, priors, events))
    assert ((a >= 0) & (a <= 1)).all()
    # embeddings are batch-independent: one at a time equals batched
    assert np.allclose(scorer.embed(cur[:1]), q_cur[:1], atol=1e-6)

    frame = read_bank(root, 0)
    fz = PrivateFeaturizer.for_bank(ENC, PrivacyConfig(), 0)
    scores = scorer.score_frame(frame, fz)
    assert scores.shape == (len(frame),)
    firsts = frame.sort_values("timestamp").groupby("cardholder_id").head(1).index
    assert np.isnan(scores[frame.index.get_indexer(firsts)]).all()
    assert np.isfinite(scores).mean() > 0.9


def test_metrics_helpers():
    m = anomaly_metrics(np.array([0, 0, 1, 1], dtype=bool), np.array([0.1, 0.6, 0.7, 0.9]))
    assert m["accuracy"] == 0.75 and m["recall"] == 1.0 and m["precision"] == pytest.approx(2 / 3)
    assert m["roc_auc"] == 1.0
    s = summarize_banks({0: {"f1": 0.5}, 1: {"f1": 0.7, "fraud_roc_auc": float("nan")}})
    assert s["f1_mean"] == pytest.approx(0.6) and s["f1_std"] == pytest.approx(0.1)
    assert math.isnan(s["fraud_roc_auc_mean"])

"""Issue 38: a fraud model trained with ``--features +hin2vec`` is served and batch-scored, with one embedding path.

Real parts: a generated bank, a tiny G-HIN2Vec encoder trained a few steps and a tiny ``+hin2vec`` XGBoost model
published to a registry, a Feast repo (SQLite online store), the SQLite KV store, the hot path
(:class:`fedfraud.serving.hotpath.HotPath`) and batch scoring (``fedfraud.serving.batch.score_path``). The hot path
embeds each cardholder's ego graph before each transaction through its own state (Feast blob + the KV node table);
batch scoring replays the bank with :func:`~fedfraud.training.embeddings.embed.causal_embeddings`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from fedfraud.config import FedfraudConfig
from fedfraud.feature_store.layout import read_bank
from fedfraud.feature_store.privacy import PrivateFeaturizer, feature_ldp_card
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.training.data.synthetic import generate_dataset
from fedfraud.training.embeddings.config import Hin2VecConfig
from fedfraud.training.registry import ModelRegistry

pytestmark = pytest.mark.integration

CFG = FedfraudConfig()
H2V = Hin2VecConfig(hidden=16, dim=8, context=8, merchant_buckets=512, local_epochs=1)
LOADER = "fedfraud.serving.anomaly_stage:load_anomaly_scorer"


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A one-bank dataset and a registry with an anomaly model, a hin2vec model and a ``+hin2vec`` fraud model."""
    from fedfraud.training.anomaly.config import AnomalyConfig
    from fedfraud.training.anomaly.model import AnomalyModel
    from fedfraud.training.anomaly.scorer import AnomalyScorer, publish_anomaly_model
    from fedfraud.training.embeddings.embed import sample_graphs
    from fedfraud.training.embeddings.features import HIN2VEC_MODEL_KEY, bank_embedding_columns, with_embeddings
    from fedfraud.training.embeddings.federated.task import train_graphs
    from fedfraud.training.embeddings.model import Hin2Vec
    from fedfraud.training.embeddings.publish import publish_hin2vec
    from fedfraud.training.fraud.config import FraudConfig
    from fedfraud.training.fraud.features import build_features
    from fedfraud.training.fraud.train import train_local

    data = tmp_path_factory.mktemp("h2v-data")
    generate_dataset(data, GeneratorConfig(banks=1, cardholders=30, days=12, fraud_rate=0.05, seed=7),
                     raw_csv=False, progress=False)
    reg = ModelRegistry(tmp_path_factory.mktemp("h2v-registry"))
    ldp = {"feature_ldp": feature_ldp_card(CFG.privacy)}
    torch.manual_seed(0)
    anomaly = AnomalyModel(AnomalyConfig(), CFG.encoder, CFG.egograph.max_nodes)
    publish_anomaly_model(reg, anomaly.state_dict(), anomaly_cfg=AnomalyConfig(), encoder_cfg=CFG.encoder,
                          ego_cfg=CFG.egograph, config={}, metrics={}, privacy=ldp, card="test")
    frame = read_bank(data, 0)
    featurizer = PrivateFeaturizer.for_bank(CFG.encoder, CFG.privacy, 0)
    graphs, _ = sample_graphs(frame, featurizer, CFG.egograph, H2V.merchant_buckets, H2V.cell_deg, True, 2,
                              np.random.default_rng(0))
    torch.manual_seed(0)
    encoder = Hin2Vec(H2V, CFG.encoder.dim)
    train_graphs(encoder, graphs[:64], H2V, seed=0)  # a few real steps: trained, not random, weights
    h2v = publish_hin2vec(reg, encoder.state_dict(), H2V, CFG.encoder.dim, {}, {}, ldp)

    fcfg = FraudConfig(num_boost_round=12, max_depth=3, nthread=1, extra_features=("hin2vec",))
    scores = AnomalyScorer.from_registry(reg, "latest").score_frame(frame, featurizer)
    base = build_features(frame, featurizer.transform(frame), fcfg, scores)
    encoder.eval()
    feats = with_embeddings(base, bank_embedding_columns(data, 0, encoder, CFG.encoder, CFG.privacy, CFG.egograph))
    model = train_local(feats, True, fcfg, 0)
    assert "hin2vec_0" in model.input_names
    model.publish(reg, config={"fraud": fcfg.model_dump(), HIN2VEC_MODEL_KEY: h2v.tag}, metrics={}, privacy=ldp)
    return data, reg.root


def _hot_path(registry: Path, tmp_path: Path) -> Any:
    from fedfraud.feature_store.feast_store import apply_repo, open_store
    from fedfraud.serving.config import ScorerConfig
    from fedfraud.serving.hotpath import HotPath

    features = CFG.features.model_copy(update={"repo_dir": str(tmp_path / "repo")})
    serving = CFG.serving.model_copy(update={"registry_root": str(registry)})
    cfg = CFG.model_copy(update={"serving": serving, "features": features})
    apply_repo(open_store(cfg.features))
    return HotPath(ScorerConfig.of(cfg), None, LOADER)


def _ordered(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(["timestamp", "transaction_id"], kind="stable").reset_index(drop=True)


def test_hot_path_columns_equal_batch_columns(published: tuple[Path, Path], tmp_path: Path) -> None:
    """The columns the hot path computes in micro-batches (state in Feast and the KV between them) are
    :func:`causal_embeddings`'s for every transaction; a redelivered batch changes no node table."""
    from fedfraud.training.embeddings.embed import causal_embeddings

    data, registry = published
    hot = _hot_path(registry, tmp_path)
    stage = hot.anomaly
    assert stage.hin2vec is not None and stage.hin2vec.tag == "hin2vec:v1"
    frame = _ordered(read_bank(data, 0))
    featurizer = PrivateFeaturizer.for_bank(CFG.encoder, CFG.privacy, 0)
    want = causal_embeddings(frame, featurizer, stage.hin2vec.model, CFG.egograph)
    got = np.full_like(want, np.nan)
    row_of = {t: i for i, t in enumerate(frame["transaction_id"].astype(str))}
    for start in range(0, len(frame), 48):
        part = frame.iloc[start:start + 48]
        work, scored = stage.score(part, np.zeros(len(part), dtype=np.int64))
        assert scored.hin2vec is not None and scored.hin2vec_model == "hin2vec:v1"
        stage.write(work)
        for k, tx in enumerate(scored.transaction_id):
            got[row_of[tx]] = scored.hin2vec[k]
    assert np.array_equal(np.isnan(got[:, 0]), np.isnan(want[:, 0]))
    assert np.isfinite(want[:, 0]).mean() > 0.8  # not vacuous: most rows have a graph before them
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    # a redelivery: NaN columns (the ring re-emits the decision), no node table rewritten
    holders = list(dict.fromkeys(featurizer.pseudonyms(frame["cardholder_id"].astype(str))))
    before = stage.kv.get_many("hin2vec", holders)
    assert all(before)
    work, scored = stage.score(frame.iloc[-48:], np.zeros(48, dtype=np.int64))
    assert scored.redelivered.all() and np.isnan(scored.hin2vec).all() and not work.hin_changed
    stage.write(work)
    assert stage.kv.get_many("hin2vec", holders) == before
    hot.close()


def test_a_hin2vec_fraud_model_decides_in_the_hot_path_as_batch_scoring_does(published: tuple[Path, Path],
                                                                             tmp_path: Path) -> None:
    """One bank through the hot path in micro-batches: decision records with the score batch scoring gives the
    same transaction; the ``cardholder_hin2vec`` view holds each card's latest embedding, read back through Feast."""
    from fedfraud.feature_store.feast_store import open_store
    from fedfraud.serving.batch import score_path
    from fedfraud.training.embeddings.embed import embed_cardholders, sample_graphs

    data, registry = published
    out = tmp_path / "scores.parquet"
    report = score_path(data, registry, out, progress=False)
    assert report.models == {"anomaly": "anomaly:v1", "fraud": "fraud:v1", "hin2vec": "hin2vec:v1"}
    batch = pd.read_parquet(out).set_index("transaction_id")

    hot = _hot_path(registry, tmp_path)
    frame = _ordered(read_bank(data, 0))
    records: list[dict[str, Any]] = []
    for start in range(0, len(frame), 64):
        part = frame.iloc[start:start + 64]
        records += hot.score(part, np.arange(1, len(part) + 1, dtype=np.int64))
    assert len(records) == len(frame)
    for r in records:  # serving.reasons_for: fraud (the default): a fraud decision carries its top reasons
        assert r["decision"] in ("fraud", "legit") and 0.0 <= r["score"] <= 1.0 and not r["redelivered"]
        assert r["models"] == {"anomaly": "anomaly:v1", "fraud": "fraud:v1"}
        assert (0 < len(r["top_reasons"]) <= 3) if r["decision"] == "fraud" else r["top_reasons"] == []
        assert all({"feature", "value", "contribution"} <= set(x) for x in r["top_reasons"])
    assert any(r["decision"] == "fraud" for r in records)
    served = np.array([r["score"] for r in records])
    expected = batch.loc[[r["transaction_id"] for r in records], "fraud_score"].to_numpy()
    np.testing.assert_allclose(served, expected, rtol=0, atol=1e-5)
    assert [r["decision"] for r in records] == batch.loc[[r["transaction_id"] for r in records], "decision"].tolist()
    reasons = {x["feature"] for r in records for x in r["top_reasons"]}
    assert any(f.startswith("hin2vec_") for f in reasons)  # the model reads the columns it was given

    # the latest embedding per card, through Feast's own SDK: the embedding of the card's whole history
    featurizer = PrivateFeaturizer.for_bank(CFG.encoder, CFG.privacy, 0)
    graphs, ids = sample_graphs(frame, featurizer, CFG.egograph, H2V.merchant_buckets, H2V.cell_deg, True, 1,
                                np.random.default_rng(0), final_only=True)
    final = embed_cardholders(hot.anomaly.hin2vec.model, graphs)
    tokens = list(featurizer.pseudonyms(pd.Series(ids)))
    store = open_store(CFG.features.model_copy(update={"repo_dir": str(tmp_path / "repo")}))
    read = store.get_online_features(
        features=["cardholder_hin2vec:hin2vec", "cardholder_hin2vec:hin2vec_model",
                  "cardholder_hin2vec:state_version"],
        entity_rows=[{"cardholder": t} for t in tokens]).to_dict()
    assert set(read["hin2vec_model"]) == {"hin2vec:v1"}
    counts = frame.assign(token=featurizer.pseudonyms(frame["cardholder_id"].astype(str))).groupby("token").size()
    assert read["state_version"] == [int(counts[t]) for t in tokens]
    np.testing.assert_allclose(np.asarray(read["hin2vec"], dtype=np.float32), final, rtol=1e-5, atol=1e-6)
    hot.close()


@pytest.mark.parametrize("profile", ["sqlite", "redis"])
def test_the_hin2vec_view_round_trips_through_feast(tmp_path: Path, profile: str) -> None:
    """What the scorer pushes (``OnlineStateClient.push(..., hin2vec=...)``) is what Feast's SDK reads, on both
    online stores (SQLite through Feast's own writer, Redis through the one-pipeline writer)."""
    import os

    from fedfraud.feature_store.feast_store import apply_repo, open_store
    from fedfraud.feature_store.online import OnlineStateClient
    from tests.prerequisites import require_redis

    features = CFG.features
    if profile == "redis":
        require_redis()
        features = features.model_copy(update={
            "project": f"fedfraud_h2v_{os.getpid()}",
            "redis": features.redis.model_copy(update={"connection_string": "127.0.0.1:6379,db=15"})})
    store = open_store(features, tmp_path / "repo", profile)
    apply_repo(store)
    try:
        client = OnlineStateClient(store, CFG.egograph, features.location_cell_deg)
        featurizer = PrivateFeaturizer.for_bank(CFG.encoder, CFG.privacy, 0)
        frame = _few_rows()
        from fedfraud.feature_store.cardholder import prepare_batch

        batch = prepare_batch(frame, featurizer)
        vectors = np.arange(2 * H2V.dim, dtype=np.float32).reshape(2, H2V.dim) / 7
        tokens = ["ct_" + "a" * 32, "ct_" + "b" * 32]
        client.push([], 0, batch, [], hin2vec=[(t, vectors[k], "hin2vec:v4", 5 + k, batch.ts_us[0])
                                               for k, t in enumerate(tokens)])
        read = store.get_online_features(
            features=["cardholder_hin2vec:hin2vec", "cardholder_hin2vec:hin2vec_model",
                      "cardholder_hin2vec:state_version"],
            entity_rows=[{"cardholder": t} for t in tokens]).to_dict()
        np.testing.assert_array_equal(np.asarray(read["hin2vec"], dtype=np.float32), vectors)
        assert read["hin2vec_model"] == ["hin2vec:v4"] * 2 and read["state_version"] == [5, 6]
    finally:
        store.teardown()


def _few_rows() -> pd.DataFrame:
    """A few generated transactions (the push's batch: no merchant row of it is written here)."""
    from fedfraud.training.data.synthetic import generate_frame

    frame, _ = generate_frame(GeneratorConfig(banks=1, cardholders=2, days=2, seed=1))
    return frame.head(4).reset_index(drop=True)


def test_a_replica_without_its_anomaly_stage_refuses_a_hin2vec_model(published: tuple[Path, Path],
                                                                      tmp_path: Path) -> None:
    """``serving.anomaly_stage: false`` keeps no ego graph: one line at start, not NaN columns on every row."""
    from fedfraud.feature_store.feast_store import apply_repo, open_store
    from fedfraud.serving.config import ScorerConfig
    from fedfraud.serving.hotpath import HotPath

    _, registry = published
    features = CFG.features.model_copy(update={"repo_dir": str(tmp_path / "repo")})
    serving = CFG.serving.model_copy(update={"registry_root": str(registry), "anomaly_stage": False})
    cfg = CFG.model_copy(update={"serving": serving, "features": features})
    apply_repo(open_store(cfg.features))
    with pytest.raises(ValueError, match="cannot serve a fraud model with hin2vec columns"):
        HotPath(ScorerConfig.of(cfg), None, LOADER)

"""The peers of ``fedfraud bench serving --peers``: the plain peer really streams through the embedded broker and
decides as its XGBoost does on those rows; the GNN-off switch really skips the anomaly stage.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    from fedfraud.bench.serving import COLUMNS
    from fedfraud.training.data.config import GeneratorConfig
    from fedfraud.training.data.synthetic import generate_frame

    f, _ = generate_frame(GeneratorConfig(banks=1, cardholders=40, days=20, seed=3))
    return f.sort_values(["timestamp", "transaction_id"]).reset_index(drop=True)[COLUMNS]


def _as_streamed(rows: pd.DataFrame, featurizer) -> pd.DataFrame:
    """``rows`` as the ``transactions`` topic carries them (card tokens, rounded coordinates)."""
    from fedfraud.serving.replay import wire_records

    out = pd.DataFrame.from_records(wire_records(rows, featurizer))
    out["timestamp"] = pd.to_datetime(out["timestamp"], utc=True, format="ISO8601")
    return out


def test_plain_peer_consumes_and_produces_on_the_broker_and_decides_as_its_model(frame, tmp_path: Path) -> None:
    from fedfraud.bench.peer import PlainPeer, publish_peer_model
    from fedfraud.config import FedfraudConfig
    from fedfraud.serving.kafka.broker import EmbeddedBroker
    from fedfraud.serving.replay import replay_and_collect
    from fedfraud.training.fraud.features import ANOMALY_FEATURE, build_features
    from fedfraud.training.registry import ModelRegistry

    cfg = FedfraudConfig()
    s = cfg.serving
    reg = ModelRegistry(tmp_path / "registry")
    train, rest = frame.head(300), frame.iloc[300:700].reset_index(drop=True)
    publish_peer_model(reg, train, cfg)
    with EmbeddedBroker(topics={t: 2 for t in s.topics.all()}) as broker:
        peer = PlainPeer(cfg, broker.bootstrap_servers, reg.root)
        assert ANOMALY_FEATURE not in peer.model.used  # the peer's own model: no anomaly score
        stop = threading.Event()
        thread = threading.Thread(target=peer.run, args=(stop,), daemon=True)
        thread.start()
        try:
            result = replay_and_collect(rest, broker.bootstrap_servers, peer.featurizer, rate=0, timeout_s=60,
                                        topics=s.topics)
        finally:
            stop.set()
            thread.join(timeout=30)
    assert not thread.is_alive()
    # counts in = counts out: one decision per transaction on the decisions topic, none missing, none twice
    assert len(result.decisions) == len(rest) == peer.decided
    assert not result.missing
    # the decisions are the model's predictions on those rows, computed the training way (build_features)
    streamed = _as_streamed(rest, peer.featurizer)
    private = peer.featurizer.transform(streamed)
    X = build_features(streamed, private, peer.fraud_cfg, transitions=peer.model.transitions).X
    expected = dict(zip(rest["transaction_id"].astype(str), peer.model.scores(X).tolist(), strict=True))
    got = {d["transaction_id"]: d for d in result.decisions}
    for tx, score in expected.items():
        assert got[tx]["score"] == pytest.approx(score, abs=1e-6)
        assert got[tx]["decision"] == ("fraud" if score >= peer.model.threshold else "legit")
    assert all(d["decided_us"] >= d["produced_us"] > 0 for d in result.decisions)


class _NoGnn:
    """An anomaly model whose every call fails the test: with the stage off, none may happen."""

    tag = "anomaly:spy"
    uses_events = False

    def __init__(self) -> None:
        self.calls = 0

    def _called(self, *_a: object) -> np.ndarray:
        self.calls += 1
        raise AssertionError("the anomaly model was called with the anomaly stage switched off")

    embed = score = score_events = _called


def test_gnn_off_switch_skips_the_anomaly_stage(frame, tmp_path: Path) -> None:
    from fedfraud.bench.serving import publish_bench_models
    from fedfraud.config import FedfraudConfig
    from fedfraud.feature_store.feast_store import apply_repo, open_store
    from fedfraud.serving.anomaly_stage import OFF_TAG
    from fedfraud.serving.config import ScorerConfig
    from fedfraud.serving.hotpath import HotPath
    from fedfraud.training.registry import ModelRegistry

    cfg = FedfraudConfig()
    reg = ModelRegistry(tmp_path / "registry")
    publish_bench_models(reg, frame.head(300), cfg)
    features = cfg.features.model_copy(update={"repo_dir": str(tmp_path / "repo")})
    serving = cfg.serving.model_copy(update={"registry_root": str(reg.root), "anomaly_stage": False})
    cfg = cfg.model_copy(update={"serving": serving, "features": features})
    apply_repo(open_store(cfg.features))
    hot = HotPath(ScorerConfig.of(cfg), None, "fedfraud.serving.anomaly_stage:load_anomaly_scorer")
    spy = _NoGnn()
    hot.anomaly.model = spy

    def no_store(*_a: object, **_k: object) -> None:
        raise AssertionError("the online store was used with the anomaly stage switched off")

    hot.anomaly.client.read_batch = no_store  # type: ignore[method-assign]
    hot.anomaly.client.push = no_store  # type: ignore[method-assign]
    rows = frame.iloc[300:360].reset_index(drop=True)
    produced = np.arange(1, len(rows) + 1, dtype=np.int64)
    records = hot.score(rows, produced)
    assert spy.calls == 0 and len(records) == len(rows)
    assert all(r["decision"] in ("fraud", "legit") and r["anomaly_score"] is None for r in records)
    assert {r["models"]["anomaly"] for r in records} == {OFF_TAG} and hot.models()["anomaly"] == OFF_TAG
    # the fraud stage's state was written: the same rows again are recognised and re-emitted as redelivered
    again = hot.score(rows, produced)
    assert all(r["redelivered"] for r in again) and [r["score"] for r in again] == [r["score"] for r in records]
    # and the switch is what kept the stage away: on, the next rows reach the (spy) model at once
    hot.anomaly_on = True
    del hot.anomaly.client.read_batch  # the store's own method again
    with pytest.raises(AssertionError, match="anomaly model was called"):
        hot.score(frame.iloc[360:380].reset_index(drop=True), produced[:20])
    assert spy.calls >= 1
    hot.close()


def test_hot_path_deployed_with_a_gnn_variant_decides_with_the_gnn_fraud_model(frame, tmp_path: Path) -> None:
    """``fraud.variant: fedrpda``: the replica loads kind ``fraud-gnn``, decides with it on the full hot path (the
    anomaly stage on), keeps the neighbourhoods in its KV store and re-emits a redelivery from the ring.
    """
    from fedfraud.bench.serving import publish_bench_models
    from fedfraud.config import FedfraudConfig
    from fedfraud.feature_store.feast_store import apply_repo, open_store
    from fedfraud.serving.config import ScorerConfig
    from fedfraud.serving.graph_fraud import GNN_TABLES
    from fedfraud.serving.hotpath import HotPath
    from fedfraud.training.registry import ModelRegistry

    cfg = FedfraudConfig()
    reg = ModelRegistry(tmp_path / "registry")
    publish_bench_models(reg, frame.head(300), cfg)
    features = cfg.features.model_copy(update={"repo_dir": str(tmp_path / "repo")})
    serving = cfg.serving.model_copy(update={"registry_root": str(reg.root), "reasons_for": "all"})
    fraud = cfg.fraud.model_copy(update={"variant": "fedrpda"})
    cfg = cfg.model_copy(update={"serving": serving, "features": features, "fraud": fraud})
    apply_repo(open_store(cfg.features))
    hot = HotPath(ScorerConfig.of(cfg), None, "fedfraud.serving.anomaly_stage:load_anomaly_scorer")
    try:
        assert hot.models()["fraud"] == "fraud-gnn:v1" and hot.fraud_kind == "fraud-gnn"
        rows = frame.iloc[300:360].reset_index(drop=True)
        produced = np.arange(1, len(rows) + 1, dtype=np.int64)
        records = hot.score(rows, produced)
        assert len(records) == len(rows) and {r["models"]["fraud"] for r in records} == {"fraud-gnn:v1"}
        assert all(0.0 <= r["score"] <= 1.0 and r["decision"] in ("fraud", "legit") and len(r["top_reasons"]) == 3
                   for r in records)
        assert any(r["anomaly_score"] is not None for r in records)  # the anomaly stage ran before it
        kv = hot.anomaly.kv
        holders = list(dict.fromkeys(r["cardholder"] for r in records))
        assert all(kv.get_many(GNN_TABLES[0], holders))  # every cardholder's neighbourhood was written
        again = hot.score(rows, produced)
        assert all(r["redelivered"] for r in again) and [r["score"] for r in again] == [r["score"] for r in records]
    finally:
        hot.close()

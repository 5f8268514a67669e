"""Streaming scoring end to end on real services: Tansu (Kafka protocol), Ray Serve, Feast (SQLite), the
registry's anomaly GNN and XGBoost fraud model.

One deployment serves the module; each test replays fresh transactions (new ids, continuing the same
cardholders) so the tests are independent of each other's order.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pandas as pd
import pytest
import torch

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COLUMNS = ["transaction_id", "cardholder_id", "merchant_id", "timestamp", "amount", "lat", "lon", "mcc", "is_fraud",
           "geo_source"]


def publish_anomaly(registry, cfg, seed: int):
    """A real AnomalyModel (fresh weights: serving's guarantees do not depend on training) in the registry."""
    from training.anomaly.config import AnomalyConfig
    from training.anomaly.model import AnomalyModel
    from training.anomaly.scorer import publish_anomaly_model

    torch.manual_seed(seed)
    acfg = AnomalyConfig()
    model = AnomalyModel(acfg, cfg.encoder, cfg.egograph.max_nodes)
    return publish_anomaly_model(registry, model.state_dict(), anomaly_cfg=acfg, encoder_cfg=cfg.encoder,
                                 ego_cfg=cfg.egograph, config={"seed": seed}, metrics={}, privacy={}, card="test")


@pytest.fixture(scope="module")
def frame():
    from training.data.config import GeneratorConfig
    from training.data.synthetic import generate_frame

    data, _ = generate_frame(GeneratorConfig(banks=1, cardholders=80, days=30, seed=11))
    return data.sort_values(["timestamp", "transaction_id"]).reset_index(drop=True)[COLUMNS]


@pytest.fixture(scope="module")
def runtime(tmp_path_factory, frame, ray_session, kafka_broker):
    from fedfraud.config import load_config
    from feature_store.privacy import PrivateFeaturizer
    from serving.runtime import start
    from training.fraud.config import FraudConfig
    from training.fraud.features import build_features
    from training.fraud.model import fit_model
    from training.registry import ModelRegistry

    tmp = tmp_path_factory.mktemp("serving")
    cfg = load_config(overrides=[f"features.repo_dir={tmp / 'repo'}", f"serving.registry_root={tmp / 'registry'}",
                                 "serving.registry_poll_s=0.5", "serving.consumer.max_poll_records=200",
                                 f"serving.http_port={_free_port()}"])
    registry = ModelRegistry(tmp / "registry")
    fcfg = FraudConfig(num_boost_round=20, nthread=1)
    train = frame.head(1000)
    feats = build_features(train, PrivateFeaturizer.for_bank(cfg.encoder, cfg.privacy, 0).transform(train), fcfg)
    model = fit_model(feats, feats, True, fcfg, "centralized")
    model.publish(registry, config={"fraud": fcfg.model_dump()}, metrics={})
    publish_anomaly(registry, cfg, seed=1)
    ray_session()
    rt = start(cfg, bootstrap_servers=kafka_broker.bootstrap_servers)
    rt.registry = registry
    yield rt
    rt.stop()
    from ray import serve

    # Later modules restart Ray (Flower's simulation shuts it down); a Serve client left
    # behind would point at a dead controller, so leave no Serve instance running.
    serve.shutdown()


def _free_port() -> int:
    from serving.broker import free_port

    return free_port()


def _slice(frame, start, stop):
    return frame.iloc[start:stop].reset_index(drop=True)


def _stream_in_background(rt, part, rate):
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("result", rt.replay(part, rate=rate, timeout_s=180)))
    thread.start()
    return thread, out


def test_n_produced_n_decided_and_poison_goes_to_dlq(runtime, frame):
    part = _slice(frame, 1000, 1600)
    poison = [(b"poison", b"{not json"), (b"bad-row", b'{"transaction_id": "x1", "amount": -5}')]
    result = runtime.replay(part, rate=0, extra=poison, timeout_s=120)
    assert result.missing == set()
    assert len(result.decisions) == len(part)  # nothing decided twice
    assert {d["reason"] for d in result.dead_letters} >= {"malformed"}
    assert len(result.dead_letters) == 2
    d = result.decisions[0]
    assert {"score", "decision", "top_reasons", "anomaly_score", "models"} <= set(d)
    assert d["models"]["anomaly"].startswith("anomaly:v") and d["models"]["fraud"] == "fraud:v1"
    snap = runtime.wait_idle()
    assert snap["consumed"] == snap["decided"] + snap["dead_lettered"]
    assert snap["inflight"] == 0

    import httpx

    metrics = httpx.get(f"{runtime.url}/metrics", timeout=30).text
    for name in ("fedfraud_consumed_total", "fedfraud_decided_total", "fedfraud_dead_lettered_total",
                 "fedfraud_end_to_end_latency_seconds_bucket", "fedfraud_consumer_lag", "fedfraud_model_info"):
        assert name in metrics
    assert httpx.get(f"{runtime.url}/healthz", timeout=30).json()["status"] == "ok"


def test_http_score_single_and_batch(runtime, frame):
    import httpx

    rows = _slice(frame, 1600, 1603).assign(timestamp=lambda f: f["timestamp"].map(pd.Timestamp.isoformat))
    records = rows.astype(object).where(rows.notna(), None).to_dict("records")
    one = httpx.post(f"{runtime.url}/score", json=records[0], timeout=60).json()
    assert [d["transaction_id"] for d in one["decisions"]] == [records[0]["transaction_id"]]
    batch = httpx.post(f"{runtime.url}/score", json=[*records[1:], {"amount": "x"}], timeout=60).json()
    assert len(batch["decisions"]) == 2 and batch["rejected"][0]["reason"] == "missing_field"


def test_model_swap_mid_stream(runtime, frame):
    part = _slice(frame, 1603, 2400)
    before = runtime.counters()["models"]["anomaly"]
    thread, out = _stream_in_background(runtime, part, rate=400)
    time.sleep(1.0)
    new = publish_anomaly(runtime.registry, runtime.config, seed=2)
    thread.join()
    result = out["result"]
    assert result.missing == set()
    fresh = [d for d in result.decisions if not d["redelivered"]]
    assert len(fresh) == len(part) == len({d["transaction_id"] for d in fresh})  # none lost, none scored twice
    versions = [d["models"]["anomaly"] for d in sorted(result.decisions, key=lambda d: d["decided_us"])]
    assert versions[-1] == new.tag and before in versions  # swapped between micro-batches, without a restart


def test_killing_the_scorer_replica_loses_and_double_counts_nothing(runtime, frame):
    import ray

    from feature_store.online import OnlineStateClient

    part = _slice(frame, 2400, 3400)
    cfg = runtime.config
    client = OnlineStateClient.open(cfg.features, cfg.egograph)
    holders = sorted(set(part["cardholder_id"]))
    pseudonyms = runtime.featurizer().pseudonyms(holders)
    versions_before = np.array([s.version for s in client.read_states(pseudonyms)])
    counts_before = runtime.wait_idle()
    thread, out = _stream_in_background(runtime, part, rate=300)
    time.sleep(1.5)
    victims = [a for a in ray.util.list_named_actors(all_namespaces=True) if "AnomalyScorer" in a["name"]]
    assert victims
    ray.kill(ray.get_actor(victims[0]["name"], namespace=victims[0]["namespace"]), no_restart=True)
    thread.join()
    result = out["result"]
    assert result.missing == set()
    fresh = [d for d in result.decisions if not d["redelivered"]]
    assert len(fresh) == len(part) == len({d["transaction_id"] for d in fresh})
    snap = runtime.wait_idle()
    assert snap["consumed"] - counts_before["consumed"] == snap["decided"] - counts_before["decided"]
    assert snap["consumed"] == snap["decided"] + snap["dead_lettered"]

    # every ego graph took every transaction exactly once (the Feast state's transaction counter)
    versions_after = np.array([s.version for s in client.read_states(pseudonyms)])
    expected = part.groupby("cardholder_id").size().reindex(holders).to_numpy()
    np.testing.assert_array_equal(versions_after - versions_before, expected)

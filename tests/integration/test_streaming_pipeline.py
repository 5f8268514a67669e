"""Streaming scoring end to end on real services: Tansu (Kafka protocol), Ray Serve, Feast (SQLite), the
registry's anomaly GNN and XGBoost fraud model.

One deployment serves the module; each test replays fresh transactions (new ids, continuing the same
cardholders) so the tests are independent of each other's order.
"""

from __future__ import annotations

import base64
import itertools
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from fedfraud.core.net import free_port
from tests.topic_reader import topic_messages, topic_records

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COLUMNS = ["transaction_id", "cardholder_id", "merchant_id", "timestamp", "amount", "lat", "lon", "mcc", "is_fraud",
           "geo_source"]


def publish_anomaly(registry, cfg, seed: int):
    """A real AnomalyModel (fresh weights: serving's guarantees do not depend on training) in the registry."""
    from fedfraud.training.anomaly.config import AnomalyConfig
    from fedfraud.training.anomaly.model import AnomalyModel
    from fedfraud.training.anomaly.scorer import publish_anomaly_model

    torch.manual_seed(seed)
    acfg = AnomalyConfig()
    model = AnomalyModel(acfg, cfg.encoder, cfg.egograph.max_nodes)
    return publish_anomaly_model(registry, model.state_dict(), anomaly_cfg=acfg, encoder_cfg=cfg.encoder,
                                 ego_cfg=cfg.egograph, config={"seed": seed}, metrics={}, privacy={}, card="test")


@pytest.fixture(scope="module")
def frame():
    from fedfraud.training.data.config import GeneratorConfig
    from fedfraud.training.data.synthetic import generate_frame

    data, _ = generate_frame(GeneratorConfig(banks=1, cardholders=80, days=45, seed=11))
    return data.sort_values(["timestamp", "transaction_id"]).reset_index(drop=True)[COLUMNS]


@pytest.fixture(scope="module")
def runtime(tmp_path_factory, frame, ray_session, kafka_broker, api_token):
    from fedfraud.config import load_config
    from fedfraud.feature_store.privacy import PrivateFeaturizer
    from fedfraud.serving.runtime import start
    from fedfraud.training.fraud.config import FraudConfig
    from fedfraud.training.fraud.features import build_features
    from fedfraud.training.fraud.model import fit_model
    from fedfraud.training.registry import ModelRegistry

    tmp = tmp_path_factory.mktemp("serving")
    cfg = load_config(overrides=[f"features.repo_dir={tmp / 'repo'}", f"serving.registry_root={tmp / 'registry'}",
                                 "serving.registry_poll_s=0.5", "serving.consumer.max_poll_records=200",
                                 "serving.guards.max_message_bytes=65536", "serving.guards.http_max_body_bytes=65536",
                                 "serving.guards.http_max_batch=50", f"serving.auth.token_file={api_token.file}",
                                 f"serving.http_port={free_port()}"])
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


#: The rows of the frame each test streams: disjoint, so no test's transactions are another's redeliveries,
#: whatever the order the tests run in (rows before 1000 train the fraud model).
ROWS = {
    "n_produced": (1000, 1600), "http_score": (1600, 1603), "model_swap": (1603, 2400), "kill": (2400, 3400),
    "poison": (3400, 3550), "duplicates": (3550, 3552), "http_bad_input": (3552, 3554), "auth": (3554, 3555),
    "no_clear_data": (3600, 4200), "leaky_producer": (4200, 4201), "promote_rollback": (4300, 5500),
}


def _slice(frame, name: str):
    start, stop = ROWS[name]
    return frame.iloc[start:stop].reset_index(drop=True)


def test_no_two_tests_stream_the_same_rows(frame) -> None:
    spans = sorted(ROWS.values())
    assert all(stop <= start for (_, stop), (start, _) in itertools.pairwise(spans)), spans
    assert spans[0][0] >= 1000 and spans[-1][1] <= len(frame)


def _stream_in_background(rt, part, rate):
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("result", rt.replay(part, rate=rate, timeout_s=180)))
    thread.start()
    return thread, out


def _stream_until(rt, part, stop: threading.Event, size: int = 25):
    """Replay ``part`` slice after slice (each decided before the next) in a thread, until ``stop`` is set: a
    stream that outlasts whatever the test waits for, however slow the machine. Returns the thread and the
    list its :class:`fedfraud.serving.replay.ReplayResult` s go to."""
    results: list = []

    def run() -> None:
        for start in range(0, len(part), size):
            results.append(rt.replay(part.iloc[start:start + size], rate=0, timeout_s=60))
            if stop.is_set():
                return

    thread = threading.Thread(target=run)
    thread.start()
    return thread, results


def _streamed(results) -> tuple[list[str], list[dict]]:
    """The ids a :func:`_stream_until` sent, and every decision it collected (all of its slices decided)."""
    assert all(r.missing == set() for r in results)
    return [t for r in results for t in r.stats.transaction_ids], [d for r in results for d in r.decisions]


def _own_dead_letters(runtime, start: dict[int, int], values: list[bytes]) -> list[dict]:
    """The DLQ records since ``start`` whose source message is one of ``values`` (by the digest a DLQ record
    keeps instead of the bytes), once the group is idle: another test's poison, redelivered meanwhile (at least
    once), is not this test's."""
    from fedfraud.serving.kafka.dead_letters import payload_digest

    runtime.wait_idle()
    digests = {payload_digest(v) for v in values}
    dead = topic_records(runtime.bootstrap_servers, runtime.config.serving.topics.dlq, start,
                         until=lambda records: digests <= {d["raw_sha256"] for d in records})
    return [d for d in dead if d["raw_sha256"] in digests]


def test_n_produced_n_decided_and_poison_goes_to_dlq(runtime, frame):
    from fedfraud.serving.replay import topic_end_offsets

    part = _slice(frame, "n_produced")
    poison = [(b"poison", b"{not json"), (b"bad-row", b'{"transaction_id": "x1", "amount": -5}')]
    dlq_start = topic_end_offsets(runtime.bootstrap_servers, runtime.config.serving.topics.dlq)
    result = runtime.replay(part, rate=0, extra=poison, timeout_s=120)
    assert result.missing == set()
    assert len(result.decisions) == len(part)  # nothing decided twice
    dead = _own_dead_letters(runtime, dlq_start, [value for _, value in poison])
    assert {d["reason"] for d in dead} >= {"malformed"}
    assert len(dead) == 2
    d = result.decisions[0]
    assert {"score", "decision", "top_reasons", "anomaly_score", "models"} <= set(d)
    assert d["models"]["anomaly"].startswith("anomaly:v") and d["models"]["fraud"] == "fraud:v1"
    snap = runtime.wait_idle()
    assert snap["consumed"] == snap["decided"] + snap["dead_lettered"]
    assert snap["inflight"] == 0

    import httpx

    metrics = httpx.get(f"{runtime.url}/metrics", headers=runtime.headers, timeout=30).text
    for name in ("fedfraud_consumed_total", "fedfraud_decided_total", "fedfraud_dead_lettered_total",
                 "fedfraud_end_to_end_latency_seconds_bucket", "fedfraud_consumer_lag", "fedfraud_model_info"):
        assert name in metrics
    assert httpx.get(f"{runtime.url}/healthz", timeout=30).json()["status"] == "ok"


def test_http_score_single_and_batch(runtime, frame):
    import httpx

    records = _records_of(runtime, _slice(frame, "http_score"))
    response = httpx.post(f"{runtime.url}/score", json=records[0], headers=runtime.headers, timeout=60)
    assert response.status_code == 200, response.text
    one = response.json()
    assert [d["transaction_id"] for d in one["decisions"]] == [records[0]["transaction_id"]]
    batch = httpx.post(f"{runtime.url}/score", json=[*records[1:], {"amount": "x"}], headers=runtime.headers,
                       timeout=60).json()
    assert len(batch["decisions"]) == 2 and batch["rejected"][0]["reason"] == "missing_field"


def test_the_replica_runs_at_the_configured_niceness(runtime):
    """Ray starts its workers at niceness 15; the scoring replica's threads run at ``serving.replica_niceness``
    (default 0) above the Ray node's niceness, which is this process's (the test started Ray)."""
    import os

    added = runtime.config.serving.replica_niceness
    expected = min(19, os.getpriority(os.PRIO_PROCESS, 0) + added)
    info = runtime.handle.process.remote().result()
    assert info["pid"] != os.getpid() and info["niceness"] == [expected]


def _wait_decided(runtime, before: dict, n: int, timeout_s: float = 30.0) -> None:
    """Until the group decided ``n`` more transactions than in ``before``: mid-stream, whatever the test order."""
    deadline = time.monotonic() + timeout_s
    while runtime.counters()["decided"] < before["decided"] + n:
        assert time.monotonic() < deadline, f"fewer than {n} decisions in {timeout_s:.0f} s"
        time.sleep(0.05)


def _wait_accounted(runtime, before: dict, n: int, timeout_s: float = 30.0) -> dict:
    """Until the group consumed ``n`` more messages than in ``before`` and accounted for all it consumed: each
    decided or dead-lettered, its output acknowledged by the broker (the counters never run ahead of the topics)."""
    deadline = time.monotonic() + timeout_s
    while True:
        snap = runtime.counters()
        if (snap["consumed"] >= before["consumed"] + n and snap["inflight"] == 0
                and snap["consumed"] == snap["decided"] + snap["dead_lettered"]):
            return snap
        assert time.monotonic() < deadline, f"{n} messages not consumed and accounted for in {timeout_s:.0f} s"
        time.sleep(0.05)


def _wait_model(runtime, tag: str, timeout_s: float = 30.0) -> None:
    """Until the latest decision names anomaly model ``tag`` (a swap reached the stream)."""
    deadline = time.monotonic() + timeout_s
    while runtime.counters()["models"].get("anomaly") != tag:
        assert time.monotonic() < deadline, f"no decision with {tag} in {timeout_s:.0f} s"
        time.sleep(0.05)


def test_model_swap_mid_stream(runtime, frame):
    """A model published while the stream runs is swapped in between micro-batches, without a restart.

    The stream goes on, slice after slice, until a decision names the new model, then stops after the slice
    under way: the swap lands mid-stream however long the registry watcher takes, with no timed race.
    """
    part = _slice(frame, "model_swap")
    before = runtime.registry.get("anomaly", "champion").tag
    counts = runtime.wait_idle()
    swapped = threading.Event()
    thread, results = _stream_until(runtime, part, swapped)
    try:
        _wait_decided(runtime, counts, 100)
        new = publish_anomaly(runtime.registry, runtime.config, seed=2)
        _wait_model(runtime, new.tag)
    finally:
        swapped.set()
        thread.join()
    sent, decisions = _streamed(results)
    fresh = [d for d in decisions if not d["redelivered"]]
    assert len(fresh) == len(sent) == len({d["transaction_id"] for d in fresh})  # none lost, none scored twice
    versions = [d["models"]["anomaly"] for d in sorted(decisions, key=lambda d: d["decided_us"])]
    assert before in versions and versions[-1] == new.tag  # swapped between micro-batches, without a restart
    assert versions == sorted(versions, key=lambda tag: tag == new.tag)  # once: never back to the old model


def test_promote_and_rollback_mid_stream_lose_and_double_nothing(runtime, frame):
    """champion v_a serves; a newer v_b waits (published is not promoted); promoting it mid-stream swaps it in,
    rolling back swaps v_a back: every transaction decided once, and the decisions name the models in that order."""
    reg = runtime.registry
    a = publish_anomaly(reg, runtime.config, seed=3)
    reg.promote("anomaly", a.version, actor="test", reason="baseline")
    b = publish_anomaly(reg, runtime.config, seed=4)
    part = _slice(frame, "promote_rollback")
    counts = runtime.wait_idle()
    done = threading.Event()
    thread, results = _stream_until(runtime, part, done)
    try:
        _wait_decided(runtime, counts, 150)
        _wait_model(runtime, a.tag)  # a serves before b is promoted (150 decisions can come before the watcher polls)
        reg.promote("anomaly", b.version, actor="test", reason="challenger better")
        _wait_model(runtime, b.tag)
        reg.rollback("anomaly", actor="test", reason="alarm")
        _wait_model(runtime, a.tag)
    finally:
        done.set()
        thread.join()
        reg.set_alias("anomaly", "champion", None, actor="test", reason="back to newest for the other tests")
    sent, decisions = _streamed(results)
    fresh = [d for d in decisions if not d["redelivered"]]
    assert len(fresh) == len(sent) == len({d["transaction_id"] for d in fresh})
    used = [d["models"]["anomaly"] for d in sorted(fresh, key=lambda d: d["decided_us"])]
    runs = [tag for i, tag in enumerate(used) if i == 0 or used[i - 1] != tag]
    # (the stream may open on the previous newest version until the watcher sees a's promotion)
    assert runs[-3:] == [a.tag, b.tag, a.tag] and runs.count(b.tag) == 1, runs  # b only while promoted
    assert [e["to"] for e in reg.audit("anomaly")][-3:] == [b.version, a.version, None]


def test_killing_the_scoring_replica_loses_and_double_counts_nothing(runtime, frame):
    import ray

    from fedfraud.feature_store.online import OnlineStateClient

    part = _slice(frame, "kill")
    cfg = runtime.config
    client = OnlineStateClient.open(cfg.features, cfg.egograph)
    holders = sorted(set(part["cardholder_id"]))
    pseudonyms = runtime.featurizer().pseudonyms(holders)
    versions_before = np.array([s.version for s in client.read_states(pseudonyms)])
    before = runtime.wait_idle()
    thread, out = _stream_in_background(runtime, part, rate=300)
    deadline = time.monotonic() + 30
    while runtime.counters()["replica"]["decided"] < before["replica"]["decided"] + 100:  # kill it mid-work,
        assert time.monotonic() < deadline, "the replica decided nothing in 30 s"  # not before it joined the group
        time.sleep(0.1)
    victims = [a for a in ray.util.list_named_actors(all_namespaces=True) if "StreamScorer" in a["name"]]
    assert victims
    ray.kill(ray.get_actor(victims[0]["name"], namespace=victims[0]["namespace"]), no_restart=True)
    thread.join()
    result = out["result"]
    assert result.missing == set()
    # Checked on the topic: every transaction decided; no transaction decided twice unmarked; all decisions of
    # one transaction agree. A replica killed between storing a batch's decisions and producing them re-emits
    # the stored decisions on redelivery, marked redelivered: for those the marked copy is the only one.
    by_id: dict[str, list[dict]] = {}
    for d in result.decisions:
        by_id.setdefault(d["transaction_id"], []).append(d)
    assert set(by_id) == set(part["transaction_id"])
    assert all(sum(not d["redelivered"] for d in ds) <= 1 for ds in by_id.values())
    assert all(len({(d["score"], d["decision"]) for d in ds}) == 1 for ds in by_id.values())
    snap = runtime.wait_idle()
    # durable totals (issue 14): the killed replica's committed counts stay; redelivered messages count again
    assert snap["consumed"] == snap["decided"] + snap["dead_lettered"]
    assert snap["decided"] - before["decided"] >= len(part) and snap["replicas"] == before["replicas"] + 1
    assert snap["replica"]["consumed"] < snap["consumed"]  # the new replica's own counts started at zero

    # every ego graph took every transaction exactly once (the Feast state's transaction counter)
    versions_after = np.array([s.version for s in client.read_states(pseudonyms)])
    expected = part.groupby("cardholder_id").size().reindex(holders).to_numpy()
    np.testing.assert_array_equal(versions_after - versions_before, expected)


def _records_of(runtime, rows: pd.DataFrame) -> list[dict]:
    """The wire records the bank's producer sends: card tokens, coarse coordinates."""
    from fedfraud.serving.replay import wire_records

    return wire_records(rows, runtime.featurizer())


def test_every_poison_probe_is_dead_lettered_and_the_stream_goes_on(runtime, frame):
    """Issue 14's probes over Kafka: each is a DLQ record with its reason; the transactions after them are decided."""
    import json

    from fedfraud.serving.replay import topic_end_offsets
    from tests.unit.test_poison_messages import PROBES

    probes = [(b"probe", value) for value, _ in PROBES.values()]
    probes.append((b"probe", b'{"pad":"' + b"x" * 200_000 + b'"}'))  # over max_message_bytes (64 KiB here)
    part = _slice(frame, "poison")
    before = runtime.wait_idle()
    dlq_start = topic_end_offsets(runtime.bootstrap_servers, runtime.config.serving.topics.dlq)
    result = runtime.replay(part, rate=0, extra=probes, timeout_s=120)
    assert result.missing == set()
    assert len({d["transaction_id"] for d in result.decisions}) == len(part)
    by_offset = {d["offset"]: d for d in _own_dead_letters(runtime, dlq_start, [value for _, value in probes])}
    assert len(by_offset) == len(probes)
    cap = runtime.config.serving.guards.max_message_bytes  # 64 KiB here: the deep nesting is over it too
    expected = ["oversized" if len(v) > cap else reason.value for v, reason in PROBES.values()] + ["oversized"]
    assert [by_offset[o]["reason"] for o in sorted(by_offset)] == expected
    big = by_offset[max(by_offset)]  # its size and digest, not its bytes
    assert big["raw_bytes"] > 200_000 and "raw_b64" not in big and len(json.dumps(big)) < 2_000
    snap = runtime.wait_idle()
    assert snap["consumed"] - before["consumed"] == len(part) + len(probes)
    assert snap["dead_lettered"] - before["dead_lettered"] == len(probes)
    assert snap["consumed"] == snap["decided"] + snap["dead_lettered"]


def test_duplicates_on_the_topics_copies_marked_and_a_conflicting_reuse_dead_lettered(runtime, frame):
    """Checked on the topics: a copy gets the same decision marked redelivered; a reused id with other content
    goes to the DLQ as conflicting_duplicate (in one batch or across batches)."""
    from fedfraud.serving.kafka import json_bytes, make_producer
    from fedfraud.serving.replay import topic_end_offsets

    cfg = runtime.config
    topics, servers = cfg.serving.topics, runtime.bootstrap_servers
    before = runtime.wait_idle()
    rows = _records_of(runtime, _slice(frame, "duplicates"))
    a, b = rows
    key = runtime.featurizer().pseudonyms([a["cardholder_id"]])[0].encode()
    dec_start = topic_end_offsets(servers, topics.decisions)
    dlq_start = topic_end_offsets(servers, topics.dlq)
    producer = make_producer(servers, cfg.serving.producer, client_id="test-duplicates")
    sent = [producer.send(topics.transactions, key=key, value=json_bytes(value))
            for value in (a, a, {**b, "cardholder_id": a["cardholder_id"]}, {**a, "amount": a["amount"] + 1})]
    producer.flush()
    where = [(f.get(10).partition, f.get(10).offset) for f in sent]
    _wait_accounted(runtime, before, len(sent))  # every output of the four messages is on its topic by now
    awaited = Counter(d["transaction_id"] for d in (a, a, b))  # a's decision and its marked copy, b's
    decisions = topic_records(servers, topics.decisions, dec_start,
                              until=lambda records: not awaited - Counter(d["transaction_id"] for d in records))
    of_a = [d for d in decisions if d["transaction_id"] == a["transaction_id"]]
    assert sorted(d["redelivered"] for d in of_a) == [False, True]
    assert of_a[0]["score"] == of_a[1]["score"] and of_a[0]["top_reasons"] == of_a[1]["top_reasons"]
    assert len([d for d in decisions if d["transaction_id"] == b["transaction_id"]]) == 1
    # the DLQ records of exactly our four source messages (by source partition/offset)
    dead = [d for d in topic_records(servers, topics.dlq, dlq_start,
                                     until=lambda records: any((d["topic"], d["partition"], d["offset"])
                                                               == (topics.transactions, *where[3]) for d in records))
            if (d["partition"], d["offset"]) in where and d["topic"] == topics.transactions]
    assert [((d["partition"], d["offset"]), d["reason"]) for d in dead] == [(where[3], "conflicting_duplicate")]
    assert dead[0]["record"]["amount"] == a["amount"] + 1  # the canonical fields, masked
    producer.close()


def test_http_bad_input_gets_4xx_never_500(runtime, frame):
    import httpx

    url = f"{runtime.url}/score"
    client = httpx.Client(headers=runtime.headers)  # an authenticated client: this test is about the body
    good = _records_of(runtime, _slice(frame, "http_bad_input"))
    big = client.post(url, content=b'{"pad":"' + b"x" * 70_000 + b'"}', timeout=30)
    assert big.status_code == 413
    too_many = client.post(url, json=[good[0]] * 51, timeout=30)
    assert too_many.status_code == 413
    for body in (b'{"amount": Infinity}', b'{"amount": 1e400}', b"[" * 50_000, b"not json", b"\xff\xfe"):
        assert client.post(url, content=body, timeout=30).status_code == 422
    for bad in ({**good[0], "amount": 1e308}, {**good[0], "amount": 10**401}, {**good[0], "amount": True},
                {**good[0], "cardholder_id": {"a": 1}}, {**good[0], "timestamp": "1900-01-01T00:00:00Z"}):
        response = client.post(url, content=__import__("json").dumps(bad), timeout=30)
        assert response.status_code == 422, response.text
    ok = client.post(url, json=good[0], timeout=60)
    assert ok.status_code == 200 and ok.json()["decisions"][0]["redelivered"] is False
    again = client.post(url, json=good[0], timeout=60).json()["decisions"][0]
    assert again["redelivered"] is True and again["score"] == ok.json()["decisions"][0]["score"]
    conflict = client.post(url, json={**good[0], "amount": good[0]["amount"] + 1}, timeout=60)
    assert conflict.status_code == 422 and "conflicting_duplicate" in conflict.text
    assert client.get(f"{runtime.url}/healthz", timeout=30).status_code == 200
    ready = client.get(f"{runtime.url}/readyz", timeout=30)
    assert ready.status_code == 200, ready.text


def test_score_and_metrics_need_the_bearer_token_and_the_probes_do_not(runtime, frame):
    """Issue 17: 401 with a ``Bearer`` challenge without a usable header, 403 for a wrong token, 200 with the
    token; ``/healthz`` and ``/readyz`` stay open for the kubelet."""
    import httpx

    record = {**_records_of(runtime, _slice(frame, "auth"))[0], "transaction_id": "auth-probe-1"}
    for method, path, body in (("POST", "/score", record), ("GET", "/metrics", None)):
        url = f"{runtime.url}{path}"

        def call(headers: dict[str, str], url: str = url, method: str = method, body: dict | None = body):
            return httpx.request(method, url, json=body, headers=headers, timeout=60)

        anonymous = call({})
        assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"] == "Bearer", anonymous.text
        assert call({"Authorization": "Basic dXNlcjpwYXNz"}).status_code == 401
        assert call({"Authorization": "Bearer"}).status_code == 401
        assert call({"Authorization": "Bearer not-the-token"}).status_code == 403
        authorized = call(runtime.headers)
        assert authorized.status_code == 200, authorized.text
    assert "fedfraud_consumed_total" in authorized.text  # the last call of the loop: GET /metrics
    # the token is checked before the body: an anonymous oversized body is a 401, not a 413
    assert httpx.post(f"{runtime.url}/score", content=b"x" * 70_000, timeout=30).status_code == 401
    for probe in ("/healthz", "/readyz"):
        assert httpx.get(f"{runtime.url}{probe}", timeout=30).status_code == 200
    # issue 37: the open probes say only their status; the reasons and counters need the token
    for probe, status in (("/healthz", "ok"), ("/readyz", "ready")):
        assert httpx.get(f"{runtime.url}{probe}", timeout=30).json() == {"status": status}
        assert httpx.get(f"{runtime.url}{probe}?detail=true", timeout=30).status_code == 401
        detail = httpx.get(f"{runtime.url}{probe}?detail=true", headers=runtime.headers, timeout=30)
        assert detail.status_code == 200 and detail.json()["problems"] == [], detail.text


def _topic_bytes(servers: str, topic: str) -> bytes:
    """Every key, value and header of ``topic`` from its beginning, concatenated: what a reader of it can see."""
    import json

    chunks: list[bytes] = []
    for key, value, headers in topic_messages(servers, topic):
        chunks += [key or b"", value, *(v for _, v in headers)]
        if b'"raw_b64"' in value:  # a dead letter with raw capture on: the bytes it keeps, decoded
            chunks.append(base64.b64decode(json.loads(value)["raw_b64"]))
    return b"\x00".join(chunks)


def _words_at_every_offset(blob: bytes) -> np.ndarray:
    """Every 8 consecutive bytes of ``blob`` as a little-endian 64-bit word: ``word in`` these is ``bytes in blob``
    for all the words at once (``bytes in blob`` one coordinate at a time took ~20 s over the topics)."""
    return np.concatenate([np.frombuffer(blob, dtype="<u8", count=(len(blob) - k) // 8, offset=k)
                           for k in range(8) if len(blob) - k >= 8] or [np.empty(0, dtype="<u8")])


def test_no_card_number_or_exact_coordinate_on_any_topic_or_in_the_online_store(runtime, frame):
    """Issue 17, item 5: after a stream, no topic and no online-store file holds a card number or an exact
    coordinate, not even the dead letter of a producer that sent a card number in clear."""
    import re

    from fedfraud.serving.kafka import json_bytes

    part = _slice(frame, "no_clear_data")
    leaky = _slice(frame, "leaky_producer")
    from fedfraud.serving.replay import topic_end_offsets

    leaked = {**_records_of(runtime, leaky)[0], "cardholder_id": str(leaky["cardholder_id"][0])}
    leaked_value = json_bytes(leaked)
    dlq_start = topic_end_offsets(runtime.bootstrap_servers, runtime.config.serving.topics.dlq)
    result = runtime.replay(part, rate=0, extra=[(b"leaky-producer", leaked_value)], timeout_s=120)
    assert result.missing == set()
    # this test's own dead letter (another test's card-number poison may be redelivered meanwhile)
    leaks = [d for d in _own_dead_letters(runtime, dlq_start, [leaked_value]) if d["reason"] == "card_number_in_clear"]
    assert len(leaks) == 1

    cards = {str(c).encode() for c in frame["cardholder_id"]}
    exact = [v for v in np.concatenate([frame["lat"].to_numpy(), frame["lon"].to_numpy()])
             if round(v, 2) != v]  # coordinates finer than the schema's precision
    assert len(cards) > 50 and len(exact) > 1000
    # as text: a whole number token equal to an exact coordinate (not a substring of a longer number, e.g. a
    # distance of 142.0099941 km holds "42.009994"); as binary: its float64 bytes
    as_text = {repr(float(v)).encode() for v in exact}
    as_float64 = np.unique(np.asarray(exact, dtype="<f8").view("<u8"))  # their bytes, as 64-bit words
    number = re.compile(rb"-?[0-9]+\.[0-9]+")

    cfg = runtime.config
    places = {f"topic {t}": _topic_bytes(runtime.bootstrap_servers, t) for t in cfg.serving.topics.all()}
    repo = Path(cfg.features.repo_dir)
    places |= {f"store {p.relative_to(repo)}": p.read_bytes() for p in repo.rglob("*") if p.is_file()}
    assert places[f"topic {cfg.serving.topics.transactions}"] and any(k.startswith("store data/") for k in places)
    injected = leaked["cardholder_id"].encode()  # the leaky producer's own message holds it on the input topic
    for where, blob in places.items():
        expected_clear = {injected} if where == f"topic {cfg.serving.topics.transactions}" else set()
        assert not [c for c in cards - expected_clear if c in blob], f"a card number in clear in {where}"
        assert not set(number.findall(blob)) & as_text, f"an exact coordinate (text) in {where}"
        assert not np.isin(as_float64, _words_at_every_offset(blob)).any(), f"an exact coordinate (float64) in {where}"
    # the leaky record's canonical fields were kept, masked
    dead = leaks[0]["record"]
    assert dead["cardholder_id"].endswith(leaked["cardholder_id"][-4:]) and set(dead["cardholder_id"][:-4]) == {"*"}


def test_hostile_records_leave_no_card_number_on_either_dlq(runtime, tmp_path):
    """Issue 37, finding 2, on the real topics: card numbers in every disguise (``tests/unit/test_dlq_masking.py``)
    through the stream (decode rejects; stage rejects: the same ids again with other content, a batch later) and
    through the label joiner. Read back from the DLQ topics: one record per rejected message, none per decided one,
    and no card number's first 12 digits in any key, value or header, however they are read."""
    import json
    import uuid

    from fedfraud.feature_store.outcomes import OutcomeStore
    from fedfraud.serving.kafka import confirm_sent, make_producer
    from fedfraud.serving.labels import LabelJoiner
    from fedfraud.serving.replay import topic_end_offsets
    from tests.unit.test_dlq_masking import (
        CARDS, TOKEN, decode_disguises, label_disguises, recoverable, respell, stage_disguises,
    )

    cfg, servers = runtime.config, runtime.bootstrap_servers
    topics = cfg.serving.topics
    run = uuid.uuid4().hex  # ids and a card token of this run only: the stage state outlives a test run
    producer = make_producer(servers, cfg.serving.producer, client_id="test-hostile-dlq")

    def send(topic: str, messages: list[tuple[bytes | None, bytes]]) -> set[tuple[str, int, int]]:
        futures = [producer.send(topic, key=key, value=value) for key, value in messages]
        confirm_sent(producer, futures)
        return {(topic, f.get(10).partition, f.get(10).offset) for f in futures}

    def source(value: bytes) -> tuple[str, int, int]:
        d = json.loads(value)
        return d["topic"], d["partition"], d["offset"]

    decode = [m for card in CARDS for m in decode_disguises(card).values()]
    yesterday = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 86_400))  # within the guards' window
    # a cardholder each: the stages tell a reused id only among a cardholder's last serving.decision_ring decisions
    stage = [(key, respell(value, {'"tx-a"': f'"{run}-{i}"', TOKEN: f"ct_{run[:-3]}{i:03x}",
                                   "2026-11-01T12:00:00Z": yesterday}))
             for i, (key, value) in enumerate(m for card in CARDS for m in stage_disguises(card).values())]
    try:
        before = runtime.wait_idle()
        dlq_start = topic_end_offsets(servers, topics.dlq)
        rejected = send(topics.transactions, decode)
        decided = send(topics.transactions, stage)
        middle = _wait_accounted(runtime, before, len(decode) + len(stage))
        reused = send(topics.transactions, [(k, respell(v, {'"amount": 12.5': '"amount": 13.5'})) for k, v in stage])
        snap = _wait_accounted(runtime, middle, len(stage))
    finally:
        producer.close()
    assert snap["decided"] - before["decided"] == len(stage)  # counts in == counts out
    assert snap["dead_lettered"] - before["dead_lettered"] == len(decode) + len(stage)
    dead = topic_messages(servers, topics.dlq, dlq_start)
    mine = [(source(v), json.loads(v)["reason"]) for _, v, _ in dead if source(v) in rejected | decided | reused]
    assert sorted(p for p, _ in mine) == sorted(rejected | reused)  # one DLQ record each; none for a decision
    assert {r for p, r in mine if p in reused} == {"conflicting_duplicate"}  # rejected by the scoring stages
    for card in CARDS:
        assert recoverable(card, dead) == [], f"{card[:4]}…: card digits on {topics.dlq}"

    labels_start = topic_end_offsets(servers, topics.labels_dlq)
    producer = make_producer(servers, cfg.serving.producer, client_id="test-hostile-labels")
    try:
        labels = send(topics.labels, [m for card in CARDS for m in label_disguises(card).values()])
    finally:
        producer.close()
    with OutcomeStore(tmp_path / "outcomes.sqlite") as store:
        joiner = LabelJoiner(servers, store, topics, cfg.serving.producer, security=cfg.serving.kafka_security)
        try:
            joiner.run(idle_s=0.5)  # the labels were all sent: caught up and quiet for a moment, it is done
        finally:
            joiner.close()
    dead = topic_messages(servers, topics.labels_dlq, labels_start)
    assert sorted(source(v) for _, v, _ in dead if source(v) in labels) == sorted(labels)
    for card in CARDS:
        assert recoverable(card, dead) == [], f"{card[:4]}…: card digits on {topics.labels_dlq}"

"""Labels coming back, on the real broker: joined exactly once per transaction id across a SIGKILL of the
joiner, bad label messages dead-lettered with their reasons (counted on the topics themselves).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.topic_reader import topic_records

pytestmark = [pytest.mark.integration]


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    from fedfraud.serving.config import ProducerSettings
    from fedfraud.serving.kafka import confirm_sent, make_producer

    producer = make_producer(bootstrap, ProducerSettings())
    try:
        confirm_sent(producer, [producer.send(topic, key=str(i % 97).encode(), value=v) for i, v in enumerate(values)])
    finally:
        producer.close()


def _join(bootstrap: str, outcomes, idle_s: float = 3.0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fedfraud", "labels", "join", "--outcomes", str(outcomes),
                             "--bootstrap-servers", bootstrap, "--idle-s", str(idle_s)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_labels_join_exactly_once_across_a_kill_and_bad_labels_go_to_the_dlq(tmp_path, kafka_broker):
    from fedfraud.feature_store.outcomes import OutcomeStore
    from fedfraud.serving.config import TopicNames
    from fedfraud.serving.kafka import json_bytes
    from fedfraud.serving.labels import label_message
    from fedfraud.serving.replay import topic_end_offsets

    topics = TopicNames()
    bootstrap = kafka_broker.bootstrap_servers
    run = f"lj{time.monotonic_ns()}"
    # fresh topics per test run would need an admin call; instead every id is unique to this run and the
    # outcome store is new, so it reads the topics from the beginning and counts only what it stores
    n = 6000
    ids = [f"{run}-{i}" for i in range(n)]
    decisions = [json_bytes({"transaction_id": t, "cardholder": f"c{i % 300}", "score": (i % 100) / 100,
                             "anomaly_score": 0.5, "decision": "legit", "decided_us": 1,
                             "models": {"anomaly": "anomaly:v1", "fraud": "fraud:v1"}}) for i, t in enumerate(ids)]
    labels = [label_message(t, i % 50 == 0, "2026-11-20T00:00:00+00:00", "chargeback") for i, t in enumerate(ids)]
    resent = labels[:1000]  # the case system sent these twice
    bad = [b"{not json", b'{"transaction_id": "x", "label": "maybe"}', b'{"label": "fraud"}', b"[]"]
    dlq_start = topic_end_offsets(bootstrap, topics.labels_dlq)
    _produce(bootstrap, topics.decisions, decisions)
    _produce(bootstrap, topics.labels, labels[:3000] + bad[:2] + resent + labels[3000:] + bad[2:])

    outcomes = tmp_path / "outcomes.sqlite"
    first = _join(bootstrap, outcomes, idle_s=30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # kill it mid-way, once some rows are stored
        time.sleep(0.05)
        if outcomes.exists():
            with OutcomeStore(outcomes) as store:
                if 0 < store.count("labels") < n:
                    break
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    with OutcomeStore(outcomes) as store:
        stored_at_kill = store.count("labels")
    assert 0 < stored_at_kill < n, "the kill must land mid-way for this test to mean anything"

    second = _join(bootstrap, outcomes, idle_s=1)  # every message was sent before: caught up and quiet, it is done
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err[-2000:]

    with OutcomeStore(outcomes) as store:
        mine = store.joined()
        mine = mine[mine["transaction_id"].str.startswith(run)]
        assert len(mine) == n and mine["transaction_id"].is_unique  # each id once
        assert mine["score"].notna().all()  # every label joined to its decision
        assert int(mine["is_fraud"].sum()) == len(range(0, n, 50))
        assert store.counters()["duplicate_labels"] >= len(resent)  # re-sent labels counted, not stored
        # read to the end: (Tansu's ListOffsets answers the last batch's base offset, so >=, not ==)
        stored = store.positions()
        for p, end in topic_end_offsets(bootstrap, topics.labels).items():
            assert stored[(topics.labels, p)] >= end
    from fedfraud.serving.kafka.dead_letters import payload_digest

    # this run's bad labels only: a new outcome store reads the topic from the beginning, so another test's bad
    # labels on the session's broker are dead-lettered again (a DLQ record keeps the payload's digest)
    digests = {payload_digest(b) for b in bad}
    # everything since the start, to the end: the joiner exited after its DLQ sends were acknowledged
    dead = topic_records(bootstrap, topics.labels_dlq, dlq_start,
                         until=lambda records: digests <= {d["raw_sha256"] for d in records})
    distinct = {(d["partition"], d["offset"]): d["reason"] for d in dead
                if d["topic"] == topics.labels and d["raw_sha256"] in digests}
    # a DLQ record sent just before the kill may be sent again (at least once); each bad message is there
    assert sorted(distinct.values()) == sorted(["not_json", "bad_label", "bad_transaction_id", "not_an_object"])

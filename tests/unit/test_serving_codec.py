"""Kafka decoding/dead-lettering, the serving KV store and the consumer-settings checks (no services)."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import pytest

from fedfraud.feature_store.schema import Validator
from fedfraud.serving.config import ConsumerSettings
from fedfraud.serving.kafka.dead_letters import payload_digest
from fedfraud.serving.kafka import PRODUCED_HEADER, decode_messages, dlq_value
from fedfraud.serving.kvstore import SqliteKV
from tests.prerequisites import require_redis
from tests.kafka_messages import Msg




def _tx(i: int, ts: str) -> bytes:
    return json.dumps({"transaction_id": f"t{i}", "cardholder_id": "c1", "merchant_id": "m", "timestamp": ts,
                       "amount": 10.0, "lat": 1.0, "lon": 2.0, "mcc": "5411"}).encode()


def test_decode_splits_scorable_and_dead_and_sorts_by_event_time():
    msgs = [
        Msg(_tx(1, "2026-01-01T00:00:05Z"), 0, headers=((PRODUCED_HEADER, b"123"),)),
        Msg(b"\xff{not json", 1),
        Msg(b"[1, 2]", 2),
        Msg(json.dumps({"transaction_id": "t9", "amount": -1}).encode(), 3),
        Msg(_tx(2, "2026-01-01T00:00:01Z"), 4),
    ]
    out = decode_messages(msgs, Validator(dedupe=False))
    assert out.n_input == 5 and len(out.frame) == 2 and len(out.dead) == 3
    assert out.frame["transaction_id"].tolist() == ["t2", "t1"]
    assert out.produced_us.tolist() == [1_700_000_000_000_000, 123]
    assert [d.reason for d in out.dead] == ["malformed", "malformed", "missing_field"]
    record = json.loads(dlq_value(out.dead[0]))
    # not JSON: the DLQ keeps a digest and the length of the bytes, never the bytes (issue 37)
    assert record["raw_sha256"] == payload_digest(b"\xff{not json") and record["raw_bytes"] == 10
    assert record["record"] is None and "raw_b64" not in record and record["offset"] == 1
    captured = json.loads(dlq_value(out.dead[0], raw_capture=True))  # serving.guards.dlq_raw_capture
    assert base64.b64decode(captured["raw_b64"]) == b"\xff{not json"


def test_sqlite_kv_round_trip(tmp_path):
    kv = SqliteKV(tmp_path / "kv.db")
    kv.put_many("fraud", [("a", b"1"), ("b", b"2")])
    kv.put_many("fraud", [("a", b"3")])
    assert kv.get_many("fraud", ["a", "x", "b"]) == [b"3", None, b"2"]
    assert kv.get_many("scores", ["a"]) == [None]
    with pytest.raises(ValueError, match="unknown table"):
        kv.get_many("nope", ["a"])


def test_consumer_settings_reject_a_request_timeout_a_join_can_outlive():
    with pytest.raises(ValueError, match="request_timeout_ms"):
        ConsumerSettings(session_timeout_ms=45_000, request_timeout_ms=30_000, heartbeat_interval_ms=3000)


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_durable_counters_add_up_across_replicas_and_survive_a_restart(tmp_path, backend, request):
    """Issue 14: totals came from one replica's memory and reset on restart."""
    from fedfraud.serving.metrics import DurableCounters

    kv = _kv(backend, tmp_path, request)
    a = DurableCounters(kv, "group-1", replica="a")
    a.save({"consumed": 10, "decided": 7, "dead_lettered": 1, "inflight": 2, "redelivered": 1})
    b = DurableCounters(kv, "group-1", replica="b")
    b.save({"consumed": 5, "decided": 5, "dead_lettered": 0, "inflight": 0})
    DurableCounters(kv, "group-2", replica="x").save({"consumed": 99, "decided": 99})
    # replica "a" restarts under a new id: its last save stays in the totals
    restarted = DurableCounters(kv, "group-1", replica="a2")
    restarted.save({"consumed": 3, "decided": 2, "dead_lettered": 1, "inflight": 0})
    totals = restarted.totals()
    assert (totals["consumed"], totals["decided"], totals["dead_lettered"]) == (8 + 5 + 3, 7 + 5 + 2, 1 + 0 + 1)
    assert totals["consumed"] == totals["decided"] + totals["dead_lettered"]  # consumed counts at commit
    assert totals["replicas"] == 3 and totals["inflight"] == 2 and totals["redelivered"] == 1
    stale = DurableCounters(kv, "group-1", replica="a", heartbeat_s=-1.0).totals()
    assert stale["live_replicas"] == 0 and stale["inflight"] == 0  # dead replicas' in-flight is not counted


def _kv(backend: str, tmp_path, request) -> Any:
    """A KV store of ``backend``; Redis: db 15, the tests' own, under a prefix of this run (never a flush)."""
    from fedfraud.serving.kvstore import RedisKV

    if backend != "redis":
        return SqliteKV(tmp_path / "kv.db")
    require_redis(db=15)
    kv = RedisKV("redis://127.0.0.1:6379/15", prefix=f"fedfraud-test-{uuid.uuid4().hex}")

    def drop_keys() -> None:
        keys = list(kv._client.scan_iter(match=f"{kv.prefix}:*"))
        if keys:
            kv._client.delete(*keys)

    request.addfinalizer(drop_keys)
    return kv


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_get_tables_reads_several_tables_in_one_call(tmp_path, backend, request):
    """The hot path reads a batch's score rings and fraud states together (one MGET on Redis)."""
    kv = _kv(backend, tmp_path, request)
    kv.put_many("scores", [("a", b"s-a")])
    kv.put_many("fraud", [("a", b"f-a"), ("b", b"f-b")])
    assert kv.get_tables(("scores", "fraud"), ["a", "b", "x"]) == [[b"s-a", None, None], [b"f-a", b"f-b", None]]
    assert kv.get_tables(("scores", "fraud"), []) == [[], []]
    if backend == "redis":  # the server's own command counts (other clients may run MGETs too: at least one less)
        def mgets() -> int:
            return int(kv._client.info("commandstats").get("cmdstat_mget", {}).get("calls", 0))

        before = mgets()
        kv.get_tables(("scores", "fraud"), ["a", "b"])
        assert mgets() - before == 1  # both tables in one round trip

"""Kafka decoding/dead-lettering, the serving KV store and the consumer-settings checks (no services)."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

import pytest

from feature_store.schema import Validator
from serving.config import ConsumerSettings
from serving.kafka import PRODUCED_HEADER, decode_messages, dlq_value
from serving.kvstore import SqliteKV


@dataclass
class Msg:
    value: bytes
    offset: int
    key: bytes | None = b"k"
    headers: tuple = ()
    timestamp: int = 1_700_000_000_000
    topic: str = "transactions"
    partition: int = 0


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
    assert base64.b64decode(record["raw_b64"]) == b"\xff{not json" and record["offset"] == 1


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

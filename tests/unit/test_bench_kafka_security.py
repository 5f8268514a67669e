"""Issue 37 finding 7: the benches make their Kafka clients with ``serving.kafka_security``, as the product does.

The serving bench's throughput ceiling and the retrain bench's label feed are run against in-memory stand-ins for
the Kafka clients that record what they were made with; a sweep of ``fedfraud/bench`` then checks that no bench
makes a Kafka client without a ``security=`` argument, so a new one cannot fall back to plaintext unnoticed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from fedfraud.serving.config import KafkaSecurity, ServingConfig

BENCH = Path(__file__).resolve().parents[2] / "fedfraud" / "bench"
SECURED = KafkaSecurity(security_protocol="SSL", ssl_cafile="/etc/kafka-tls/ca.crt")

#: Everything in the project that opens a Kafka connection (clients, admin, and the helpers that make them).
KAFKA_CLIENTS = {"make_producer", "make_consumer", "make_reader", "create_topics", "LabelJoiner", "Consumer",
                 "Producer", "AdminClient", "topic_end_offsets", "collect", "replay_and_collect", "_send_labels"}


@dataclass
class _Record:
    topic: str
    partition: int
    offset: int
    key: bytes
    value: bytes


class _Broker:
    """Stand-in clients of one in-memory topic set; remembers the ``security`` each client was made with."""

    def __init__(self) -> None:
        self.made: dict[str, Any] = {}
        self.records: list[_Record] = []

    def create_topics(self, bootstrap: str, partitions: dict[str, int], **kwargs: Any) -> list[str]:
        self.made["admin"] = kwargs.get("security")
        return list(partitions)

    def make_producer(self, bootstrap: str, settings: Any, **kwargs: Any) -> _Broker:
        self.made["producer"] = kwargs.get("security")
        return self

    def make_consumer(self, bootstrap: str, settings: Any, topic: str, **kwargs: Any) -> _Broker:
        self.made["consumer"] = kwargs.get("security")
        self._topic = topic
        return self

    def send(self, topic: str, key: bytes, value: bytes) -> None:
        self.records.append(_Record(topic, 0, len(self.records), key, value))

    def poll(self, timeout_ms: int, max_records: int) -> list[_Record]:
        batch = [r for r in self.records if r.topic == self._topic][:max_records]
        self.records = [r for r in self.records if r not in batch]
        return batch

    def flush(self, *args: Any) -> None:
        """Nothing is buffered."""

    def commit(self, offsets: Any) -> None:
        """Nothing to commit."""

    def close(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to close."""


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> _Broker:
    from fedfraud.serving.kafka import broker as broker_module
    from fedfraud.serving import kafka

    fake = _Broker()
    monkeypatch.setattr(broker_module, "create_topics", fake.create_topics)
    monkeypatch.setattr(kafka, "make_producer", fake.make_producer)
    monkeypatch.setattr(kafka, "make_consumer", fake.make_consumer)
    monkeypatch.setattr(kafka, "confirm_sent", lambda producer, sends: None)
    return fake


def test_the_serving_benchs_ceiling_uses_the_configured_kafka_security(broker: _Broker) -> None:
    from fedfraud.bench.serving import _ceiling

    _ceiling("broker.bank.internal:9093", 300, ServingConfig(kafka_security=SECURED))
    assert broker.made == {"admin": SECURED, "producer": SECURED, "consumer": SECURED}


def test_the_retrain_benchs_label_feed_uses_the_configured_kafka_security(broker: _Broker) -> None:
    from fedfraud.bench.retrain import _send_labels

    frame = pd.DataFrame({"transaction_id": ["t1", "t2"], "is_fraud": [True, None],
                          "timestamp": ["2026-01-01T00:00:00+00:00"] * 2})
    _send_labels("broker.bank.internal:9093", "fraud-labels", frame, SECURED)
    assert broker.made == {"producer": SECURED}
    assert [r.key for r in broker.records] == [b"t1"]


def _calls_without_security(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name not in KAFKA_CLIENTS:
            continue
        keywords = {k.arg for k in node.keywords}
        positional_security = name == "_send_labels" and len(node.args) >= 4
        if "security" not in keywords and None not in keywords and not positional_security:
            found.append(f"{path.name}:{node.lineno} {name}(...)")
    return found


def test_no_bench_makes_a_kafka_client_without_the_configured_security() -> None:
    missing = [m for path in sorted(BENCH.glob("*.py")) for m in _calls_without_security(path)]
    assert missing == []

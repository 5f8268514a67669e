"""Kafka wire formats and client factories of the streaming pipeline.

Topics (DESIGN §2), all keyed by the cardholder's keyed pseudonym so one
cardholder's messages share a partition and keep their order:

* ``transactions``: value = :meth:`feature_store.schema.Transaction.to_record` as JSON;
  header ``produced-us`` = wall-clock µs when the replay tool sent it (end-to-end latency).
* ``anomaly-scores``: ``{transaction_id, cardholder, anomaly_score, model, redelivered, scored_us}``.
* ``fraud-decisions``: :class:`DecisionRecord` as JSON.
* ``transactions-dlq``: the original bytes base64-encoded with the reject reason
  (:class:`feature_store.schema.RejectReason` value), detail and source offset;
  headers ``reason`` and ``detail`` as well so tools can filter without decoding.

The factories apply :class:`serving.config.ConsumerSettings` /
:class:`serving.config.ProducerSettings` and nothing else, so the same code
talks to the embedded Tansu broker and to a production cluster.
"""

from __future__ import annotations

import base64
import json
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from feature_store.schema import RejectReason, Validator
from serving.config import ConsumerSettings, ProducerSettings

if TYPE_CHECKING:
    from kafka import KafkaConsumer, KafkaProducer

__all__ = [
    "PRODUCED_HEADER",
    "DeadLetter",
    "DecodedBatch",
    "decode_messages",
    "dlq_value",
    "json_bytes",
    "make_consumer",
    "make_producer",
    "now_us",
    "produced_us_of",
]

PRODUCED_HEADER = "produced-us"


def now_us() -> int:
    """Wall-clock µs since the epoch: latency is measured across processes, so not monotonic time."""
    return time.time_ns() // 1000


def _default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def json_bytes(value: Any) -> bytes:
    """Compact JSON; NaN becomes null so every consumer can parse it."""
    if isinstance(value, dict):
        value = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in value.items()}
    return json.dumps(value, separators=(",", ":"), default=_default, allow_nan=False).encode()


def make_producer(bootstrap_servers: str, settings: ProducerSettings, client_id: str = "fedfraud") -> KafkaProducer:
    """A producer with the pipeline's durability settings (acks=all, idempotent by default)."""
    from kafka import KafkaProducer

    return KafkaProducer(
        bootstrap_servers=bootstrap_servers,
        client_id=client_id,
        acks=settings.acks if settings.acks == "all" else int(settings.acks),
        enable_idempotence=settings.enable_idempotence,
        linger_ms=settings.linger_ms,
        batch_size=settings.batch_size,
        compression_type=settings.compression_type,
    )


def make_consumer(
    bootstrap_servers: str, settings: ConsumerSettings, topic: str, group_id: str | None = None
) -> KafkaConsumer:
    """The ingress consumer: manual commits (at-least-once), group or manual partition assignment."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap_servers,
        group_id=group_id or settings.group_id,
        enable_auto_commit=False,
        auto_offset_reset=settings.auto_offset_reset,
        session_timeout_ms=settings.session_timeout_ms,
        heartbeat_interval_ms=settings.heartbeat_interval_ms,
        max_poll_interval_ms=settings.max_poll_interval_ms,
        request_timeout_ms=settings.request_timeout_ms,
        max_poll_records=settings.max_poll_records,
        fetch_max_wait_ms=settings.fetch_max_wait_ms,
    )
    if settings.assignment == "manual":
        deadline = time.monotonic() + settings.request_timeout_ms / 1000
        parts = consumer.partitions_for_topic(topic)
        while not parts and time.monotonic() < deadline:
            time.sleep(0.1)
            parts = consumer.partitions_for_topic(topic)
        if not parts:
            consumer.close()
            raise RuntimeError(f"topic {topic!r} has no partitions (does it exist?)")
        consumer.assign([TopicPartition(topic, p) for p in sorted(parts)])
    else:
        consumer.subscribe([topic])
    return consumer


def produced_us_of(headers: Sequence[tuple[str, bytes]] | None, fallback_ms: int) -> int:
    """The replay tool's produce stamp, else the record's Kafka timestamp (ms) in µs."""
    for key, value in headers or ():
        if key == PRODUCED_HEADER:
            try:
                return int(value)
            except ValueError:
                break
    return int(fallback_ms) * 1000


@dataclass(frozen=True)
class DeadLetter:
    """A message that could not be scored, with the reason it goes to the DLQ."""

    key: bytes | None
    raw: bytes
    reason: str
    detail: str
    topic: str
    partition: int
    offset: int


def dlq_value(dead: DeadLetter) -> bytes:
    """The DLQ record: reason, detail, source position and the original bytes (base64, exact)."""
    return json_bytes(
        {
            "reason": dead.reason,
            "detail": dead.detail,
            "topic": dead.topic,
            "partition": dead.partition,
            "offset": dead.offset,
            "raw_b64": base64.b64encode(dead.raw).decode("ascii"),
            "dead_lettered_us": now_us(),
        }
    )


@dataclass(frozen=True)
class DecodedBatch:
    """One poll's messages split into scorable rows (canonical frame) and dead letters.

    ``frame`` is sorted by (timestamp, transaction_id), the order the feature
    state applies transactions in; ``produced_us`` is aligned with it.
    ``n_input == len(frame) + len(dead)`` always.
    """

    frame: pd.DataFrame
    produced_us: np.ndarray
    dead: list[DeadLetter]
    n_input: int

    def __post_init__(self) -> None:
        if len(self.frame) != len(self.produced_us):
            raise ValueError("produced_us must align with frame")
        if len(self.frame) + len(self.dead) != self.n_input:
            raise ValueError("every input message must be either scorable or dead-lettered")


def decode_messages(messages: Iterable[Any], validator: Validator) -> DecodedBatch:
    """Decode JSON values and validate them with :mod:`feature_store.schema` (the only place rows are judged).

    Undecodable or non-object values are ``malformed``; schema rejects keep
    their :class:`~feature_store.schema.RejectReason`. ``messages`` are kafka
    ``ConsumerRecord``-like objects (``key``, ``value``, ``headers``, ``timestamp``,
    ``topic``, ``partition``, ``offset``).
    """
    messages = list(messages)
    dead: list[DeadLetter] = []
    records: list[dict[str, Any]] = []
    kept: list[Any] = []
    for msg in messages:
        raw = msg.value if isinstance(msg.value, bytes) else bytes(msg.value or b"")
        try:
            value = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            dead.append(_dead(msg, raw, RejectReason.MALFORMED.value, f"not JSON: {exc.__class__.__name__}"))
            continue
        if not isinstance(value, dict):
            dead.append(_dead(msg, raw, RejectReason.MALFORMED.value, f"JSON {type(value).__name__}, expected object"))
            continue
        records.append(value)
        kept.append(msg)
    if records:
        result = validator.validate_records(records)
        rejected = set(result.rejects["row"].tolist())
        for row, reason, detail in result.rejects[["row", "reason", "detail"]].itertuples(index=False):
            msg = kept[int(row)]
            dead.append(_dead(msg, msg.value, str(reason), str(detail)))
        accepted_msgs = [m for i, m in enumerate(kept) if i not in rejected]
        frame = result.accepted
        produced = np.asarray(
            [produced_us_of(m.headers, m.timestamp) for m in accepted_msgs], dtype=np.int64
        )
        # the order feature_store.cardholder.prepare_batch applies rows in, so its sort is the identity
        order = frame.sort_values(["timestamp", "transaction_id"], kind="stable").index.to_numpy()
        frame = frame.loc[order].reset_index(drop=True)
        produced = produced[order]
    else:
        frame = Validator(dedupe=False).validate_records([]).accepted
        produced = np.zeros(0, dtype=np.int64)
    return DecodedBatch(frame=frame, produced_us=produced, dead=dead, n_input=len(messages))


def _dead(msg: Any, raw: bytes, reason: str, detail: str) -> DeadLetter:
    return DeadLetter(
        key=msg.key, raw=raw, reason=reason, detail=detail, topic=msg.topic, partition=msg.partition, offset=msg.offset
    )

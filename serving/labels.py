"""Labels coming back: the ``fraud-labels`` topic joined to a bank's decisions and shadow scores.

A label is a confirmed outcome of one transaction (chargeback, analyst
verdict), keyed by transaction id, days after the decision::

    {"transaction_id": "t-1", "label": "fraud" | "genuine", "labelled_at": "2026-11-20T10:00:00Z",
     "source": "chargeback"}

:class:`LabelJoiner` reads three topics of the bank (``fraud-decisions``,
``shadow-scores``, ``fraud-labels``) from the positions stored in the bank's
:class:`fedfraud.feature_store.outcomes.OutcomeStore` and writes rows and positions
in one transaction: exactly once per transaction id, whatever crashes. It
assigns partitions itself instead of joining a consumer group, because the
positions of record are the store's (Kafka's committed offsets would be a
second truth that can disagree after a crash). A message that is not a
valid label goes to ``fraud-labels-dlq`` with its reason, acknowledged by
the broker before its position is stored; the record is built and masked by
:mod:`fedfraud.serving.kafka.dead_letters` as for the transactions DLQ (label fields only).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fedfraud.feature_store.outcomes import OutcomeStore
from fedfraud.serving.config import KafkaSecurity, ProducerSettings, TopicNames
from fedfraud.serving.kafka.dead_letters import LABEL_FIELDS, DeadLetter, dead_letter_of, dlq_message
from fedfraud.serving.kafka import (
    confirm_sent, json_bytes, make_producer, now_us, parse_json, wait_for_partitions,
)
from fedfraud.serving.kafka.consumer import Record, assign_from, caught_up, make_reader, take, watermarks

__all__ = ["LABELS", "JoinStats", "LabelJoiner", "label_message", "parse_label"]

log = logging.getLogger(__name__)

#: Accepted label values and what they mean for ``is_fraud``.
LABELS = {"fraud": True, "genuine": False}
_MAX_ID = 256


def label_message(transaction_id: str, is_fraud: bool, labelled_at: str, source: str = "replay") -> bytes:
    """The value of one ``fraud-labels`` record (what a bank's case system produces)."""
    return json_bytes({"transaction_id": transaction_id, "label": "fraud" if is_fraud else "genuine",
                       "labelled_at": labelled_at, "source": source})


def parse_label(raw: bytes) -> tuple[dict[str, Any] | None, str, str]:
    """``(row, "", "")`` for a valid label, else ``(None, reason, detail)`` for the DLQ."""
    try:
        value = parse_json(raw)
    except Exception as exc:  # orjson/json errors, bad UTF-8
        return None, "not_json", str(exc)[:200]
    if not isinstance(value, dict):
        return None, "not_an_object", type(value).__name__
    tx = value.get("transaction_id")
    if not isinstance(tx, str) or not tx.strip() or len(tx) > _MAX_ID:
        return None, "bad_transaction_id", repr(tx)[:200]
    label = value.get("label")
    if label not in LABELS:
        return None, "bad_label", f"label must be one of {sorted(LABELS)}, got {label!r}"[:200]
    labelled_at = value.get("labelled_at")
    if labelled_at is not None and not isinstance(labelled_at, str):
        return None, "bad_labelled_at", repr(labelled_at)[:200]
    source = value.get("source")
    return {"transaction_id": tx, "is_fraud": int(LABELS[label]), "labelled_at": labelled_at,
            "source": None if source is None else str(source)[:64], "received_us": now_us()}, "", ""


def _finite(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _int(value: Any) -> int | None:
    """An integer timestamp, or None (a record is never rejected, nor the joiner stopped, by a bad one)."""
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) \
        else None


def _decision_row(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict) or not isinstance(value.get("transaction_id"), str):
        return None
    models = value.get("models") or {}
    return {"transaction_id": value["transaction_id"], "cardholder": str(value.get("cardholder", "")),
            "score": _finite(value.get("score")), "anomaly_score": _finite(value.get("anomaly_score")),
            "decision": str(value.get("decision", "")), "fraud_model": str(models.get("fraud", "")),
            "anomaly_model": str(models.get("anomaly", "")), "decided_us": _int(value.get("decided_us"))}


def _shadow_row(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict) or not isinstance(value.get("transaction_id"), str):
        return None
    ch, cp = value.get("challenger") or {}, value.get("champion") or {}
    score, champion_score = _finite(ch.get("score")), _finite(cp.get("score"))
    if score is None or champion_score is None:
        return None
    return {"transaction_id": value["transaction_id"], "cardholder": str(value.get("cardholder", "")),
            "fraud_model": str(ch.get("fraud_model", "")), "anomaly_model": str(ch.get("anomaly_model", "")),
            "score": score, "anomaly_score": _finite(ch.get("anomaly_score")),
            "champion_fraud_model": str(cp.get("fraud_model", "")), "champion_score": champion_score,
            "scored_us": _int(value.get("scored_us"))}


@dataclass
class JoinStats:
    """Totals of one :meth:`LabelJoiner.run` (rows new to the store, and what went to the DLQ)."""

    messages: int = 0
    decisions: int = 0
    shadow: int = 0
    labels: int = 0
    duplicate_labels: int = 0
    dead_lettered: dict[str, int] = field(default_factory=dict)


class LabelJoiner:
    """Reads decisions, shadow scores and labels of one bank into its outcome store, exactly once per id."""

    def __init__(self, bootstrap_servers: str, store: OutcomeStore, topics: TopicNames | None = None,
                 producer: ProducerSettings | None = None, max_message_bytes: int = 1 << 20,
                 security: KafkaSecurity | None = None, raw_capture: bool = False) -> None:
        self.store = store
        self.raw_capture = raw_capture  # serving.guards.dlq_raw_capture: keep masked payloads in the DLQ
        self.topics = topics or TopicNames()
        self.max_message_bytes = max_message_bytes
        t = self.topics
        self._kind = {t.decisions: "decisions", t.shadow_scores: "shadow", t.labels: "labels"}
        # earliest (make_reader): a stored position that fell out of retention must not jump to the end and skip
        self._consumer = make_reader(bootstrap_servers, client_id="fedfraud-labels", fetch_max_wait_ms=50,
                                     security=security)
        self._producer = make_producer(bootstrap_servers, producer or ProducerSettings(), client_id="fedfraud-labels",
                                       security=security)
        parts = [(topic, p) for topic in self._kind for p in sorted(wait_for_partitions(self._consumer, topic))]
        stored = store.positions()
        assign_from(self._consumer, {part: stored.get(part) for part in parts})  # None: from the beginning
        #: next offset to read of each partition read from a stored position or read from since (else: its beginning)
        self._positions: dict[tuple[str, int], int] = {part: stored[part] for part in parts if part in stored}
        self.stats = JoinStats()

    def _take(self, timeout_ms: int) -> list[Record]:
        return take(self._consumer, timeout_ms, 2000)

    def step(self, timeout_ms: int = 200) -> int:
        """Poll once and apply what came (rows + positions in one store transaction); returns messages handled."""
        polled = self._take(timeout_ms)
        if not polled:
            return 0
        rows: dict[str, list[dict[str, Any]]] = {"decisions": [], "shadow": [], "labels": []}
        dead: list[DeadLetter] = []
        positions: dict[tuple[str, int], int] = {}
        n = 0
        for m in polled:
            kind = self._kind[m.topic]
            n += 1
            positions[(m.topic, m.partition)] = m.offset + 1
            raw = m.value or b""
            if len(raw) > self.max_message_bytes:
                dead.append(dead_letter_of(m, "too_large", f"{len(raw)} bytes", LABEL_FIELDS, raw=raw))
                continue
            if kind == "labels":
                row, reason, detail = parse_label(raw)
            else:
                try:
                    value = parse_json(raw)
                except Exception as exc:  # our own topics; still never stop on one record
                    value, detail = None, str(exc)[:200]
                row = (_decision_row if kind == "decisions" else _shadow_row)(value)
                reason, detail = ("", "") if row is not None else (f"bad_{kind}_record", repr(raw[:80]))
            if row is None:
                dead.append(dead_letter_of(m, reason, detail, LABEL_FIELDS, raw=raw))
            else:
                rows[kind].append(row)
        self._dead_letter(dead)
        applied = self.store.apply(decisions=rows["decisions"], shadow=rows["shadow"], labels=rows["labels"],
                                   positions=positions,
                                   counters=dict(Counter(f"dlq_{d.reason}" for d in dead)))
        self._positions.update(positions)
        s = self.stats
        s.messages += n
        s.decisions += applied.decisions
        s.shadow += applied.shadow
        s.labels += applied.labels
        s.duplicate_labels += applied.duplicate_labels
        for d in dead:
            s.dead_lettered[d.reason] = s.dead_lettered.get(d.reason, 0) + 1
        return n

    def _dead_letter(self, dead: Iterable[DeadLetter]) -> None:
        """Send to the labels DLQ (masked: :func:`fedfraud.serving.kafka.dead_letters.dlq_message`) and wait for the
        broker's acks: their positions are stored right after.
        """
        futures = []
        for d in dead:
            key, value, headers = dlq_message(d, raw_capture=self.raw_capture)
            futures.append(self._producer.send(self.topics.labels_dlq, key=key, value=value, headers=headers))
        if futures:
            confirm_sent(self._producer, futures)
            for d in dead:
                log.warning("label dead-lettered reason=%s topic=%s offset=%d", d.reason, d.topic, d.offset)

    def caught_up(self) -> bool:
        """True when every assigned partition is read to its current end."""
        parts = [(tp.topic, tp.partition) for tp in self._consumer.assignment()]
        return caught_up(self._positions, watermarks(self._consumer, parts))

    def run(self, stop: threading.Event | None = None, idle_s: float | None = None) -> JoinStats:
        """Apply until ``stop`` is set, or (``idle_s``) until caught up and nothing came for that long."""
        stop = stop or threading.Event()
        quiet_since = time.monotonic()
        while not stop.is_set():
            if self.step():
                quiet_since = time.monotonic()
            elif idle_s is not None and time.monotonic() - quiet_since >= idle_s and self.caught_up():
                break
        return self.stats

    def close(self) -> None:
        self._consumer.close()
        self._producer.close(timeout=5)

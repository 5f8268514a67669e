"""What the console knows of the topics: a compact row per decision, transaction and label, with its offset.

Why an index and not the records: the queue must filter and page tens of thousands of decisions in well under
300 ms, and reading a filtered page back from Kafka means random reads across partitions. So one background
thread (:class:`TopicIndex`) reads ``fraud-decisions``, ``transactions`` and ``fraud-labels`` (and
``shadow-scores`` when it exists, for the Models page's shadow agreement) from their beginning (or the last
``history`` records of each partition) and keeps, per record, only what the queue, the timeline and the Models
page show and filter on, plus its ``(partition, offset)``. A case reads its whole decision and
transaction back by offset (:class:`OffsetReader`); no record is kept whole. The rows are capped
(``max_rows``; the oldest go first).

The Kafka client is the one the project's tools use to read topics end to end (librdkafka's consumer on
assigned partitions, made by :func:`fedfraud.serving.kafka.consumer.make_reader`, as for
:class:`fedfraud.serving.labels.LabelJoiner` and :func:`fedfraud.serving.replay.collect`), with the
deployment's :class:`~fedfraud.serving.config.KafkaSecurity`.
"""

from __future__ import annotations

import bisect
import logging
import math
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from fedfraud.feature_store.schema import COORDINATE_DECIMALS, is_card_token
from fedfraud.serving.config import KafkaSecurity, TopicNames
from fedfraud.serving.kafka.dead_letters import mask_text
from fedfraud.serving.kafka import parse_json, wait_for_partitions
from fedfraud.serving.kafka.consumer import Record, assign_from, caught_up, make_reader, take, watermarks

__all__ = ["DecisionRow", "LabelRow", "OffsetReader", "QueueFilter", "QueuePage", "ShadowRow", "TopicIndex", "TxRow",
           "masked", "shadow_row"]

log = logging.getLogger(__name__)

_MAX_TEXT = 256
#: Characters read past a cut before masking: the longest card number the masker reads fits in it (19 digits
#: written as ``\uXXXX`` escapes with 3-character separators between them: 168 characters).
_MASK_MARGIN = 200


@dataclass(frozen=True, slots=True)
class DecisionRow:
    """One decision as the queue shows it, and where the whole record is (``partition``, ``offset``)."""

    partition: int
    offset: int
    transaction_id: str
    cardholder: str
    score: float | None
    anomaly_score: float | None
    decision: str
    fraud_model: str
    anomaly_model: str
    reasons: tuple[str, ...]
    decided_us: int
    bank: int


@dataclass(frozen=True, slots=True)
class TxRow:
    """One transaction as the timeline shows it (coordinates already rounded, text masked)."""

    partition: int
    offset: int
    transaction_id: str
    cardholder: str
    merchant: str
    amount: float | None
    mcc: str
    timestamp: str
    ts_us: int


@dataclass(frozen=True, slots=True)
class LabelRow:
    """The latest label of a transaction seen on ``fraud-labels``."""

    label: str
    source: str
    labelled_at: str


@dataclass(frozen=True, slots=True)
class ShadowRow:
    """What the Models page needs of one ``shadow-scores`` record: whose decision it is and when it was made."""

    transaction_id: str
    challenger: str  # the challenger's fraud model tag
    decision: str  # the challenger's decision: fraud or legit
    scored_us: int


@dataclass(frozen=True)
class QueueFilter:
    """The queue's filters; ``None`` means "any"."""

    bank: int | None = None
    min_score: float | None = None
    max_score: float | None = None
    reason: str | None = None
    model: str | None = None
    decision: str | None = "fraud"

    def matches(self, row: DecisionRow) -> bool:
        if self.decision is not None and row.decision != self.decision:
            return False
        if self.bank is not None and row.bank != self.bank:
            return False
        if self.min_score is not None and (row.score is None or row.score < self.min_score):
            return False
        if self.max_score is not None and (row.score is None or row.score > self.max_score):
            return False
        if self.model is not None and self.model not in (row.fraud_model, row.anomaly_model):
            return False
        return self.reason is None or self.reason in row.reasons


@dataclass(frozen=True)
class QueuePage:
    """One page of the queue, newest first, and how many decisions match the filter in all."""

    rows: list[DecisionRow]
    page: int
    size: int
    total: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.size))


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    x = float(value)
    return x if math.isfinite(x) else None


def masked(value: Any, limit: int = _MAX_TEXT) -> str:
    """Display text of a field: a string with card-number-looking runs masked, then cut to ``limit`` (defence
    in depth: the topics must not carry one, but the console never shows one whatever arrives).

    Masked before the cut, on a bounded prefix: cut first, a card number straddling the limit would keep up to
    12 of its digits unmasked (too few for the 13-digit minimum of a card number).
    """
    if value is None:
        return ""
    return mask_text(str(value)[: limit + _MASK_MARGIN])[:limit]


def _text(value: Any, limit: int = _MAX_TEXT) -> str:
    """:func:`masked`, interned (the index holds many copies of the same reason and model names)."""
    return sys.intern(masked(value, limit)) if value is not None else ""


def _token(value: Any) -> str:
    """A card token as is; anything else masked (a PAN never reaches the screen, nor the index)."""
    text = str(value or "")[:_MAX_TEXT]
    return text if is_card_token(text) else masked(value or "")


def decision_row(partition: int, offset: int, value: Any, default_bank: int) -> DecisionRow | None:
    """The queue's row of one ``fraud-decisions`` record (:class:`fedfraud.serving.fraud_stage.FraudStage`'s
    layout), or None for one that is not a decision (a redelivered copy is the caller's to skip).
    """
    if not isinstance(value, dict) or not isinstance(value.get("transaction_id"), str):
        return None
    raw_models, raw_reasons = value.get("models"), value.get("top_reasons")
    models: dict[str, Any] = raw_models if isinstance(raw_models, dict) else {}
    reasons: list[Any] = raw_reasons if isinstance(raw_reasons, list) else []
    bank = value.get("bank")
    stamp = value.get("decided_us", value.get("produced_us"))
    return DecisionRow(
        partition=partition, offset=offset, transaction_id=value["transaction_id"][:_MAX_TEXT],
        cardholder=_token(value.get("cardholder")), score=_finite(value.get("score")),
        anomaly_score=_finite(value.get("anomaly_score")), decision=_text(value.get("decision"), 32),
        fraud_model=_text(models.get("fraud"), 64), anomaly_model=_text(models.get("anomaly"), 64),
        reasons=tuple(_text(r.get("feature"), 64) for r in reasons if isinstance(r, dict))[:8],
        decided_us=int(stamp) if isinstance(stamp, int) and not isinstance(stamp, bool) else 0,
        bank=bank if isinstance(bank, int) and not isinstance(bank, bool) else default_bank,
    )


def tx_row(partition: int, offset: int, value: Any) -> TxRow | None:
    """The timeline's row of one ``transactions`` record, or None for one that is not a transaction."""
    if not isinstance(value, dict) or not isinstance(value.get("transaction_id"), str):
        return None
    stamp = str(value.get("timestamp") or "")[:40]
    try:
        from datetime import datetime

        ts_us = int(datetime.fromisoformat(stamp).timestamp() * 1_000_000)
    except ValueError:
        ts_us = 0
    return TxRow(partition=partition, offset=offset, transaction_id=value["transaction_id"][:_MAX_TEXT],
                 cardholder=_token(value.get("cardholder_id")), merchant=_text(value.get("merchant_id")),
                 amount=_finite(value.get("amount")), mcc=_text(value.get("mcc"), 64), timestamp=stamp, ts_us=ts_us)


def shadow_row(value: Any) -> ShadowRow | None:
    """The compact row of one ``shadow-scores`` record (the layout of
    :meth:`fedfraud.serving.fraud_stage.FraudStage._shadow_records`), or None for one that is not a shadow score.
    """
    if not isinstance(value, dict) or not isinstance(value.get("transaction_id"), str):
        return None
    challenger = value.get("challenger")
    if not isinstance(challenger, dict) or challenger.get("decision") not in ("fraud", "legit"):
        return None
    stamp = value.get("scored_us")
    return ShadowRow(transaction_id=value["transaction_id"][:_MAX_TEXT],
                     challenger=_text(challenger.get("fraud_model"), 64), decision=str(challenger["decision"]),
                     scored_us=int(stamp) if isinstance(stamp, int) and not isinstance(stamp, bool) else 0)


def rounded(value: Any) -> float | None:
    """A coordinate at the project's precision (0.01°, about 1.1 km): never an exact location on screen."""
    x = _finite(value)
    return None if x is None else round(x, COORDINATE_DECIMALS)


class TopicIndex:
    """Reads the topics (decisions, transactions, labels, shadow scores) in a background thread into compact rows;
    thread-safe queries.

    ``history``: start each partition that many records before its end (None: from the beginning).
    ``default_bank``: the bank of a decision that carries none (one scorer deployment serves one bank,
    ``serving.bank_id``, and its records do not name it).
    """

    def __init__(self, bootstrap_servers: str, topics: TopicNames | None = None,
                 security: KafkaSecurity | None = None, default_bank: int = 0, history: int | None = None,
                 max_rows: int = 1_000_000) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topics = topics or TopicNames()
        self.security = security or KafkaSecurity()
        self.default_bank = default_bank
        self.history = history
        self.max_rows = max_rows
        self._lock = threading.Lock()
        self._decisions: list[DecisionRow] = []  # kept sorted by (decided_us, partition, offset) when queried
        self._unsorted = False
        self._by_tx: dict[str, DecisionRow] = {}
        self._tx: dict[str, TxRow] = {}
        self._tx_order: deque[str] = deque()
        self._by_card: dict[str, list[str]] = {}
        self._labels: dict[str, LabelRow] = {}
        # each shadow row with its transaction's decision, joined as they arrive (either may come first)
        self._shadow: dict[str, tuple[ShadowRow, DecisionRow | None]] = {}
        self._shadow_order: deque[str] = deque()  # the oldest first (trimmed past max_rows)
        self.shadow_topic = False  # whether shadow-scores exists and is read
        self.skipped = 0
        self.redelivered = 0
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        self._error: str | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the reader thread
    def start(self) -> TopicIndex:
        """Start reading; :meth:`wait_caught_up` blocks until the records present at start are in."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="console-index", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def wait_caught_up(self, timeout_s: float = 60.0) -> bool:
        """True once every partition was read up to its end offset of when reading started."""
        return self._caught_up.wait(timeout_s)

    @property
    def error(self) -> str | None:
        """The reader's last error (the broker unreachable), None while it reads."""
        return self._error

    def _run(self) -> None:
        consumer = None
        try:
            consumer = make_reader(self.bootstrap_servers, client_id="fedfraud-console", fetch_max_wait_ms=100,
                                   security=self.security)
            topics = (self.topics.decisions, self.topics.transactions, self.topics.labels)
            parts = [(t, p) for t in topics for p in sorted(wait_for_partitions(consumer, t))]
            # optional: the scorer creates it with the others, but a console may read topics made without it
            # (asked in the list of all topics: asking for it by name must not create it)
            shadow = consumer.list_topics(timeout=10).topics.get(self.topics.shadow_scores)
            if shadow is not None and shadow.error is None and shadow.partitions:
                parts += [(self.topics.shadow_scores, p) for p in sorted(shadow.partitions)]
                self.shadow_topic = True
            else:
                log.info("console: no %r topic; the Models page shows no shadow agreement",
                         self.topics.shadow_scores)
            marks = watermarks(consumer, parts)
            positions = {part: low if self.history is None else max(low, high - self.history)
                         for part, (low, high) in marks.items()}
            assign_from(consumer, positions)
            targets = marks
            while not self._stop.is_set():
                polled: dict[tuple[str, int], list[Record]] = {}
                for m in take(consumer, 200, 5000):
                    polled.setdefault((m.topic, m.partition), []).append(m)
                for (topic, partition), msgs in polled.items():
                    self._ingest(topic, partition, msgs)
                    positions[(topic, partition)] = msgs[-1].offset + 1
                if targets and caught_up(positions, targets):
                    targets = {}
                    self._caught_up.set()
                    log.info("console index caught up: %d decisions, %d transactions, %d labels",
                             len(self._decisions), len(self._tx), len(self._labels))
                self._error = None
        except Exception as exc:  # noqa: BLE001 - the page says so; the console keeps serving what it has
            self._error = f"{exc.__class__.__name__}: {str(exc)[:200]}"
            log.exception("console index stopped reading")
        finally:
            if consumer is not None:
                consumer.close()

    def _ingest(self, topic: str, partition: int, msgs: Iterable[Any]) -> None:
        decisions: list[DecisionRow] = []
        txs: list[TxRow] = []
        labels: list[tuple[str, LabelRow]] = []
        shadows: list[ShadowRow] = []
        for m in msgs:
            try:
                value = parse_json(m.value or b"")
            except Exception:  # noqa: BLE001 - one bad record is skipped, never the reader
                self.skipped += 1
                continue
            if topic == self.topics.decisions:
                if isinstance(value, dict) and value.get("redelivered"):
                    self.redelivered += 1  # the same decision again (at-least-once): the first one is indexed
                    continue
                row = decision_row(partition, m.offset, value, self.default_bank)
                if row is None:
                    self.skipped += 1
                else:
                    decisions.append(row)
            elif topic == self.topics.transactions:
                tx = tx_row(partition, m.offset, value)
                if tx is None:
                    self.skipped += 1
                else:
                    txs.append(tx)
            elif topic == self.topics.shadow_scores:
                shadow = shadow_row(value)
                if shadow is None:
                    self.skipped += 1
                else:
                    shadows.append(shadow)
            elif isinstance(value, dict) and value.get("label") in ("fraud", "genuine") \
                    and isinstance(value.get("transaction_id"), str):
                labels.append((value["transaction_id"], LabelRow(str(value["label"]), _text(value.get("source"), 64),
                                                                 _text(value.get("labelled_at"), 40))))
        with self._lock:
            for row in decisions:
                if row.transaction_id in self._by_tx:
                    self.redelivered += 1
                    continue
                if self._decisions and row.decided_us < self._decisions[-1].decided_us:
                    self._unsorted = True
                self._decisions.append(row)
                self._by_tx[row.transaction_id] = row
                waiting = self._shadow.get(row.transaction_id)
                if waiting is not None and waiting[1] is None:
                    self._shadow[row.transaction_id] = (waiting[0], row)
            for tx in txs:
                if tx.transaction_id in self._tx:
                    continue
                self._tx[tx.transaction_id] = tx
                self._tx_order.append(tx.transaction_id)
                self._by_card.setdefault(tx.cardholder, []).append(tx.transaction_id)
            for tx_id, label in labels:
                self._labels[tx_id] = label
            for shadow in shadows:  # at-least-once: a copy of a shadow score is the same challenger decision again
                if shadow.transaction_id not in self._shadow:
                    self._shadow[shadow.transaction_id] = (shadow, self._by_tx.get(shadow.transaction_id))
                    self._shadow_order.append(shadow.transaction_id)
            self._trim()

    def _trim(self) -> None:
        """Drop the oldest rows past ``max_rows`` (memory stays bounded however long the console runs)."""
        excess = len(self._decisions) - self.max_rows
        if excess > 0:
            self._sort()
            for row in self._decisions[:excess]:
                self._by_tx.pop(row.transaction_id, None)
            del self._decisions[:excess]
        while len(self._tx_order) > self.max_rows:
            old = self._tx.pop(self._tx_order.popleft(), None)
            if old is not None:
                ids = self._by_card.get(old.cardholder, [])
                if ids and ids[0] == old.transaction_id:
                    ids.pop(0)
                if not ids:
                    self._by_card.pop(old.cardholder, None)
        while len(self._shadow_order) > self.max_rows:
            self._shadow.pop(self._shadow_order.popleft(), None)

    def _sort(self) -> None:
        if self._unsorted:
            self._decisions.sort(key=lambda r: (r.decided_us, r.partition, r.offset))
            self._unsorted = False

    # ------------------------------------------------------------------ queries
    def counts(self) -> dict[str, int]:
        with self._lock:
            return {"decisions": len(self._decisions), "transactions": len(self._tx), "labels": len(self._labels),
                    "shadow": len(self._shadow), "skipped": self.skipped, "redelivered": self.redelivered}

    def page(self, flt: QueueFilter, page: int = 1, size: int = 50) -> QueuePage:
        """Page ``page`` (1-based) of the decisions matching ``flt``, newest first."""
        with self._lock:
            self._sort()
            rows = self._decisions
            skip = (page - 1) * size
            out: list[DecisionRow] = []
            total = 0
            for row in _newest_first(rows):
                if not flt.matches(row):
                    continue
                if skip <= total < skip + size:
                    out.append(row)
                total += 1
            return QueuePage(out, page, size, total)

    def facets(self) -> dict[str, list[str]]:
        """The values the filters offer: banks, model tags and reason features seen (bounded)."""
        with self._lock:
            banks: set[int] = set()
            models: set[str] = set()
            reasons: set[str] = set()
            for row in self._decisions[-20_000:]:
                banks.add(row.bank)
                models.update(m for m in (row.fraud_model, row.anomaly_model) if m)
                reasons.update(row.reasons)
        return {"banks": [str(b) for b in sorted(banks)], "models": sorted(models), "reasons": sorted(reasons)}

    def monitor_rows(self) -> tuple[list[DecisionRow], list[tuple[ShadowRow, DecisionRow]], int]:
        """What the Models page computes from: the decisions in time order, each shadow row joined to its
        transaction's decision, and how many shadow rows have no decision in the index (not read yet, or trimmed).

        The join is made as the records arrive (:meth:`_ingest`), so under the lock only the row references are
        copied (the rows are frozen); the figures are computed outside it, and the reader and the queue wait
        milliseconds, not the figures' time.
        """
        with self._lock:
            self._sort()
            decisions = list(self._decisions)
            shadows = list(self._shadow.values())
        joined = [(s, d) for s, d in shadows if d is not None]
        return decisions, joined, len(shadows) - len(joined)

    def decision(self, transaction_id: str) -> DecisionRow | None:
        with self._lock:
            return self._by_tx.get(transaction_id)

    def transaction(self, transaction_id: str) -> TxRow | None:
        with self._lock:
            return self._tx.get(transaction_id)

    def label(self, transaction_id: str) -> LabelRow | None:
        with self._lock:
            return self._labels.get(transaction_id)

    def timeline(self, cardholder: str, until_us: int | None = None, limit: int = 20
                 ) -> list[tuple[TxRow, DecisionRow | None, LabelRow | None]]:
        """The cardholder's last ``limit`` transactions up to ``until_us`` (newest first), each with its
        decision and label when known.
        """
        with self._lock:
            txs = [self._tx[t] for t in self._by_card.get(cardholder, ()) if t in self._tx]
            txs.sort(key=lambda t: t.ts_us)
            if until_us is not None:
                txs = txs[:bisect.bisect_right([t.ts_us for t in txs], until_us)]
            return [(t, self._by_tx.get(t.transaction_id), self._labels.get(t.transaction_id))
                    for t in reversed(txs[-limit:])]


def _newest_first(rows: list[DecisionRow]) -> Iterator[DecisionRow]:
    return reversed(rows)


class OffsetReader:
    """Reads one record back by (topic, partition, offset); one consumer, one read at a time (a lock).

    Why a consumer of its own: the index's consumer belongs to its thread and reads every partition; this one
    is assigned the one partition of a read, from that read's offset, and nothing between reads.
    """

    def __init__(self, bootstrap_servers: str, topics: Iterable[str], security: KafkaSecurity | None = None,
                 timeout_s: float = 5.0) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        # a small fetch (one record is wanted) that the broker answers at once
        self._consumer = make_reader(bootstrap_servers, client_id="fedfraud-console-reader", fetch_max_wait_ms=10,
                                     security=security, **{"max.partition.fetch.bytes": 1 << 18})
        self._parts = {(t, p) for t in topics for p in wait_for_partitions(self._consumer, t)}

    def read(self, topic: str, partition: int, offset: int) -> Any:
        """The JSON value at that offset, or None if it cannot be read within the timeout (e.g. past
        retention) or is not JSON.
        """
        if (topic, partition) not in self._parts:
            return None
        with self._lock:
            c = self._consumer
            assign_from(c, {(topic, partition): offset})
            try:
                deadline = time.monotonic() + self.timeout_s
                while time.monotonic() < deadline:
                    for m in take(c, 100, 1):
                        if (m.topic, m.partition) != (topic, partition) or m.offset < offset:
                            continue  # fetched for an earlier read
                        if m.offset == offset:
                            try:
                                return parse_json(m.value or b"")
                            except Exception:  # noqa: BLE001 - not JSON: nothing to show
                                return None
                        return None  # past it: compacted or deleted, it is gone
                return None
            finally:
                c.unassign()

    def close(self) -> None:
        self._consumer.close()

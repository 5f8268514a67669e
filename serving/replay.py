"""Replay transactions into Kafka at a fixed rate and collect the decisions they produce.

The replay tool plays the bank's card gateway: it keys each message by the
cardholder's keyed pseudonym (so a cardholder's transactions share a partition
and keep their order; the raw card id never becomes a Kafka key) and stamps
the wall-clock produce time in the ``produced-us`` header, from which the
end-to-end latency (produce → decision) is measured.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from fedfraud.core.errors import UserError
from fedfraud.feature_store.schema import CANONICAL_COLUMNS, COORDINATE_DECIMALS
from fedfraud.serving.config import KafkaSecurity, ProducerSettings
from fedfraud.serving.kafka import PRODUCED_HEADER, Producer, json_bytes, make_producer, now_us, wait_for_partitions
from fedfraud.serving.kafka.consumer import assign_from, make_reader, take, watermarks

if TYPE_CHECKING:
    from fedfraud.feature_store.privacy import PrivateFeaturizer

__all__ = ["LabelFeed", "ReplayResult", "ReplayStats", "collect", "load_source", "replay", "replay_and_collect",
           "topic_end_offsets", "wire_records"]

log = logging.getLogger(__name__)


def load_source(path: Path, bank: int | None = None) -> pd.DataFrame:
    """Transactions of a dataset folder (``bank_<k>/transactions.parquet``; all banks or ``bank``) or a CSV
    with canonical columns, sorted by (timestamp, transaction_id).
    """
    from fedfraud.feature_store.layout import list_banks, read_bank

    path = Path(path)
    if path.is_dir():
        banks = list_banks(path) if bank is None else [bank]
        frame = pd.concat([read_bank(path, b) for b in banks], ignore_index=True)
    elif path.is_file():
        frame = pd.read_csv(path, dtype={"transaction_id": str, "cardholder_id": str, "merchant_id": str, "mcc": str})
        missing = [c for c in ("transaction_id", "cardholder_id", "timestamp") if c not in frame]
        if missing:
            raise UserError(f"{path}: lacks canonical columns {missing}; run `fedfraud ingest` on raw CSVs first")
        frame["timestamp"] = pd.to_datetime(frame["timestamp"], utc=True, errors="coerce", format="mixed")
    else:
        raise UserError(f"{path}: no such file or directory")
    if frame.empty:
        raise UserError(f"{path}: no transactions")
    return frame.sort_values(["timestamp", "transaction_id"], kind="stable").reset_index(drop=True)


def wire_records(frame: pd.DataFrame, featurizer: PrivateFeaturizer) -> list[dict[str, Any]]:
    """The ``transactions`` topic's records of a bank's rows: what the bank's producer must send.

    ``Transaction.to_record`` layout, with the card number replaced by the bank's card token and the
    coordinates rounded to the schema's precision (``COORDINATE_DECIMALS``), so neither a card number nor an
    exact location is ever on the topic. Everything else is sent as it is; the scorer validates.
    """
    out = frame[[c for c in CANONICAL_COLUMNS if c in frame]].copy()
    if "cardholder_id" in out:
        out["cardholder_id"] = featurizer.pseudonyms(out["cardholder_id"].astype(str).tolist())
    for col in ("lat", "lon"):
        if col in out:
            out[col] = pd.to_numeric(out[col], errors="coerce").round(COORDINATE_DECIMALS)
    if "timestamp" in out and pd.api.types.is_datetime64_any_dtype(out["timestamp"]):
        out["timestamp"] = out["timestamp"].map(lambda t: None if pd.isna(t) else t.isoformat())
    if "is_fraud" in out:
        out["is_fraud"] = out["is_fraud"].astype(object).where(out["is_fraud"].notna(), None)
    records = out.to_dict("records")
    for r in records:
        for k, v in r.items():
            if isinstance(v, np.generic):
                r[k] = v.item()
            elif isinstance(v, bool | np.bool_):
                r[k] = bool(v)
    return records


@dataclass(frozen=True)
class LabelFeed:
    """Labels of the replayed rows, sent ``delay_s`` of *event time* after their transaction.

    A label becomes due when the replay reaches the event time of its
    transaction plus ``delay_s`` (chargebacks arrive days late: with a sped-up
    replay they arrive the same number of replayed days late). ``flush`` sends
    the labels still pending at the end; without it they are left out, as
    labels of the last days are in a real feed.
    """

    topic: str = "fraud-labels"
    delay_s: float = 86_400.0
    flush: bool = True
    source: str = "replay"


@dataclass(frozen=True)
class ReplayStats:
    """What :func:`replay` sent."""

    sent: int
    seconds: float
    transaction_ids: list[str]
    labels_sent: int = 0
    started: float = 0.0  #: ``time.perf_counter()`` when the first record was sent (benchmarks window on it)

    @property
    def rate(self) -> float:
        return self.sent / self.seconds if self.seconds > 0 else float("inf")


def replay(
    frame: pd.DataFrame,
    bootstrap_servers: str,
    topic: str,
    featurizer: PrivateFeaturizer,
    rate: float = 0.0,
    producer_settings: ProducerSettings | None = None,
    progress: bool = True,
    extra: Sequence[tuple[bytes | None, bytes]] = (),
    labels: LabelFeed | None = None,
    security: KafkaSecurity | None = None,
    producer: Producer | None = None,
) -> ReplayStats:
    """Produce ``frame`` in its order at ``rate`` messages/s (0: as fast as possible), then flush.

    ``extra`` are raw (key, value) messages sent first (e.g. a poison message in tests).
    ``labels`` also sends each labelled row's outcome to the labels topic, late (:class:`LabelFeed`).
    ``producer``: a long-lived one to reuse (kept open); by default one is made and closed. A fresh idempotent
    producer holds its first records until the broker assigns it a producer id (~1 s on the embedded
    broker), which a latency measurement must not count as scoring time.
    """
    owned = producer is None
    if producer is None:
        producer = make_producer(bootstrap_servers, producer_settings or ProducerSettings(),
                                 client_id="fedfraud-replay", security=security)
    records = wire_records(frame, featurizer)
    keys = [str(r["cardholder_id"]).encode() for r in records]
    payloads = [json_bytes(r) for r in records]
    feed = _LabelQueue(frame, labels) if labels is not None else None
    start = time.perf_counter()
    try:
        for key, value in extra:
            producer.send(topic, key=key, value=value, headers=[(PRODUCED_HEADER, str(now_us()).encode())])
        for i, (key, value) in enumerate(tqdm(zip(keys, payloads, strict=True), total=len(keys), disable=not progress,
                                              desc="replay", unit="tx")):
            if rate > 0:
                due = start + i / rate
                delay = due - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            producer.send(topic, key=key, value=value, headers=[(PRODUCED_HEADER, str(now_us()).encode())])
            if feed is not None:
                feed.send_due(producer, i)
        if feed is not None and feed.feed.flush:
            feed.send_due(producer, None)
        producer.flush()
    finally:
        if owned:
            producer.close()
    seconds = time.perf_counter() - start
    stats = ReplayStats(len(records) + len(extra), seconds, frame["transaction_id"].astype(str).tolist(),
                        feed.sent if feed is not None else 0, start)
    log.info("replay sent=%d seconds=%.2f rate=%.0f/s topic=%s", stats.sent, seconds, stats.rate, topic)
    return stats


class _LabelQueue:
    """Labels of a replay in due order (event time + delay); :meth:`send_due` sends those due at row ``i``."""

    def __init__(self, frame: pd.DataFrame, feed: LabelFeed) -> None:
        self.feed = feed
        known = frame["is_fraud"].notna() if "is_fraud" in frame else pd.Series(False, index=frame.index)
        ts = pd.to_datetime(frame["timestamp"], utc=True)
        self.event_s = ts.dt.as_unit("s").astype("int64").to_numpy()  # whatever the stored resolution
        due = self.event_s[known.to_numpy()] + feed.delay_s
        order = np.argsort(due, kind="stable")
        rows = np.flatnonzero(known.to_numpy())[order]
        self.due = due[order]
        self.ids = frame["transaction_id"].astype(str).to_numpy()[rows]
        self.fraud = frame["is_fraud"].to_numpy()[rows].astype(bool) if len(rows) else np.zeros(0, bool)
        self.next = 0
        self.sent = 0

    def send_due(self, producer: Any, i: int | None) -> None:
        from datetime import UTC, datetime

        from fedfraud.serving.labels import label_message

        end = len(self.due) if i is None else int(np.searchsorted(self.due, self.event_s[i], side="right"))
        for k in range(self.next, end):
            at = datetime.fromtimestamp(float(self.due[k]), UTC).isoformat()
            producer.send(self.feed.topic, key=self.ids[k].encode(),
                          value=label_message(self.ids[k], bool(self.fraud[k]), at, self.feed.source))
        self.sent += max(end - self.next, 0)
        self.next = max(self.next, end)


def topic_end_offsets(bootstrap_servers: str, topic: str, security: KafkaSecurity | None = None) -> dict[int, int]:
    """Current end offset of every partition (collect from here to see only new records)."""
    consumer = make_reader(bootstrap_servers, client_id="fedfraud-replay", security=security)
    try:
        parts = wait_for_partitions(consumer, topic)
        return {p: high for (_, p), (_, high) in watermarks(consumer, [(topic, p) for p in sorted(parts)]).items()}
    finally:
        consumer.close()


def collect(
    bootstrap_servers: str,
    topic: str,
    expected: int | Iterable[str],
    start: dict[int, int] | None = None,
    timeout_s: float = 60.0,
    id_field: str | tuple[str, ...] = "transaction_id",
    security: KafkaSecurity | None = None,
) -> list[dict[str, Any]]:
    """Read JSON records from ``topic`` (from ``start`` offsets, else the beginning) until ``expected``
    distinct ids (a count or the ids themselves) were seen or ``timeout_s`` passed. Duplicates are kept.

    ``id_field`` may name several fields (a DLQ record is identified by its source partition and offset).
    """
    import json

    wanted = None if isinstance(expected, int) else set(expected)
    target = expected if isinstance(expected, int) else len(wanted or ())
    consumer = make_reader(bootstrap_servers, client_id="fedfraud-replay", fetch_max_wait_ms=20, security=security)
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    try:
        parts = sorted(wait_for_partitions(consumer, topic))
        assign_from(consumer, {(topic, p): (start or {}).get(p) for p in parts})
        deadline = time.monotonic() + timeout_s
        while len(seen) < target and time.monotonic() < deadline:
            for m in take(consumer, 100, 2000):
                record = json.loads(m.value or b"")
                rid = str(record.get(id_field)) if isinstance(id_field, str) else \
                    "/".join(str(record.get(f)) for f in id_field)
                if wanted is None or rid in wanted:
                    out.append(record)
                    seen.add(rid)
    finally:
        consumer.close()
    return out


@dataclass
class ReplayResult:
    """Decisions of one replay and their end-to-end latencies."""

    stats: ReplayStats
    decisions: list[dict[str, Any]]
    dead_letters: list[dict[str, Any]] = field(default_factory=list)

    @property
    def latencies_ms(self) -> np.ndarray:
        """Decided − produced per first decision of each transaction (ms)."""
        first: dict[str, float] = {}
        for d in self.decisions:
            first.setdefault(d["transaction_id"], (d["decided_us"] - d["produced_us"]) / 1000)
        return np.asarray(list(first.values()), dtype=np.float64)

    @property
    def decided_ids(self) -> set[str]:
        return {d["transaction_id"] for d in self.decisions}

    @property
    def missing(self) -> set[str]:
        return set(self.stats.transaction_ids) - self.decided_ids


def replay_and_collect(
    frame: pd.DataFrame,
    bootstrap_servers: str,
    featurizer: PrivateFeaturizer,
    rate: float = 0.0,
    timeout_s: float = 120.0,
    topics: Any = None,
    extra: Sequence[tuple[bytes | None, bytes]] = (),
    progress: bool = False,
    labels: LabelFeed | None = None,
    security: KafkaSecurity | None = None,
    producer: Producer | None = None,
) -> ReplayResult:
    """Replay ``frame`` and wait until every transaction has a decision (and every ``extra`` a dead letter)."""
    from fedfraud.serving.config import TopicNames

    topics = topics or TopicNames()
    dec_start = topic_end_offsets(bootstrap_servers, topics.decisions, security)
    dlq_start = topic_end_offsets(bootstrap_servers, topics.dlq, security)
    stats = replay(frame, bootstrap_servers, topics.transactions, featurizer, rate, progress=progress, extra=extra,
                   labels=labels, security=security, producer=producer)
    decisions = collect(bootstrap_servers, topics.decisions, stats.transaction_ids, dec_start, timeout_s,
                        security=security)
    dead = collect(bootstrap_servers, topics.dlq, len(extra), dlq_start, timeout_s=10 if extra else 0.5,
                   id_field=("topic", "partition", "offset"), security=security) if extra else []
    return ReplayResult(stats, decisions, dead)

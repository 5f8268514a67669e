"""Kafka wire formats of the streaming pipeline: JSON encoding, the produce stamp, and decoding a poll's messages.

Topics (DESIGN §2), all keyed by the cardholder's keyed pseudonym so one
cardholder's messages share a partition and keep their order:

* ``transactions``: value = :meth:`fedfraud.feature_store.schema.Transaction.to_record` as JSON;
  header ``produced-us`` = wall-clock µs when the replay tool sent it (end-to-end latency).
* ``anomaly-scores``: ``{transaction_id, cardholder, anomaly_score, model, redelivered, scored_us}``.
* ``fraud-decisions``: :class:`DecisionRecord` as JSON.
* ``transactions-dlq``: the reject reason (:class:`fedfraud.feature_store.schema.RejectReason` value), detail
  and source offset with the masked canonical record and a digest of the payload, never the payload itself
  unless an operator opts in (:mod:`fedfraud.serving.kafka.dead_letters`, the one place DLQ records are built);
  headers ``reason`` and ``detail`` as well so tools can filter without decoding.

The clients live beside this module (:mod:`fedfraud.serving.kafka.consumer`,
:mod:`fedfraud.serving.kafka.producer`, the topic admin and embedded broker in
:mod:`fedfraud.serving.kafka.broker`); :mod:`fedfraud.serving.kafka` exports them all.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pandas as pd

from fedfraud.feature_store.schema import (
    MAX_EPOCH_S,
    CleanRows,
    RejectReason,
    Validator,
    event_order,
    event_order_of,
)

from fedfraud.serving.config import GuardSettings
from fedfraud.serving.kafka.dead_letters import DeadLetter, dead_letter_of


__all__ = [
    "PRODUCED_HEADER",
    "DecodedBatch",
    "content_hashes",
    "decode_messages",
    "ingress_validator",
    "json_bytes",
    "json_value",
    "now_us",
    "parse_json",
    "produced_us_of",
]

PRODUCED_HEADER = "produced-us"

log = logging.getLogger(__name__)


def now_us() -> int:
    """Wall-clock µs since the epoch: latency is measured across processes, so not monotonic time."""
    return time.time_ns() // 1000


def _default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


_ORJSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def json_bytes(value: Any) -> bytes:
    """Compact UTF-8 JSON; NaN and infinities become null so every consumer can parse it.

    orjson: the hot path encodes each cardholder's decision ring on every
    transaction, and the standard library cost ~0.1 ms per ring. A value
    orjson refuses (a lone surrogate in a string) goes through ``json``.
    """
    try:
        return orjson.dumps(value, default=_default, option=_ORJSON_OPTIONS)
    except orjson.JSONEncodeError:
        if isinstance(value, dict):
            value = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in value.items()}
        return json.dumps(value, separators=(",", ":"), default=_default, allow_nan=False).encode()


def json_value(raw: bytes) -> Any:
    """Parse JSON this service wrote itself (state rings); input from outside goes through :func:`parse_json`."""
    return orjson.loads(raw)


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
class DecodedBatch:
    """One poll's messages split into scorable rows (canonical frame), copies and dead letters.

    ``frame`` is sorted by (timestamp, transaction_id), the order the feature
    state applies transactions in; ``produced_us`` and ``content`` (a hash of
    the canonical row, for idempotency checks) are aligned with it. ``copies``
    maps the offset position of a message that repeats an earlier row of this
    batch exactly (same cardholder, id and content) to that row: it gets the
    row's decision, marked ``redelivered``, instead of a second scoring.
    ``n_input == len(frame) + len(copies) + len(dead)`` always.
    """

    frame: pd.DataFrame
    produced_us: np.ndarray
    dead: list[DeadLetter]
    n_input: int
    content: list[str] = field(default_factory=list)
    copies: list[tuple[Any, int]] = field(default_factory=list)  # (message, frame row it repeats)
    sources: list[Any] = field(default_factory=list)  # the message of each frame row (to dead-letter it later)

    def __post_init__(self) -> None:
        if len(self.frame) != len(self.produced_us):
            raise ValueError("produced_us must align with frame")
        if self.content and len(self.content) != len(self.frame):
            raise ValueError("content must align with frame")
        if self.sources and len(self.sources) != len(self.frame):
            raise ValueError("sources must align with frame")
        if len(self.frame) + len(self.copies) + len(self.dead) != self.n_input:
            raise ValueError("every input message must be scorable, a copy, or dead-lettered")


_CONTENT_COLUMNS = ("cardholder_id", "transaction_id", "merchant_id", "timestamp", "amount", "lat", "lon", "mcc")


def content_hashes(frame: pd.DataFrame) -> list[str]:
    """A short hash of each canonical row: a replay has the same one, a reused id with other content does not."""
    if not len(frame):
        return []
    return _hashes([frame[c].tolist() for c in _CONTENT_COLUMNS])


def _hashes(columns: Sequence[Sequence[Any]]) -> list[str]:
    """:func:`content_hashes` of rows given column by column (a frame's or :class:`CleanRows`' values)."""
    import hashlib

    # str of each value (what astype(str) gives, without its per-column pandas cost on a small batch);
    # a JSON list, not a joined string: no separator can make two different rows hash alike
    return [hashlib.blake2b(json.dumps([str(v) for v in row]).encode(), digest_size=8).hexdigest()
            for row in zip(*columns, strict=True)]


def parse_json(raw: bytes) -> Any:
    """JSON of one message or body; NaN/Infinity tokens are errors (they are not JSON)."""

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    return json.loads(raw, parse_constant=no_constant)


def ingress_validator(guards: GuardSettings) -> Validator:
    """The one validator of the ``transactions`` topic and ``/score``: card tokens only, no card number in
    clear, timestamps within the guards' window; a redelivery is handled downstream, so no dedupe here.
    """
    return Validator(dedupe=False, max_future_s=guards.max_future_s, max_age_days=guards.max_age_days,
                     card_tokens=True)


def decode_messages(messages: Iterable[Any], validator: Validator, max_message_bytes: int = 1 << 20) -> DecodedBatch:
    """Decode JSON values and validate them with :mod:`fedfraud.feature_store.schema` (the only place rows are judged).

    No input can raise out of here: an oversized value is ``oversized``
    without being parsed; any exception while parsing one value (bad UTF-8,
    bad JSON, 100,000-deep nesting, a 401-digit number) makes that message
    ``malformed``; schema rejects keep their
    :class:`~fedfraud.feature_store.schema.RejectReason`; if validating the batch raises,
    each record is validated alone and the one that raises is ``malformed``.
    Exact copies of a row within the batch become ``copies``; a second row
    with the same cardholder and id but other content is
    ``conflicting_duplicate``. ``messages`` are kafka ``ConsumerRecord``-like
    objects (``key``, ``value``, ``headers``, ``timestamp``, ``topic``,
    ``partition``, ``offset``).
    """
    messages = list(messages)
    dead: list[DeadLetter] = []
    records: list[dict[str, Any]] = []
    kept: list[Any] = []
    for msg in messages:
        raw = msg.value if isinstance(msg.value, bytes) else bytes(msg.value or b"")
        if len(raw) > max_message_bytes:
            dead.append(_dead(msg, raw, RejectReason.OVERSIZED.value, f"{len(raw)} bytes > {max_message_bytes}"))
            continue
        try:
            value = parse_json(raw)
        except Exception as exc:  # noqa: BLE001 - any parse failure is this message's fault, never the stream's
            dead.append(_dead(msg, raw, RejectReason.MALFORMED.value, f"not JSON: {exc.__class__.__name__}"))
            continue
        if not isinstance(value, dict):
            dead.append(_dead(msg, raw, RejectReason.MALFORMED.value, f"JSON {type(value).__name__}, expected object"))
            continue
        records.append(value)
        kept.append(msg)
    if not records:
        return DecodedBatch(_empty_frame(), np.zeros(0, dtype=np.int64), dead, len(messages))
    try:
        clean = validator.clean_rows(records)
    except Exception:  # noqa: BLE001 - the frame path below judges (or isolates) whatever made this raise
        clean = None
    if clean is not None:
        try:
            return _decode_clean(clean, kept, list(dead), len(messages))
        except Exception:  # noqa: BLE001 - a bug here must not stop the stream: the general path below judges
            log.exception("decoding a clean batch failed; validating it record by record")
    accepted_msgs, frame = _validate(kept, records, validator, dead)
    produced = np.asarray([_produced(m) for m in accepted_msgs], dtype=np.int64)
    # the order fedfraud.feature_store.cardholder.prepare_batch applies rows in, so its sort is the identity
    order = event_order(frame)
    if order is not None:
        frame = frame.iloc[order].reset_index(drop=True)
        produced = produced[order]
        accepted_msgs = [accepted_msgs[i] for i in order]
    content = content_hashes(frame)
    frame, produced, content, copies, sources = _collapse(frame, produced, content, accepted_msgs, dead)
    return DecodedBatch(frame, produced, dead, len(messages), content, copies, sources)


def _decode_clean(clean: CleanRows, msgs: list[Any], dead: list[DeadLetter], n_input: int) -> DecodedBatch:
    """:func:`decode_messages` of a batch whose every record is clean: the same rules applied to the cleaned
    values, and the frame built once, in event order and without the copies (reading hashes, order and ids
    back out of a frame cost more than building it).
    """
    order = event_order_of(clean.stamps_us, clean.text["transaction_id"]) or list(range(len(clean)))
    content = _hashes([clean.values(c) for c in _CONTENT_COLUMNS])
    ids = list(zip(clean.text["cardholder_id"], clean.text["transaction_id"], strict=True))
    keep, copies = _repeats([ids[i] for i in order], [content[i] for i in order],
                            [msgs[i] for i in order], dead)
    rows = [order[k] for k in keep]
    produced = np.asarray([_produced(msgs[i]) for i in rows], dtype=np.int64)
    return DecodedBatch(clean.frame(rows), produced, dead, n_input, [content[i] for i in rows], copies,
                        [msgs[i] for i in rows])


def _empty_frame() -> pd.DataFrame:
    """The accepted frame of no rows (canonical columns and dtypes); a copy per call, as callers may add to it."""
    return _empty_template().copy()


@functools.cache
def _empty_template() -> pd.DataFrame:
    return Validator(dedupe=False).validate_records([]).accepted  # the frame path: it costs ~2 ms, so once


def _produced(msg: Any) -> int:
    """The produce stamp in µs, or now when the header/timestamp is missing, malformed or implausible."""
    try:
        stamp = produced_us_of(msg.headers, msg.timestamp)
    except Exception:  # noqa: BLE001 - a bad latency stamp must not cost the transaction
        return now_us()
    return stamp if 0 <= stamp <= MAX_EPOCH_S * 1_000_000 else now_us()


def _validate(kept: list[Any], records: list[dict[str, Any]], validator: Validator,
              dead: list[DeadLetter]) -> tuple[list[Any], pd.DataFrame]:
    """Accepted messages and frame; rejects appended to ``dead``. Falls back to one record at a time."""
    try:
        results = [(list(range(len(records))), validator.validate_records(records))]
    except Exception:  # noqa: BLE001 - find the record that breaks validation instead of losing the batch
        results = []
        for i, record in enumerate(records):
            try:
                results.append(([i], validator.validate_records([record])))
            except Exception as exc:  # noqa: BLE001
                msg = kept[i]
                dead.append(_dead(msg, msg.value, RejectReason.MALFORMED.value,
                                  f"validation raised {exc.__class__.__name__}"))
    accepted_msgs: list[Any] = []
    frames: list[pd.DataFrame] = []
    for rows, result in results:
        if result.rejects.empty:  # the common case: no pandas work per batch
            accepted_msgs += [kept[r] for r in rows]
            frames.append(result.accepted)
            continue
        rejected = set(result.rejects["row"].tolist())
        for row, reason, detail in result.rejects[["row", "reason", "detail"]].itertuples(index=False):
            msg = kept[rows[int(row)]]
            dead.append(_dead(msg, msg.value, str(reason), str(detail)))
        accepted_msgs += [kept[r] for j, r in enumerate(rows) if j not in rejected]
        frames.append(result.accepted)
    if not frames:
        return [], _empty_frame()
    frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    return accepted_msgs, frame


def _collapse(frame: pd.DataFrame, produced: np.ndarray, content: list[str], msgs: list[Any],
              dead: list[DeadLetter]) -> tuple[pd.DataFrame, np.ndarray, list[str], list[tuple[Any, int]], list[Any]]:
    """One row per (cardholder, transaction id) of an event-ordered frame (:func:`_repeats`)."""
    ids = list(zip(frame["cardholder_id"].astype(str).tolist(), frame["transaction_id"].astype(str).tolist(),
                   strict=True))
    keep, copies = _repeats(ids, content, msgs, dead)
    if len(keep) == len(ids):
        return frame, produced, content, [], msgs
    frame = frame.iloc[keep].reset_index(drop=True)
    return frame, produced[keep], [content[i] for i in keep], copies, [msgs[i] for i in keep]


def _repeats(ids: list[tuple[str, str]], content: list[str], msgs: list[Any],
             dead: list[DeadLetter]) -> tuple[list[int], list[tuple[Any, int]]]:
    """Rows to keep and copies (message, kept row it repeats) of rows keyed by (cardholder, transaction id).

    The first row of a key is kept; a later one with the same content is a copy, one with other content is
    dead-lettered ``conflicting_duplicate`` (appended to ``dead``).
    """
    if len(set(ids)) == len(ids):
        return list(range(len(ids))), []
    first: dict[tuple[str, str], int] = {}
    keep: list[int] = []
    copies: list[tuple[Any, int]] = []
    for i, key in enumerate(ids):
        j = first.get(key)
        if j is None:
            first[key] = i
            keep.append(i)
        elif content[j] == content[i]:
            copies.append((msgs[i], j))
        else:
            msg = msgs[i]
            dead.append(_dead(msg, msg.value, RejectReason.CONFLICTING_DUPLICATE.value,
                              "transaction_id repeated in this batch with different content"))
    position = {old: new for new, old in enumerate(keep)}
    return keep, [(m, position[j]) for m, j in copies]


def _dead(msg: Any, raw: bytes, reason: str, detail: str) -> DeadLetter:
    """A dead letter of ``msg`` with ``raw`` as its payload; what of it reaches the DLQ (masked, reduced) is
    decided by :func:`fedfraud.serving.kafka.dead_letters.dlq_value`, for decode and stage rejects alike.
    """
    return dead_letter_of(msg, reason, detail, raw=raw)

r"""Dead-letter records: the one place every DLQ value is built and masked (issue 37, finding 2).

Both DLQs (``transactions-dlq`` from the scoring consumer, decode and stage rejects alike, and
``fraud-labels-dlq`` from the label joiner) send what :func:`dlq_message` returns (:func:`dlq_key`,
:func:`dlq_value`, :func:`dlq_headers`). A DLQ topic keeps records for weeks and is read by operators, so what
it keeps is decided here, not by each producer of dead letters:

* ``record``: the parsed JSON object reduced to the canonical fields of its topic (:data:`TRANSACTION_FIELDS`
  or :data:`LABEL_FIELDS`; extra fields such as ``pan``, ``name``, ``dob`` or ``street`` are dropped), every
  string and every number masked with :func:`mask_text`, coordinates rounded to 0.01° as the validator does, a
  ``cardholder_id`` that is not a card token masked but its last 4 characters, nested values replaced by their
  type. The masking runs on parsed values, so JSON escapes (``"\u0031"``) are already gone.
* ``raw_sha256`` and ``raw_bytes``: a digest (:func:`payload_digest`, over the payload with card numbers masked,
  so a payload that is only a card number cannot be found by hashing guesses) and the length. The bytes
  themselves are not kept; a payload that is not a JSON object (bad UTF-8, not JSON, an array) has only these.
* ``raw_b64`` (only with ``serving.guards.dlq_raw_capture``, never for ``card_number_in_clear`` or
  ``untokenized_card``): the payload masked by :func:`mask_payload`, base64, cut to ``dlq_payload_bytes``.
* ``detail`` and the ``detail`` header are masked too (details can echo input); a message key that is not a
  card token is replaced by a digest of its masked bytes.

The masking here is deliberately wider than the validator's detection
(:func:`fedfraud.feature_store.schema.card_number_spans`): a false positive only costs digits in a dead letter.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import time
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from fedfraud.feature_store.schema import (
    CANONICAL_COLUMNS,
    COORDINATE_DECIMALS,
    MAX_TEXT_LEN,
    RejectReason,
    is_card_token,
    luhn_ok,
)

__all__ = [
    "LABEL_FIELDS",
    "MAX_DETAIL_CHARS",
    "NO_RAW_REASONS",
    "TRANSACTION_FIELDS",
    "DeadLetter",
    "dead_letter_of",
    "dlq_headers",
    "dlq_key",
    "dlq_message",
    "dlq_record",
    "dlq_value",
    "mask_payload",
    "mask_text",
    "payload_digest",
]

#: Fields a ``transactions-dlq`` record keeps of the rejected message: the canonical schema's.
TRANSACTION_FIELDS: tuple[str, ...] = CANONICAL_COLUMNS
#: Fields a ``fraud-labels-dlq`` record keeps (:func:`fedfraud.serving.labels.label_message`).
LABEL_FIELDS: tuple[str, ...] = ("transaction_id", "label", "labelled_at", "source")
#: Rejects whose payload is never kept, even with raw capture on: the payload is known to hold card data.
NO_RAW_REASONS = frozenset({RejectReason.CARD_NUMBER.value, RejectReason.UNTOKENIZED_CARD.value})
#: Rejects whose payload is not parsed here either (the consumer refused to parse it: too large).
_UNPARSED_REASONS = frozenset({RejectReason.OVERSIZED.value, "too_large"})
#: Longest reason detail written to the DLQ (value); the header keeps 256 bytes of it.
MAX_DETAIL_CHARS = 512
_MAX_HEADER_BYTES = 256
_COORDINATES = ("lat", "lon")


@dataclass(frozen=True)
class DeadLetter:
    """A message that could not be scored or joined, with the reason it goes to the DLQ.

    ``key`` and ``raw`` are the message as it came (in memory only): :func:`dlq_value`, :func:`dlq_key` and
    :func:`dlq_headers` decide what of it reaches the topic. ``fields`` are the canonical fields of the
    source topic kept in the DLQ record.
    """

    key: bytes | None
    raw: bytes
    reason: str
    detail: str
    topic: str
    partition: int
    offset: int
    fields: tuple[str, ...] = TRANSACTION_FIELDS


def dead_letter_of(msg: Any, reason: str, detail: str, fields: tuple[str, ...] = TRANSACTION_FIELDS,
                   raw: bytes | None = None) -> DeadLetter:
    """A dead letter of a consumer record (``key``, ``value``, ``topic``, ``partition``, ``offset``): one
    constructor for decode rejects and stage rejects, so neither can skip what :func:`dlq_value` does.
    """
    value = msg.value if raw is None else raw
    key = msg.key if isinstance(msg.key, bytes) or msg.key is None else bytes(msg.key)
    value = value if isinstance(value, bytes) else bytes(value or b"")
    return DeadLetter(key, value, reason, detail, msg.topic, msg.partition, msg.offset, fields)


# ---------------------------------------------------------------------------------------------------- masking
#: Digit groups joined by up to 3 separators (whitespace, ``-``, ``_``, ``.``, ``,``, ``/``, NUL: UTF-16/32
#: bytes read one byte per character). Letters do not stop a run from starting, so ``PAN4111…`` is one.
_CLUSTER = re.compile(r"[0-9]+(?:[\s\-_.,/\x00]{1,3}[0-9]+)*")
#: ``\uXXXX`` / ``\xNN`` escapes of ASCII characters (JSON text, a ``repr`` of bytes in a detail).
_ESCAPE = re.compile(r"\\(?:u00([0-7][0-9a-fA-F])|x([0-7][0-9a-fA-F]))")
#: Characters an escape is resolved to before masking (digits and separators); a NUL escape is dropped.
_RESOLVED = frozenset("0123456789 -_.,/")
_NOT_DIGIT, _A_DIGIT = re.compile(r"[^0-9]"), re.compile(r"[0-9]")
#: Another script's decimal digit (``\d`` matches every Unicode decimal digit in a str pattern).
_OTHER_DIGIT = re.compile(r"(?![0-9])\d")
_MIN_PAN, _MAX_PAN = 13, 19
#: A run of more digits than this is masked without a Luhn search (no identifier is that long); bounds the
#: search's cost on hostile input.
_LONG_RUN = 40
#: Characters of a text field or detail masked before it is cut to its limit: a run cut by the limit after this
#: margin holds more than :data:`_LONG_RUN` digits, so it is masked whole.
_CUT_MARGIN = 4 * (_LONG_RUN + 1)


def _resolve_escape(m: re.Match[str]) -> str:
    ch = chr(int(m.group(1) or m.group(2), 16))
    if ch == "\x00":
        return ""
    return ch if ch in _RESOLVED else m.group()


def _normalized(text: str) -> str:
    """``text`` with digit and separator escapes resolved, in NFKC, other scripts' digits as ASCII digits."""
    for _ in range(4):  # resolving one escape can complete another (``\u00\u00331``)
        if "\\" not in text:
            break
        text = _ESCAPE.sub(_resolve_escape, text)
    if not text.isascii():
        text = _OTHER_DIGIT.sub(lambda m: str(unicodedata.decimal(m.group())),
                                unicodedata.normalize("NFKC", text))
    return text


def _holds_card_number(digits: str) -> bool:
    """Any 13–19 consecutive digits of ``digits`` pass Luhn (always, for a run longer than :data:`_LONG_RUN`)."""
    n = len(digits)
    if n > _LONG_RUN:
        return True
    return any(luhn_ok(digits[i:i + size]) for size in range(_MIN_PAN, min(_MAX_PAN, n) + 1)
               for i in range(n - size + 1))


def _hide(run: str, luhn: bool) -> str:
    """``run`` with its digits masked but the last 4 when it holds 13+ digits (and, with ``luhn``, a card
    number by Luhn).
    """
    digits = _NOT_DIGIT.sub("", run)
    if len(digits) < _MIN_PAN or (luhn and not _holds_card_number(digits)):
        return run
    cut, kept = len(run), 0
    while kept < 4:  # the last 4 digits stay (a few characters back: runs end in a digit)
        cut -= 1
        kept += run[cut].isdigit()
    return _A_DIGIT.sub("*", run[:cut]) + run[cut:]


def mask_text(text: str) -> str:
    r"""``text`` with every digit run that may hold a card number masked but its last 4 digits.

    A run is digits joined by up to 3 separators (spaces, ``-``, ``_``, ``.``, ``,``, ``/``); it is masked
    when any 13–19 consecutive digits of it pass Luhn, so a card number glued to letters (``PAN4111…``),
    grouped in any of those ways, written as a float (``4111111111111111.0``) or inside a longer number is
    caught. ``\u0031``-style escapes are resolved and other scripts' digits read as ASCII first.
    """
    return _CLUSTER.sub(lambda m: _hide(m.group(), luhn=True), _normalized(text))


def _mask_cut(text: str, limit: int) -> str:
    """:func:`mask_text` of ``text`` cut to ``limit`` characters (masked before the cut, on a bounded prefix)."""
    return mask_text(_normalized(text)[:limit + _CUT_MARGIN])[:limit]


def _mask_all_runs(text: str) -> str:
    """``text`` with every run of 13+ digits masked but its last 4, Luhn or not: a payload can be megabytes,
    and over-masking it costs nothing (it is only hashed, or captured on an operator's opt-in).
    """
    return _CLUSTER.sub(lambda m: _hide(m.group(), luhn=False), _normalized(text))


def _decode_text(raw: bytes) -> str | None:
    """``raw`` as text when it is text: BOM-marked or JSON-detected UTF-8/16/32 (what ``json.loads`` accepts)."""
    try:
        return raw.decode(json.detect_encoding(raw))
    except (UnicodeDecodeError, LookupError):
        return None


def mask_payload(raw: bytes) -> bytes:
    """``raw`` with every run of 13+ digits (grouped as :func:`mask_text` reads them) masked but its last 4:
    text (UTF-8, UTF-16, UTF-32) is decoded, masked and written as UTF-8; other bytes are masked one byte per
    character, NUL bytes counting as separators (UTF-16 digits in binary).
    """
    text = _decode_text(raw)
    if text is not None:
        return _mask_all_runs(text).encode("utf-8", "surrogatepass")
    return _mask_all_runs(raw.decode("latin-1")).encode("latin-1", "replace")


def payload_digest(raw: bytes) -> str:
    """SHA-256 (hex) of ``raw`` masked (:func:`mask_payload`): the ``raw_sha256`` of its dead letter.

    An operator finds the message itself by the record's source topic, partition and offset; this digest
    confirms it is the same one without the DLQ keeping the bytes, and cannot be matched by hashing guessed
    card numbers (the masked digits are not in what is hashed).
    """
    return hashlib.sha256(mask_payload(raw)).hexdigest()


def dlq_key(key: bytes | None) -> bytes | None:
    """The DLQ key of a message key: a card token is kept, anything else replaced by ``sha256:`` + the
    digest of its masked bytes (a producer may key by card number, account or customer id).
    """
    if key is None:
        return None
    if key.isascii() and is_card_token(text := key.decode("ascii")) and mask_text(text) == text:
        return key
    return b"sha256:" + payload_digest(key).encode("ascii")


# ---------------------------------------------------------------------------------------------------- records
def _keep_last4(text: str) -> str:
    return "*" * max(len(text) - 4, 0) + text[-4:] if len(text) > 4 else "*" * len(text)


def _number(value: int | float) -> int | float | str:
    """A number as JSON writes it, or that text masked when it may hold a card number (``4.1e15`` included)."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    text = json.dumps(value)
    masked = mask_text(text)
    return value if masked == text else masked


def _kind(value: Any) -> str:
    """What a DLQ record keeps of a value it cannot keep: its JSON type."""
    return "<" + {dict: "object", list: "array", str: "string"}.get(type(value), type(value).__name__) + ">"


def _coordinate(value: Any) -> Any:
    """A coordinate rounded to the validator's precision; a value that is not a finite number is kept as its
    type only (text can spell an exact location).
    """
    if isinstance(value, bool) or value is None:
        return value
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        return _kind(value)
    return _number(round(x, COORDINATE_DECIMALS)) if math.isfinite(x) else _kind(value)


def _field(name: str, value: Any) -> Any:
    """One canonical field of a DLQ record, masked (module docstring)."""
    if name in _COORDINATES:
        return _coordinate(value)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, dict | list):
        return _kind(value)
    out = _mask_cut(value, MAX_TEXT_LEN) if isinstance(value, str) else _number(value)
    if name == "cardholder_id" and not is_card_token(out):  # the card's identity: a token, or its last 4 only
        return _keep_last4(out if isinstance(out, str) else json.dumps(out))
    return out


def dlq_record(value: dict[str, Any], fields: Sequence[str] = TRANSACTION_FIELDS) -> dict[str, Any]:
    """The masked, reduced record a DLQ keeps of a parsed message (module docstring): ``fields`` only."""
    return {name: _field(name, value[name]) for name in fields if name in value}


def _parse(raw: bytes) -> Any:
    """JSON of ``raw`` (UTF-8/16/32, BOM or not), or None when it is not JSON."""

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    try:
        return json.loads(raw, parse_constant=no_constant)
    except Exception:  # noqa: BLE001 - bad UTF-8, bad JSON, deep nesting (RecursionError), huge numbers
        return None


def _dumps(value: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(value)
    except (orjson.JSONEncodeError, TypeError):  # an integer beyond 64 bits, a lone surrogate
        return json.dumps(value, separators=(",", ":")).encode()


def dlq_value(dead: DeadLetter, max_payload_bytes: int = 64 * 1024, raw_capture: bool = False) -> bytes:
    """The DLQ record of ``dead`` (module docstring): reason, masked detail, source position, the masked
    canonical ``record`` (None when the payload is not a JSON object), ``raw_sha256`` and ``raw_bytes``.

    ``raw_capture`` (``serving.guards.dlq_raw_capture``) adds the masked payload, base64, cut to
    ``max_payload_bytes`` (``raw_truncated`` says so), unless the reason is in :data:`NO_RAW_REASONS`; the
    cap keeps a 10 MB poison message from making a DLQ record larger than the producer's request limit.
    """
    raw = dead.raw if isinstance(dead.raw, bytes) else bytes(dead.raw or b"")
    masked = mask_payload(raw)
    parsed = None if dead.reason in _UNPARSED_REASONS else _parse(raw)
    out: dict[str, Any] = {
        "reason": dead.reason,
        "detail": _mask_cut(dead.detail, MAX_DETAIL_CHARS),
        "topic": dead.topic,
        "partition": dead.partition,
        "offset": dead.offset,
        "record": dlq_record(parsed, dead.fields) if isinstance(parsed, dict) else None,
        "raw_bytes": len(raw),
        "raw_sha256": hashlib.sha256(masked).hexdigest(),
        "dead_lettered_us": time.time_ns() // 1000,
    }
    if raw_capture and dead.reason not in NO_RAW_REASONS:
        kept = masked[:max_payload_bytes]
        out["raw_b64"] = base64.b64encode(kept).decode("ascii")
        out["raw_truncated"] = len(kept) < len(masked)
    return _dumps(out)


def dlq_headers(dead: DeadLetter) -> list[tuple[str, bytes]]:
    """Headers of a DLQ record: tools filter on ``reason`` without decoding the value (detail masked)."""
    detail = _mask_cut(dead.detail, MAX_DETAIL_CHARS).encode("utf-8", "replace")[:_MAX_HEADER_BYTES]
    return [("reason", dead.reason.encode()), ("detail", detail)]


def dlq_message(dead: DeadLetter, max_payload_bytes: int = 64 * 1024,
                raw_capture: bool = False) -> tuple[bytes | None, bytes, list[tuple[str, bytes]]]:
    """``(key, value, headers)`` of the DLQ message of ``dead``: what every DLQ producer sends, so none can
    send a key, value or header that skipped the masking (:func:`dlq_key`, :func:`dlq_value`, :func:`dlq_headers`).
    """
    return dlq_key(dead.key), dlq_value(dead, max_payload_bytes, raw_capture), dlq_headers(dead)

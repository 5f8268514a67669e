"""Canonical transaction schema and validation: the only place rows are judged.

Every loader (CSV, parquet, Kafka message) maps its input onto the canonical
column names and hands the frame to :class:`Validator`. Rows that pass come
back with canonical dtypes; rows that fail come back in a rejects frame, one
:class:`RejectReason` per row, so nothing is silently dropped:
``len(accepted) + len(rejects) == len(input)`` always holds.

Validation is vectorised over a pandas frame, so the same code serves a
multi-GB CSV ingest (in chunks) and a Kafka micro-batch (a few hundred rows).
"""

from __future__ import annotations

import math
import re
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, cast

import numpy as np
import pandas as pd
import pyarrow as pa

__all__ = [
    "CANONICAL_COLUMNS",
    "DEMOGRAPHIC_COLUMNS",
    "DEMOGRAPHIC_SOURCE_COLUMNS",
    "demographics_of",
    "CARD_TOKEN_PREFIX",
    "CleanRows",
    "COORDINATE_DECIMALS",
    "MAX_AMOUNT",
    "MAX_TEXT_LEN",
    "REQUIRED_COLUMNS",
    "TEXT_COLUMNS",
    "ARROW_SCHEMA",
    "RejectReason",
    "Transaction",
    "ValidationResult",
    "Validator",
    "card_number_spans",
    "event_order",
    "event_order_of",
    "is_card_token",
    "luhn_ok",
    "mask_card_numbers",
    "mask_card_numbers_bytes",
    "frame_to_transactions",
    "transactions_to_frame",
]

#: Longest accepted value of any text field. Real ids are far shorter; a longer
#: value is a corrupt row or an attack on downstream stores.
MAX_TEXT_LEN = 256

#: Largest accepted amount. Far above any card authorisation, far below where
#: float arithmetic (rounding to cents, sums of spend) overflows to inf.
MAX_AMOUNT = 1e9

#: Accepted timestamps on every path (ingest and stream): POSIX 1970 .. 2100.
#: The stream can narrow this relative to the wall clock (``Validator(max_future_s=...)``).
MIN_EPOCH_S, MAX_EPOCH_S = 0, 4102444800

#: Decimal places of every coordinate on every path (ingest and stream): 0.01° is about 1.1 km. The validator
#: rounds to it, so no exact location is stored, streamed or featurized, and training and serving agree.
COORDINATE_DECIMALS = 2

#: The bank's keyed token of a card (:func:`fedfraud.feature_store.privacy.pseudonymize`): what the ingress schema
#: carries in ``cardholder_id`` instead of the card number.
CARD_TOKEN_PREFIX = "ct_"
_CARD_TOKEN = re.compile(r"ct_[0-9a-f]{32}")
#: A run of 13–19 digits, optionally grouped by single spaces or dashes, not glued to letters or digits (so not
#: a stretch of a hex id or of a card token) and not a decimal fraction; :func:`card_number_spans` keeps those
#: passing the Luhn check.
_DIGIT_RUN = re.compile(r"(?<![0-9A-Za-z.])[0-9](?:[ -]?[0-9]){12,18}(?![0-9A-Za-z])")


def is_card_token(value: object) -> bool:
    """True for a card token (``ct_`` + 32 hex digits), the only card identifier the stream accepts."""
    return isinstance(value, str) and _CARD_TOKEN.fullmatch(value) is not None


def luhn_ok(digits: str) -> bool:
    """Luhn checksum of a card number (digits only, 12–19 of them); filters random digit runs."""
    if not digits.isdigit() or not 12 <= len(digits) <= 19:
        return False
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def card_number_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of every card-number-looking run in ``text``: 13–19 digits passing Luhn."""
    spans = []
    for m in _DIGIT_RUN.finditer(text):
        digits = re.sub(r"[ -]", "", m.group())
        if 13 <= len(digits) <= 19 and luhn_ok(digits):
            spans.append(m.span())
    return spans


def mask_card_numbers(text: str) -> str:
    """``text`` with every card-number-looking run masked but its last 4 digits (PCI DSS display rule)."""
    spans = card_number_spans(text)
    if not spans:
        return text
    out, last = [], 0
    for start, end in spans:
        run = text[start:end]
        digits = [i for i, ch in enumerate(run) if ch.isdigit()]
        keep = set(digits[-4:])
        out.append(text[last:start])
        out.append("".join(ch if (i in keep or not ch.isdigit()) else "*" for i, ch in enumerate(run)))
        last = end
    out.append(text[last:])
    return "".join(out)


def mask_card_numbers_bytes(raw: bytes) -> bytes:
    """:func:`mask_card_numbers` on bytes (digits are ASCII in any encoding we accept; other bytes are kept)."""
    if len(raw) < 13:
        return raw
    text = raw.decode("latin-1")  # one byte per character, so spans map back exactly
    masked = mask_card_numbers(text)
    return raw if masked == text else masked.encode("latin-1")


TEXT_COLUMNS: tuple[str, ...] = ("transaction_id", "cardholder_id", "merchant_id", "mcc")
REQUIRED_COLUMNS: tuple[str, ...] = (
    "transaction_id",
    "cardholder_id",
    "merchant_id",
    "timestamp",
    "amount",
    "lat",
    "lon",
    "mcc",
)
#: Canonical columns in order. ``is_fraud`` is optional (nullable); ``geo_source``
#: says how lat/lon were obtained (``exact`` for Sparkov, see the TabFormer loader).
CANONICAL_COLUMNS: tuple[str, ...] = (*REQUIRED_COLUMNS, "is_fraud", "geo_source")

#: Optional cardholder columns of the Sparkov layouts (``dob``, ``gender``, ``city_pop``, ``job``): a bank that
#: holds them privately (``banks.<k>.private_features: [demographics]``) keeps them per cardholder beside its
#: transactions (:func:`demographics_of`); they never enter the canonical rows.
DEMOGRAPHIC_SOURCE_COLUMNS: tuple[str, ...] = ("dob", "gender", "city_pop", "job")
#: What is kept of them, one row per cardholder: birth date (days since 1970-01-01), 1.0 female / 0.0 male, city
#: population, a stable hash of the job title (the title itself is not kept).
DEMOGRAPHIC_COLUMNS: tuple[str, ...] = ("cardholder_id", "birth_day", "gender_f", "city_pop", "job_code")


def demographics_of(raw: pd.DataFrame, cardholder_id: pd.Series) -> pd.DataFrame:
    """The demographic columns of accepted rows (``raw`` aligned with ``cardholder_id``), one row per cardholder.

    Optional columns never reject a row (the transaction is valid without them): a value that does not parse
    (a date, a population below 0, a gender other than F/M, a blank job) becomes NaN.
    """
    n = len(cardholder_id)

    def text(name: str) -> pd.Series:
        col = raw[name] if name in raw else pd.Series([""] * n)
        return col.reset_index(drop=True).astype(str).str.strip()

    dob = pd.to_datetime(text("dob"), format="mixed", errors="coerce", utc=True)
    birth_day = ((dob - pd.Timestamp(0, tz="UTC")) / pd.Timedelta(days=1)).astype("float64")
    gender = text("gender").str.upper().map({"F": 1.0, "M": 0.0}).astype("float64")
    pop = pd.to_numeric(text("city_pop"), errors="coerce").astype("float64")
    pop = pop.where(pop >= 0)
    job = text("job").str.lower()
    job_code = job.map(lambda j: float(zlib.crc32(j.encode("utf-8")) % 65521) if j and j != "nan" else np.nan)
    frame = pd.DataFrame({"cardholder_id": cardholder_id.reset_index(drop=True).astype(str), "birth_day": birth_day,
                          "gender_f": gender, "city_pop": pop, "job_code": job_code.astype("float64")})
    return frame.drop_duplicates("cardholder_id", keep="first").reset_index(drop=True)


ARROW_SCHEMA = pa.schema(
    [
        ("transaction_id", pa.string()),
        ("cardholder_id", pa.string()),
        ("merchant_id", pa.string()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("amount", pa.float64()),
        ("lat", pa.float64()),
        ("lon", pa.float64()),
        ("mcc", pa.string()),
        ("is_fraud", pa.bool_()),
        ("geo_source", pa.string()),
    ]
)


class RejectReason(StrEnum):
    """Why a row was rejected. The value is the stable code written to reject files and the DLQ."""

    MISSING_FIELD = "missing_field"
    BAD_TIMESTAMP = "bad_timestamp"
    BAD_AMOUNT = "bad_amount"
    LAT_OUT_OF_RANGE = "lat_out_of_range"
    LON_OUT_OF_RANGE = "lon_out_of_range"
    DUPLICATE_ID = "duplicate_id"
    TEXT_TOO_LONG = "text_too_long"
    INVALID_UTF8 = "invalid_utf8"
    BAD_LABEL = "bad_label"
    BAD_TYPE = "bad_type"  # a JSON boolean, object or array where a number or a string belongs
    MALFORMED = "malformed"  # not a record at all (e.g. undecodable Kafka message)
    OVERSIZED = "oversized"  # a message larger than the configured cap, not parsed
    CONFLICTING_DUPLICATE = "conflicting_duplicate"  # a transaction_id reused with different content
    PROCESSING_ERROR = "processing_error"  # scoring raised for this record alone, after bounded retries
    CARD_NUMBER = "card_number_in_clear"  # a text field holds a card number (13–19 digits passing Luhn)
    UNTOKENIZED_CARD = "untokenized_card"  # the stream's cardholder_id must be the bank's card token


@dataclass(frozen=True, slots=True)
class Transaction:
    """One validated card transaction in canonical form."""

    transaction_id: str
    cardholder_id: str
    merchant_id: str
    timestamp: datetime
    amount: float
    lat: float
    lon: float
    mcc: str
    is_fraud: bool | None = None
    geo_source: str = "exact"

    def __post_init__(self) -> None:
        if self.timestamp.tzinfo is None:
            raise ValueError("Transaction.timestamp must be timezone-aware (UTC)")
        if not (-90.0 <= self.lat <= 90.0 and -180.0 <= self.lon <= 180.0):
            raise ValueError("Transaction lat/lon out of range")
        if not math.isfinite(self.amount) or self.amount < 0:
            raise ValueError("Transaction.amount must be finite and >= 0")

    @property
    def epoch_seconds(self) -> float:
        """Timestamp as POSIX seconds (UTC)."""
        return self.timestamp.timestamp()

    def to_record(self) -> dict[str, Any]:
        """JSON-friendly dict (ISO-8601 timestamp), the wire format of the ``transactions`` topic."""
        return {
            "transaction_id": self.transaction_id,
            "cardholder_id": self.cardholder_id,
            "merchant_id": self.merchant_id,
            "timestamp": self.timestamp.astimezone(UTC).isoformat(),
            "amount": self.amount,
            "lat": self.lat,
            "lon": self.lon,
            "mcc": self.mcc,
            "is_fraud": self.is_fraud,
            "geo_source": self.geo_source,
        }


@dataclass(frozen=True)
class ValidationResult:
    """Accepted rows (canonical dtypes) and rejected rows (``row``, ``reason``, ``detail``).

    ``row`` is the input's positional row number plus the ``row_offset`` given
    to :meth:`Validator.validate`, so a reject can be traced to its file line.
    """

    accepted: pd.DataFrame
    rejects: pd.DataFrame

    def __post_init__(self) -> None:
        missing = [c for c in CANONICAL_COLUMNS if c not in self.accepted.columns]
        if missing:
            raise ValueError(f"accepted frame lacks canonical columns {missing}")
        if list(self.rejects.columns[:3]) != ["row", "reason", "detail"]:
            raise ValueError("rejects frame must start with columns row, reason, detail")

    @property
    def n_input(self) -> int:
        return len(self.accepted) + len(self.rejects)


_TRUE = {"1", "true", "t", "yes", "y", "1.0"}
_FALSE = {"0", "false", "f", "no", "n", "0.0", ""}


def _all_str(series: pd.Series) -> bool:
    """True when every value is a ``str`` (no NaN/None/bytes): the common case that allows fast paths."""
    return series.dtype == object and pd.api.types.infer_dtype(series, skipna=False) == "string"


def _is_blank(series: pd.Series) -> pd.Series:
    if _all_str(series):
        values = series.tolist()
        blank = np.fromiter((not v or v.isspace() for v in values), dtype=bool, count=len(values))
        return pd.Series(blank, index=series.index)
    if series.dtype == object or pd.api.types.is_string_dtype(series):
        # Per value, not astype(str): astype decodes bytes and raised on non-UTF-8 input.
        empty = series.map(lambda v: isinstance(v, (str, bytes)) and not v.strip()).astype(bool)
        return series.isna() | empty
    return series.isna()


def _has_bad_utf8(series: pd.Series) -> pd.Series:
    """True where a value holds lone surrogates (undecodable bytes read with surrogateescape).

    Raw ``bytes`` values that are not UTF-8 count as well.
    """

    def bad(value: Any) -> bool:
        if isinstance(value, bytes):
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                return True
            return False
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return True
        return False

    if series.dtype != object:
        return pd.Series(False, index=series.index)
    if _all_str(series):
        # Fast path: UTF-8 encoding rejects every surrogate code point (paired or not),
        # so one encode of the joined text is clean exactly when every value is.
        try:
            "".join(series.tolist()).encode("utf-8")
            return pd.Series(False, index=series.index)
        except UnicodeEncodeError:
            pass
    return series.map(bad).astype(bool)


def _as_text(series: pd.Series) -> pd.Series:
    if _all_str(series):
        return series

    def conv(value: Any) -> Any:
        if isinstance(value, bytes):
            return value.decode("utf-8", errors="replace")
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return None
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        return str(value)

    return series.map(conv)


def _parse_timestamp(series: pd.Series) -> pd.Series:
    """Parse ISO-8601 strings, datetimes or POSIX seconds into UTC; unparseable → NaT."""
    if pd.api.types.is_datetime64_any_dtype(series):
        out = series if getattr(series.dt, "tz", None) is not None else series.dt.tz_localize("UTC")
        return out.dt.tz_convert("UTC")
    numeric = pd.to_numeric(series, errors="coerce")
    is_num = numeric.notna()
    result = pd.Series(pd.NaT, index=series.index, dtype="datetime64[us, UTC]")
    if is_num.any():
        secs = numeric[is_num]
        ok = secs.between(MIN_EPOCH_S, MAX_EPOCH_S)
        result.loc[secs[ok].index] = pd.to_datetime(secs[ok], unit="s", utc=True)
    rest = ~is_num & series.notna()
    if rest.any():
        parsed = pd.to_datetime(series[rest].astype(str), errors="coerce", utc=True, format="mixed")
        result.loc[rest] = parsed
    return result


def _parse_label(series: pd.Series) -> tuple[pd.Series, pd.Series]:
    """Return (nullable boolean labels, mask of unparseable labels)."""
    if series.isna().all():  # the stream's case: no labels at scoring time
        return pd.Series(pd.NA, index=series.index, dtype="boolean"), pd.Series(False, index=series.index)
    if pd.api.types.is_bool_dtype(series):
        return series.astype("boolean"), pd.Series(False, index=series.index)
    if _all_str(series):
        text = series
    else:
        text = series.map(lambda v: None if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))
    lowered = text.str.strip().str.lower()
    labels = pd.Series(pd.NA, index=series.index, dtype="boolean")
    labels[lowered.isin(_TRUE)] = True
    labels[lowered.isin(_FALSE - {""})] = False
    bad = text.notna() & ~lowered.isin(_TRUE | _FALSE)
    return labels, bad


class Validator:
    """Validates canonical-named frames, remembering transaction ids across calls.

    Args:
        dedupe: reject a transaction_id already seen by this validator (in this
            frame or an earlier one). Batch ingest wants this; a stream consumer
            handles redelivery idempotently downstream and may turn it off.
        max_future_s: reject timestamps more than this far ahead of ``clock()``
            (a live stream; None for historical files).
        max_age_days: reject timestamps more than this many days before ``clock()``.
        clock: wall-clock seconds (injectable for tests).
        card_tokens: the stream's ingress rules: ``cardholder_id`` must be a card token
            (:func:`is_card_token`), and a text field holding a card number is rejected
            (``card_number_in_clear``; the DLQ masks it). Ingest of the bank's own raw files leaves it off.
    """

    def __init__(
        self,
        dedupe: bool = True,
        max_future_s: float | None = None,
        max_age_days: float | None = None,
        clock: Callable[[], float] = time.time,
        card_tokens: bool = False,
    ) -> None:
        self.dedupe = dedupe
        self.card_tokens = card_tokens
        self.max_future_s = max_future_s
        self.max_age_days = max_age_days
        self.clock = clock
        self._seen: set[str] = set()

    def _window(self) -> tuple[float, float]:
        """Accepted POSIX seconds (lo, hi) right now: 1970..2100 narrowed by ``max_age_days``/``max_future_s``."""
        lo, hi = float(MIN_EPOCH_S), float(MAX_EPOCH_S)
        if self.max_future_s is not None or self.max_age_days is not None:
            now = self.clock()
            if self.max_future_s is not None:
                hi = min(hi, now + self.max_future_s)
            if self.max_age_days is not None:
                lo = max(lo, now - self.max_age_days * 86400)
        return lo, hi

    def validate(self, frame: pd.DataFrame, row_offset: int = 0) -> ValidationResult:
        """Judge every row of ``frame``; see the module docstring for the guarantees."""
        n = len(frame)
        frame = frame.reset_index(drop=True)
        # numpy, not Series, for the bookkeeping: ~26 checks run per call, and a Kafka micro-batch of 15 rows
        # paid ~15 ms of pandas overhead per call before (docs/benchmarks.md, serving)
        reason_arr = np.full(n, None, dtype=object)
        detail_arr = np.full(n, "", dtype=object)
        open_rows = np.ones(n, dtype=bool)  # no reason yet

        def flag(mask: pd.Series | np.ndarray, code: RejectReason, why: str | pd.Series) -> None:
            fresh = np.asarray(mask, dtype=bool) & open_rows
            if fresh.any():
                reason_arr[fresh] = code.value
                detail_arr[fresh] = why if isinstance(why, str) else np.asarray(why, dtype=object)[fresh]
                open_rows[fresh] = False

        for col in REQUIRED_COLUMNS:
            if col not in frame.columns:
                flag(pd.Series(True, index=frame.index), RejectReason.MISSING_FIELD, col)
            else:
                flag(_is_blank(frame[col]), RejectReason.MISSING_FIELD, col)

        text: dict[str, pd.Series] = {}
        for col in TEXT_COLUMNS:
            if col not in frame.columns:
                continue
            flag(_has_bad_utf8(frame[col]), RejectReason.INVALID_UTF8, col)
            text[col] = _as_text(frame[col])
            too_long = text[col].str.len().astype("float64") > MAX_TEXT_LEN  # None → NaN → False
            flag(too_long, RejectReason.TEXT_TOO_LONG, f"{col} longer than {MAX_TEXT_LEN}")
            if self.card_tokens:
                clear = text[col].map(lambda v: isinstance(v, str) and bool(card_number_spans(v)))
                flag(clear.to_numpy(dtype=bool), RejectReason.CARD_NUMBER, f"{col} holds a card number in clear")

        ts = _parse_timestamp(frame["timestamp"]) if "timestamp" in frame else None
        if ts is not None:
            flag(ts.isna(), RejectReason.BAD_TIMESTAMP, "unparseable timestamp")
            secs = (ts - pd.Timestamp(0, tz="UTC")) / pd.Timedelta(seconds=1)  # NaT → NaN
            flag(ts.notna() & ~secs.between(MIN_EPOCH_S, MAX_EPOCH_S), RejectReason.BAD_TIMESTAMP,
                 "timestamp outside 1970..2100")
            if self.max_future_s is not None or self.max_age_days is not None:
                now = self.clock()
                if self.max_future_s is not None:
                    flag(ts.notna() & (secs > now + self.max_future_s), RejectReason.BAD_TIMESTAMP,
                         f"timestamp more than {self.max_future_s:g} s in the future")
                if self.max_age_days is not None:
                    flag(ts.notna() & (secs < now - self.max_age_days * 86400), RejectReason.BAD_TIMESTAMP,
                         f"timestamp more than {self.max_age_days:g} days old")

        def numeric(col: str) -> pd.Series:
            if col not in frame:
                return pd.Series(np.nan, index=frame.index)
            return pd.to_numeric(frame[col], errors="coerce").astype(float)

        amount, lat, lon = numeric("amount"), numeric("lat"), numeric("lon")
        flag(amount.isna(), RejectReason.BAD_AMOUNT, "amount is not a number")
        flag(~np.isfinite(amount), RejectReason.BAD_AMOUNT, "amount is not finite")
        flag(amount < 0, RejectReason.BAD_AMOUNT, "amount is negative")
        flag(amount > MAX_AMOUNT, RejectReason.BAD_AMOUNT, f"amount above {MAX_AMOUNT:.0e}")
        flag(~lat.between(-90.0, 90.0), RejectReason.LAT_OUT_OF_RANGE, "lat must be in [-90, 90]")
        flag(~lon.between(-180.0, 180.0), RejectReason.LON_OUT_OF_RANGE, "lon must be in [-180, 180]")

        if "is_fraud" in frame.columns:
            labels, bad_label = _parse_label(frame["is_fraud"])
            flag(bad_label, RejectReason.BAD_LABEL, "is_fraud must be 0/1/true/false/yes/no")
        else:
            labels = pd.Series(pd.NA, index=frame.index, dtype="boolean")

        # last: a record with a more specific defect gets that reason (a card number in clear is caught first)
        if self.card_tokens and "cardholder_id" in text:
            untokenized = ~text["cardholder_id"].map(is_card_token).to_numpy(dtype=bool)
            flag(untokenized, RejectReason.UNTOKENIZED_CARD,
                 f"cardholder_id must be the bank's card token ({CARD_TOKEN_PREFIX} + 32 hex digits)")

        if self.dedupe and "transaction_id" in text:
            # An id is unique per card, not globally: card networks and generators (Sparkov with a fixed seed
            # reuses trans_num across cards) repeat ids across cardholders, and every state keyed by id
            # (ego-graph redelivery ring, decisions) lives per cardholder.
            ids = text["transaction_id"]
            if "cardholder_id" in text:
                ids = text["cardholder_id"].astype(str) + "\x1f" + ids.astype(str)
            ok_so_far = pd.Series(open_rows.copy(), index=frame.index)
            # Only rows that are otherwise valid compete for an id: a first occurrence
            # rejected for another reason must not make a later valid one a duplicate.
            dup_in_frame = ids[ok_so_far].duplicated(keep="first").reindex(ids.index, fill_value=False)
            # Membership per value, not Series.isin(set): isin copies the whole set into an
            # array on every call, which made a chunked ingest quadratic in the file size.
            seen = np.fromiter(map(self._seen.__contains__, ids.tolist()), dtype=bool, count=len(ids))
            dup_before = pd.Series(seen, index=ids.index) & ok_so_far
            flag(dup_in_frame | dup_before, RejectReason.DUPLICATE_ID, "transaction_id seen before for this cardholder")
            self._seen.update(ids[open_rows].tolist())

        ok = pd.Series(open_rows, index=frame.index)
        geo = frame["geo_source"] if "geo_source" in frame else pd.Series("exact", index=frame.index)
        accepted = pd.DataFrame(
            {
                "transaction_id": text.get("transaction_id", pd.Series(dtype=object))[ok],
                "cardholder_id": text.get("cardholder_id", pd.Series(dtype=object))[ok],
                "merchant_id": text.get("merchant_id", pd.Series(dtype=object))[ok],
                "timestamp": ts[ok] if ts is not None else pd.Series(dtype="datetime64[us, UTC]"),
                "amount": amount[ok].round(2),
                "lat": lat[ok].round(COORDINATE_DECIMALS),
                "lon": lon[ok].round(COORDINATE_DECIMALS),
                "mcc": text.get("mcc", pd.Series(dtype=object))[ok],
                "is_fraud": labels[ok],
                "geo_source": geo[ok].fillna("exact").astype(str),
            }
        ).reset_index(drop=True)
        accepted["timestamp"] = accepted["timestamp"].astype("datetime64[us, UTC]")
        bad = ~open_rows
        rejects = pd.DataFrame(
            {
                "row": (np.flatnonzero(bad) + row_offset).astype("int64"),
                "reason": reason_arr[bad].astype(str),
                "detail": detail_arr[bad].astype(str),
            }
        )
        assert len(accepted) + len(rejects) == n
        return ValidationResult(accepted=accepted, rejects=rejects)

    def clean_rows(self, records: Sequence[Any]) -> CleanRows | None:
        """The cleaned values of a small batch in which no rule can reject a record, else None.

        The stream's fast path (no dedupe, at most ``FAST_PATH_MAX_ROWS`` records, every one clean): the caller
        can compute what it needs per record before :meth:`CleanRows.frame` builds the canonical frame once.
        None means the frame path (:meth:`validate_records`) must judge the batch.
        """
        if self.dedupe or not 0 < len(records) <= FAST_PATH_MAX_ROWS:
            return None
        return _clean_records(records, self._window(), self.card_tokens)

    def validate_records(self, records: Sequence[Mapping[str, Any]], row_offset: int = 0) -> ValidationResult:
        """Validate dict records (e.g. decoded JSON messages) with the same rules as frames.

        JSON types are judged first, per record: a boolean, object or array
        where a number or a string belongs is ``bad_type`` (pandas would turn
        ``true`` into 1.0 and ``{"a": 1}`` into a string), and a number that is
        not finite is ``bad_amount``/``lat_out_of_range``/... before any
        arithmetic can overflow on it.
        """
        clean = self.clean_rows(records)
        if clean is not None:  # every record clean and of the common JSON types: no rule can reject one
            return ValidationResult(accepted=clean.frame(), rejects=_NO_REJECTS)
        typed: list[Mapping[str, Any]] = []
        kept: list[int] = []
        early: list[tuple[int, str, str]] = []
        for i, record in enumerate(records):
            problem = _json_type_problem(record)
            if problem is None:
                typed.append(record)
                kept.append(i)
            else:
                early.append((i + row_offset, problem[0].value, problem[1]))
        frame = pd.DataFrame.from_records(
            [{c: r.get(c) for c in CANONICAL_COLUMNS} for r in typed], columns=list(CANONICAL_COLUMNS)
        )
        result = self.validate(frame, row_offset=0)
        if not early:
            if row_offset:
                rejects = result.rejects.assign(row=result.rejects["row"] + row_offset)
                return ValidationResult(accepted=result.accepted, rejects=rejects)
            return result
        index = np.asarray(kept, dtype=np.int64) + row_offset
        late = result.rejects.assign(row=index[result.rejects["row"].to_numpy(dtype=np.int64)])
        first = pd.DataFrame(early, columns=["row", "reason", "detail"]).astype({"row": "int64"})
        rejects = pd.concat([first, late], ignore_index=True).sort_values("row", kind="stable").reset_index(drop=True)
        return ValidationResult(accepted=result.accepted, rejects=rejects)


#: Largest record batch :meth:`Validator.validate_records` judges one record at a time in plain Python
#: (the stream's micro-batches at low load); larger ones, and any batch with a record that is not clean,
#: take the vectorised frame path. The two agree on every clean batch (tests/unit/test_schema_fast_path.py).
FAST_PATH_MAX_ROWS = 64

#: A timestamp the fast path parses itself: ISO-8601 date and time, optional fraction and UTC offset.
_ISO_RE = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})?")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


def _clean_text(value: Any) -> str | None:
    """``value`` as the frame path's text, when it is a clean id (non-blank, UTF-8, short); else None."""
    if isinstance(value, str):
        text = value
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) < 10**20:
        text = str(value)
    else:
        return None
    if not text or text.isspace() or len(text) > MAX_TEXT_LEN:
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (JSON "\ud800")
        return None
    return text


def _clean_number(value: Any, lo: float, hi: float) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, int) and abs(value) > 10**15:  # the frame path's own range check; float() may overflow
            return None
        number = float(value)
        if lo <= number <= hi:  # NaN fails both comparisons
            return number
    return None


def _clean_timestamp(value: Any, lo: float, hi: float) -> tuple[int, datetime] | None:
    """(µs since the epoch, UTC datetime) of an ISO-8601 string inside [lo, hi] seconds; None for anything else."""
    if not isinstance(value, str) or _ISO_RE.fullmatch(value) is None:
        return None
    try:
        stamp = datetime.fromisoformat(value)
        stamp = stamp.replace(tzinfo=UTC) if stamp.tzinfo is None else stamp.astimezone(UTC)
    except (ValueError, OverflowError):  # OverflowError: year 1 with a positive offset
        return None
    us = (stamp - _EPOCH) // _US
    return (us, stamp) if lo * 1e6 <= us <= hi * 1e6 else None


_LABELS = {None: None, True: True, False: False}  # 1 == True and 0 == False: the ints map alike


@dataclass(frozen=True, slots=True)
class CleanRows:
    """The canonical values of a batch of clean records, per column, before any frame exists.

    A micro-batch's consumer derives per-row facts (content hashes, event order, in-batch copies) from these
    plain values and then builds the frame once, already in the order it wants; reading them back out of a
    frame cost more than building it. :meth:`values` gives what ``frame[column].tolist()`` would.
    """

    text: dict[str, list[str]]  # TEXT_COLUMNS
    stamps_us: list[int]
    stamps: list[datetime]  # UTC, the same instants as stamps_us (their str is the frame's Timestamps' str)
    numbers: dict[str, np.ndarray]  # amount, lat, lon: float64, rounded as the frame path rounds them
    is_fraud: list[bool | None]
    geo_source: list[str]

    def __len__(self) -> int:
        return len(self.stamps_us)

    def values(self, column: str) -> list[Any]:
        """Column values as Python objects, equal (and equal in ``str``) to the accepted frame's ``tolist()``
        (``is_fraud``: None where the frame has ``pd.NA``).
        """
        if column in self.text:
            return self.text[column]
        if column in self.numbers:
            return self.numbers[column].tolist()
        if column == "timestamp":
            return self.stamps
        if column == "is_fraud":
            return self.is_fraud
        if column == "geo_source":
            return self.geo_source
        raise KeyError(column)

    def frame(self, rows: Sequence[int] | None = None) -> pd.DataFrame:
        """The accepted frame of the batch, or of ``rows`` (positions, in that order) only.

        One ``pd.DataFrame`` construction from typed arrays (public API only: a faster build through pandas'
        block internals saved ~130 µs per micro-batch but would break silently on a pandas upgrade).
        tests/unit/test_schema_fast_path.py checks the result equals the frame path's.
        """

        def pick(values: list[Any]) -> list[Any]:
            return values if rows is None else [values[i] for i in rows]

        n = len(self) if rows is None else len(rows)
        index = None if rows is None else np.asarray(rows, dtype=np.intp)
        labels = pick(self.is_fraud)
        columns: dict[str, Any] = {}
        for c in CANONICAL_COLUMNS:
            if c in self.text:
                columns[c] = np.asarray(pick(self.text[c]), dtype=object)
            elif c == "geo_source":
                columns[c] = np.asarray(pick(self.geo_source), dtype=object)
            elif c in self.numbers:
                columns[c] = self.numbers[c] if index is None else self.numbers[c][index]
            elif c == "timestamp":
                columns[c] = pd.DatetimeIndex(np.asarray(pick(self.stamps_us), dtype="datetime64[us]"), tz="UTC")
            elif c == "is_fraud":
                columns[c] = pd.arrays.BooleanArray(np.fromiter((v is True for v in labels), dtype=bool, count=n),
                                                    np.fromiter((v is None for v in labels), dtype=bool, count=n))
        return pd.DataFrame(columns, columns=_COLUMNS, copy=False)


_COLUMNS = pd.Index(CANONICAL_COLUMNS)


def _clean_records(records: Sequence[Any], window: tuple[float, float], card_tokens: bool = False) -> CleanRows | None:
    """The canonical values of ``records`` when every one is clean, else None (then the frame path judges them).

    Clean means a JSON object whose fields are of the common types, with no
    value any rule of :meth:`Validator.validate` would reject: the same
    canonical frame comes out, without ~15 ms of pandas fixed cost per call.
    """
    lo, hi = window
    text: dict[str, list[str]] = {c: [] for c in TEXT_COLUMNS}
    stamps_us: list[int] = []
    stamps: list[datetime] = []
    numbers: dict[str, list[float]] = {"amount": [], "lat": [], "lon": []}
    is_fraud: list[bool | None] = []
    geo_source: list[str] = []
    for record in records:
        if not isinstance(record, Mapping):
            return None
        texts = [_clean_text(record.get(c)) for c in TEXT_COLUMNS]
        stamp = _clean_timestamp(record.get("timestamp"), lo, hi)
        amount = _clean_number(record.get("amount"), 0.0, MAX_AMOUNT)
        lat = _clean_number(record.get("lat"), -90.0, 90.0)
        lon = _clean_number(record.get("lon"), -180.0, 180.0)
        label = record.get("is_fraud")
        geo = record.get("geo_source")
        if (None in texts or stamp is None or amount is None or lat is None or lon is None
                or type(label) not in (type(None), bool, int) or label not in _LABELS
                or not (geo is None or isinstance(geo, str))):
            return None
        clean_texts = cast("list[str]", texts)  # `None in texts` was ruled out above
        if card_tokens and (not is_card_token(clean_texts[1]) or any(card_number_spans(t) for t in clean_texts)):
            return None
        for c, value in zip(TEXT_COLUMNS, clean_texts, strict=True):
            text[c].append(value)
        stamps_us.append(stamp[0])
        stamps.append(stamp[1])
        numbers["amount"].append(amount)
        numbers["lat"].append(lat)
        numbers["lon"].append(lon)
        is_fraud.append(_LABELS[label])
        geo_source.append("exact" if geo is None else geo)
    decimals = {"amount": 2, "lat": COORDINATE_DECIMALS, "lon": COORDINATE_DECIMALS}
    rounded = {c: np.round(np.asarray(v, dtype=np.float64), decimals[c]) for c, v in numbers.items()}  # as Series.round
    return CleanRows(text, stamps_us, stamps, rounded, is_fraud, geo_source)


#: The rejects frame of a batch with none. Shared by every such result: callers only read rejects frames
#: (``assign`` / ``concat`` make new ones), and building it cost ~40 µs per micro-batch.
_NO_REJECTS = pd.DataFrame({"row": np.zeros(0, dtype=np.int64), "reason": np.zeros(0, dtype=object),
                            "detail": np.zeros(0, dtype=object)})


_NUMERIC_FIELDS: dict[str, RejectReason] = {
    "amount": RejectReason.BAD_AMOUNT,
    "lat": RejectReason.LAT_OUT_OF_RANGE,
    "lon": RejectReason.LON_OUT_OF_RANGE,
}


def _json_type_problem(record: Any) -> tuple[RejectReason, str] | None:
    """Why a decoded JSON record cannot be a transaction by its types alone, else None."""
    if not isinstance(record, Mapping):
        return RejectReason.MALFORMED, f"{type(record).__name__}, expected an object"
    for col in (*TEXT_COLUMNS, "timestamp", "geo_source"):
        value = record.get(col)
        if isinstance(value, (bool, dict, list)):
            return RejectReason.BAD_TYPE, f"{col} is a JSON {_json_name(value)}"
        if isinstance(value, float) and not math.isfinite(value):
            return RejectReason.BAD_TYPE, f"{col} is a non-finite number"
        if isinstance(value, int) and abs(value) >= 10**20:
            return RejectReason.BAD_TYPE, f"{col} is an integer of {len(str(abs(value)))} digits"
    for col, reason in _NUMERIC_FIELDS.items():
        value = record.get(col)
        if isinstance(value, (bool, dict, list)):
            return RejectReason.BAD_TYPE, f"{col} is a JSON {_json_name(value)}"
        if isinstance(value, int) and abs(value) > 10**15:
            return reason, f"{col} out of range ({len(str(abs(value)))}-digit integer)"
        if isinstance(value, float) and not math.isfinite(value):
            return reason, f"{col} is not finite"
    label = record.get("is_fraud")
    if isinstance(label, (dict, list)):
        return RejectReason.BAD_TYPE, f"is_fraud is a JSON {_json_name(label)}"
    return None


def _json_name(value: Any) -> str:
    return {bool: "boolean", dict: "object", list: "array"}.get(type(value), type(value).__name__)


def event_order(frame: pd.DataFrame) -> np.ndarray | None:
    """Positions of ``frame``'s rows in event order (timestamp, then transaction_id; stable), or None when the
    rows already are in that order (a Kafka partition's usual case, which then costs no reindexing).
    """
    if len(frame) <= 256:  # plain Python beats pandas' fixed cost on a micro-batch
        order = event_order_of(frame["timestamp"].tolist(), frame["transaction_id"].tolist())
        return None if order is None else np.asarray(order, dtype=np.int64)
    ranked = frame.reset_index(drop=True).sort_values(["timestamp", "transaction_id"], kind="stable")
    order_arr = ranked.index.to_numpy()
    return None if np.array_equal(order_arr, np.arange(len(frame))) else order_arr


def event_order_of(stamps: Sequence[Any], ids: Sequence[Any]) -> list[int] | None:
    """:func:`event_order` of rows given by their timestamps (any ordered type: Timestamps, µs) and ids."""
    keys = list(zip(stamps, ids, strict=True))
    order = sorted(range(len(keys)), key=keys.__getitem__)
    return None if order == list(range(len(keys))) else order


def frame_to_transactions(frame: pd.DataFrame) -> list[Transaction]:
    """Turn an *accepted* canonical frame into :class:`Transaction` objects."""
    out: list[Transaction] = []
    for row in frame.itertuples(index=False):
        label = row.is_fraud
        out.append(
            Transaction(
                transaction_id=row.transaction_id,
                cardholder_id=row.cardholder_id,
                merchant_id=row.merchant_id,
                timestamp=row.timestamp.to_pydatetime(),
                amount=float(row.amount),
                lat=float(row.lat),
                lon=float(row.lon),
                mcc=row.mcc,
                is_fraud=None if label is pd.NA or label is None else bool(label),
                geo_source=row.geo_source,
            )
        )
    return out


def transactions_to_frame(transactions: Iterable[Transaction]) -> pd.DataFrame:
    """Inverse of :func:`frame_to_transactions`, with canonical dtypes."""
    records = [t.to_record() for t in transactions]
    frame = pd.DataFrame.from_records(records, columns=list(CANONICAL_COLUMNS))
    frame["timestamp"] = pd.to_datetime(frame["timestamp"], utc=True).astype("datetime64[us, UTC]")
    frame["is_fraud"] = frame["is_fraud"].astype("boolean")
    return frame

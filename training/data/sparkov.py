"""Loader (and writer) for Sparkov-generated transactions: the Kaggle ``fraudTrain.csv`` and pipe layouts.

Both layouts carry everything the canonical schema needs, including the
merchant's coordinates, so every row gets ``geo_source = "exact"``. The
cardholder's home ``state`` travels alongside as the region hint used by
region partitioning; it is not part of the canonical output.

Timestamps: the date/time text (``trans_date_trans_time`` or ``trans_date`` +
``trans_time``) wins over ``unix_time`` when both are present, because the
published Kaggle file's ``unix_time`` is shifted by about seven years from its
own dates. Sparkov writes naive local times; they are read as UTC.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pa_csv

from fedfraud.feature_store.schema import CANONICAL_COLUMNS, DEMOGRAPHIC_SOURCE_COLUMNS
from fedfraud.training.data.csvio import REGION_HINT, CsvHeader, RawChunk, iter_csv
from fedfraud.training.data.geo import GEO_EXACT

__all__ = [
    "FORMAT_NAME",
    "KAGGLE_COLUMNS",
    "PIPE_COLUMNS",
    "epoch_or_text",
    "matches",
    "read_chunks",
    "to_canonical",
    "write_sparkov_csv",
]

logger = logging.getLogger(__name__)

FORMAT_NAME = "sparkov"

#: Kaggle "fraudTrain.csv": a leading unnamed index column, comma-separated.
KAGGLE_COLUMNS: tuple[str, ...] = (
    "_index", "trans_date_trans_time", "cc_num", "merchant", "category", "amt", "first", "last", "gender",
    "street", "city", "state", "zip", "lat", "long", "city_pop", "job", "dob", "trans_num", "unix_time",
    "merch_lat", "merch_long", "is_fraud",
)  # fmt: skip
#: The Sparkov generator's own output, pipe-delimited.
PIPE_COLUMNS: tuple[str, ...] = (
    "ssn", "cc_num", "first", "last", "gender", "street", "city", "state", "zip", "lat", "long", "city_pop",
    "job", "dob", "acct_num", "profile", "trans_num", "trans_date", "trans_time", "unix_time", "category", "amt",
    "is_fraud", "merchant", "merch_lat", "merch_long",
)  # fmt: skip

_ALWAYS = ("cc_num", "merchant", "category", "amt", "trans_num", "merch_lat", "merch_long")
_RENAME = {
    "trans_num": "transaction_id",
    "cc_num": "cardholder_id",
    "merchant": "merchant_id",
    "amt": "amount",
    "merch_lat": "lat",
    "merch_long": "lon",
    "category": "mcc",
}
_DATETIME_FORMAT = "%Y-%m-%d %H:%M:%S"
_EPOCH = pd.Timestamp(0, tz="UTC")


def _time_source(columns: Sequence[str]) -> str | None:
    cols = set(columns)
    if "trans_date_trans_time" in cols:
        return "trans_date_trans_time"
    if {"trans_date", "trans_time"} <= cols:
        return "trans_date+trans_time"
    if "unix_time" in cols:
        return "unix_time"
    return None


def matches(columns: Sequence[str]) -> bool:
    """True when a header has the Sparkov columns the canonical schema needs."""
    return set(_ALWAYS) <= set(columns) and _time_source(columns) is not None


def epoch_or_text(text: pd.Series, fmt: str) -> pd.Series:
    """Replace well-formed ``fmt`` timestamps by POSIX seconds; keep anything else as the raw text.

    A fixed-format parse is ~50x faster than the validator's general
    ``format="mixed"`` parser; values that do not fit the format stay as
    text, so the validator still judges them (and rejects them as
    ``bad_timestamp`` if they are not timestamps at all).
    """
    parsed = pd.to_datetime(text, format=fmt, errors="coerce", utc=True)
    ok = parsed.notna().to_numpy()
    out = text.astype(object).copy()
    if ok.any():
        seconds = (parsed[ok] - _EPOCH) // pd.Timedelta(seconds=1)
        out[ok] = seconds.astype("int64").to_numpy()
    return out


def to_canonical(raw: pd.DataFrame) -> pd.DataFrame:
    """Map a text frame in either Sparkov layout onto canonical names (+ the ``home_state`` hint and, when the file
    has them, the demographic columns ``dob``, ``gender``, ``city_pop``, ``job`` under their own names).
    """
    source = _time_source(list(raw.columns))
    if source == "trans_date_trans_time":
        timestamp = epoch_or_text(raw["trans_date_trans_time"], _DATETIME_FORMAT)
    elif source == "trans_date+trans_time":
        date, time = raw["trans_date"], raw["trans_time"]
        joined = (date + " " + time).where((date != "") & (time != ""), "")
        timestamp = epoch_or_text(joined, _DATETIME_FORMAT)
    else:
        timestamp = raw["unix_time"]
    frame = raw[list(_RENAME)].rename(columns=_RENAME)
    frame["timestamp"] = timestamp
    frame["is_fraud"] = raw["is_fraud"] if "is_fraud" in raw else None
    frame["geo_source"] = GEO_EXACT
    frame = frame[list(CANONICAL_COLUMNS)]
    frame[REGION_HINT] = raw["state"].str.strip().str.upper() if "state" in raw else ""
    for name in DEMOGRAPHIC_SOURCE_COLUMNS:  # optional private columns, beside the canonical ones (not judged)
        if name in raw:
            frame[name] = raw[name]
    return frame


def read_chunks(header: CsvHeader, chunk_rows: int, progress: bool = True) -> Iterator[RawChunk]:
    """Stream a Sparkov CSV as canonical-named text chunks (validation is the caller's job)."""
    logger.info("sparkov file=%s delimiter=%r time_source=%s", header.path, header.delimiter,
                _time_source(header.columns))
    wanted = [c for c in (*_RENAME, "trans_date_trans_time", "trans_date", "trans_time", "unix_time", "is_fraud",
                          "state", *DEMOGRAPHIC_SOURCE_COLUMNS) if c in header.columns]
    for chunk in iter_csv(header, chunk_rows, usecols=wanted, desc=f"ingest {header.path.name}", progress=progress):
        yield RawChunk(frame=to_canonical(chunk.frame), rows=chunk.rows)


def _write_csv(frame: pd.DataFrame, path: Path, sep: str, append: bool) -> None:
    """Arrow's C++ CSV writer (~10x pandas) for clean frames; pandas for anything Arrow refuses.

    Arrow refuses mixed-type columns and lone surrogates, which only planted
    bad values produce; those small frames take the slower pandas path.
    """
    try:
        table = pa.Table.from_pandas(frame, preserve_index=False)
    except (pa.ArrowException, UnicodeEncodeError):
        frame.to_csv(path, sep=sep, index=False, header=not append, mode="a" if append else "w",
                     encoding="utf-8", errors="surrogateescape")
        return
    body = io.BytesIO()
    for quoting in ("none", "needed"):  # unquoted like Sparkov itself, unless a value needs quotes
        try:
            pa_csv.write_csv(table, body, pa_csv.WriteOptions(include_header=False, delimiter=sep,
                                                              quoting_style=quoting))
            break
        except pa.ArrowInvalid:
            body = io.BytesIO()
    with path.open("ab" if append else "wb") as fh:
        if not append:
            fh.write((sep.join(frame.columns) + "\n").encode("utf-8"))
        fh.write(body.getvalue())


def write_sparkov_csv(
    frame: pd.DataFrame, path: Path, layout: Literal["pipe", "kaggle"] = "pipe", append: bool = False
) -> Path:
    """Write a frame with the pipe-layout column names as a Sparkov CSV in either layout.

    Used by the generator (``DIR/raw/transactions.csv``), tests and
    benchmarks. Values are written verbatim (strings stay strings, lone
    surrogates become the original bytes), so tests can plant bad values.
    Columns missing from ``frame`` are written empty. The Kaggle layout's
    index column is the frame's index. ``append`` adds rows without a header,
    so a large file can be written chunk by chunk.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = frame.reindex(columns=list(PIPE_COLUMNS))
    if layout == "kaggle":
        date, time = out["trans_date"].fillna("").astype(str), out["trans_time"].fillna("").astype(str)
        out = out.assign(trans_date_trans_time=(date + " " + time).str.strip(), _index=frame.index)
        out = out[list(KAGGLE_COLUMNS)].rename(columns={"_index": ""})
    elif layout != "pipe":
        raise ValueError(f"unknown Sparkov layout {layout!r}; use 'pipe' or 'kaggle'")
    _write_csv(out, path, "|" if layout == "pipe" else ",", append)
    return path

"""Loader for the IBM TabFormer credit-card CSV (``card_transaction.v1.csv``).

TabFormer has no coordinates and no transaction id, so this loader derives
both, and flags how (``geo_source``):

* ``city``: (``Merchant City``, ``Merchant State``) is in the shipped city table;
* ``state_centroid``: only the US state is known, placed at its centroid;
* ``online``: ``Merchant City == "ONLINE"``;
* ``unknown``: neither city nor a US state is known (typically a foreign
  country in ``Merchant State``).

``online`` and ``unknown`` rows are placed at the centroid of the cardholder's
*home state*, else at :data:`~fedfraud.training.data.geo.US_CENTER`. The home state is
the US state where the cardholder made most physical purchases over the
whole file (ties: alphabetical), found in a cheap pre-pass over four
columns. Whole-file rather than "seen so far" keeps the result independent
of the chunk size, and it is the same state region partitioning uses; it
stands in for the billing address a bank knows anyway, so it leaks nothing a
bank would not have. Never (0, 0): "null island" would look like a real,
extremely far away place to the location encoder.

``transaction_id`` is ``blake2b(user|card|row)`` (16 hex chars), where row is
the 0-based data-row number: deterministic for a given file, and the same
transaction in the same file always gets the same id. ``Amount`` keeps its
sign (refunds are negative) so validation rejects them visibly.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator, Sequence

import numpy as np
import pandas as pd

from fedfraud.feature_store.schema import CANONICAL_COLUMNS
from fedfraud.training.data.csvio import REGION_HINT, CsvHeader, RawChunk, iter_csv
from fedfraud.training.data.geo import (
    GEO_CITY, GEO_ONLINE, GEO_STATE, GEO_UNKNOWN, US_CENTER, geo_tables, normalize_place,
)
from fedfraud.training.data.sparkov import epoch_or_text

__all__ = ["COLUMNS", "FORMAT_NAME", "home_states", "matches", "read_chunks", "to_canonical"]

logger = logging.getLogger(__name__)

FORMAT_NAME = "tabformer"

COLUMNS: tuple[str, ...] = (
    "User", "Card", "Year", "Month", "Day", "Time", "Amount", "Use Chip", "Merchant Name", "Merchant City",
    "Merchant State", "Zip", "MCC", "Errors?", "Is Fraud?",
)  # fmt: skip
_REQUIRED = ("User", "Card", "Year", "Month", "Day", "Time", "Amount", "Merchant Name", "Merchant City",
             "Merchant State", "MCC")
_DATETIME_FORMAT = "%Y-%m-%d %H:%M"
_ONLINE = "ONLINE"
_UNUSED = ("Use Chip", "Zip", "Errors?")  # not canonical; not materialised


def matches(columns: Sequence[str]) -> bool:
    """True when a header has the TabFormer columns the loader needs."""
    return set(_REQUIRED) <= set(columns)


def _strip(raw: pd.DataFrame, col: str) -> pd.Series:
    return raw[col].astype(str).str.strip() if col in raw else pd.Series("", index=raw.index)


def _cardholder_ids(raw: pd.DataFrame) -> pd.Series:
    user, card = _strip(raw, "User"), _strip(raw, "Card")
    return (user + "-" + card).where((user != "") & (card != ""), "")


def _physical_states(raw: pd.DataFrame) -> pd.Series:
    """Upper-cased US state of each physical (not online) purchase, "" elsewhere."""
    state = _strip(raw, "Merchant State").str.upper()
    online = normalize_place(raw["Merchant City"]) == _ONLINE
    return state.where(geo_tables().is_state(state) & ~online, "")


def home_states(header: CsvHeader, chunk_rows: int, progress: bool = True) -> pd.Series:
    """Pre-pass: each cardholder's home state (most physical purchases; ties alphabetical).

    Returns a Series indexed by cardholder_id; cardholders with no physical
    US purchase are absent.
    """
    cols = ["User", "Card", "Merchant City", "Merchant State"]
    counts: pd.Series | None = None
    for chunk in iter_csv(header, chunk_rows, usecols=cols, desc=f"home states {header.path.name}",
                          progress=progress):
        frame = pd.DataFrame({"cardholder": _cardholder_ids(chunk.frame), "state": _physical_states(chunk.frame)})
        frame = frame[(frame["cardholder"] != "") & (frame["state"] != "")]
        size = frame.groupby(["cardholder", "state"]).size()
        counts = size if counts is None else counts.add(size, fill_value=0)
    if counts is None or counts.empty:
        return pd.Series(dtype=object)
    table = counts.rename("n").reset_index().sort_values(["cardholder", "n", "state"], ascending=[True, False, True])
    home = table.drop_duplicates("cardholder").set_index("cardholder")["state"]
    logger.info("tabformer home_states cardholders=%d", len(home))
    return home


def _transaction_ids(raw: pd.DataFrame, rows: np.ndarray) -> list[str]:
    users, cards = _strip(raw, "User").tolist(), _strip(raw, "Card").tolist()
    return [
        hashlib.blake2b(f"{u}|{c}|{r}".encode("utf-8", "surrogateescape"), digest_size=8).hexdigest()
        for u, c, r in zip(users, cards, rows.tolist(), strict=True)
    ]


def _timestamps(raw: pd.DataFrame) -> pd.Series:
    parts = [_strip(raw, c) for c in ("Year", "Month", "Day", "Time")]
    year, month, day, time = parts
    text = year + "-" + month.str.zfill(2) + "-" + day.str.zfill(2) + " " + time
    complete = np.logical_and.reduce([(p != "").to_numpy() for p in parts])
    return epoch_or_text(text.where(complete, ""), _DATETIME_FORMAT)


def _geo(raw: pd.DataFrame, home: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lat, lon, geo_source) for each row, following the treatments in the module docstring."""
    tables = geo_tables()
    city, state = raw["Merchant City"], _strip(raw, "Merchant State").str.upper()
    online = (normalize_place(city) == _ONLINE).to_numpy()
    city_lat, city_lon = tables.city_centres(city, state)
    st_lat, st_lon = tables.state_centroids(state)
    home_lat, home_lon = tables.state_centroids(home)
    home_lat = np.where(np.isnan(home_lat), US_CENTER[0], home_lat)
    home_lon = np.where(np.isnan(home_lon), US_CENTER[1], home_lon)
    has_city = ~online & ~np.isnan(city_lat)
    has_state = ~online & ~has_city & ~np.isnan(st_lat)
    conditions = [online, has_city, has_state]
    source = np.select(conditions, [GEO_ONLINE, GEO_CITY, GEO_STATE], GEO_UNKNOWN)
    lat = np.select(conditions, [home_lat, city_lat, st_lat], home_lat)
    lon = np.select(conditions, [home_lon, city_lon, st_lon], home_lon)
    return lat, lon, source


def to_canonical(raw: pd.DataFrame, rows: np.ndarray, home: pd.Series) -> pd.DataFrame:
    """Map a TabFormer text frame onto canonical names (+ the ``home_state`` hint).

    Args:
        raw: text records with TabFormer column names.
        rows: 0-based data-row number of each record (feeds ``transaction_id``).
        home: cardholder_id → home state, from :func:`home_states`.
    """
    cardholder = _cardholder_ids(raw)
    home_state = cardholder.map(home).fillna("").astype(str)
    lat, lon, source = _geo(raw, home_state)
    frame = pd.DataFrame(
        {
            "transaction_id": _transaction_ids(raw, rows),
            "cardholder_id": cardholder,
            "merchant_id": raw["Merchant Name"],
            "timestamp": _timestamps(raw),
            "amount": _strip(raw, "Amount").str.replace("$", "", regex=False),
            "lat": lat,
            "lon": lon,
            "mcc": raw["MCC"],
            "is_fraud": raw["Is Fraud?"] if "Is Fraud?" in raw else None,
            "geo_source": source,
        },
        index=raw.index,
    )
    frame = frame[list(CANONICAL_COLUMNS)]
    frame[REGION_HINT] = home_state
    return frame


def read_chunks(header: CsvHeader, chunk_rows: int, progress: bool = True) -> Iterator[RawChunk]:
    """Stream a TabFormer CSV as canonical-named text chunks, after the home-state pre-pass."""
    home = home_states(header, chunk_rows, progress=progress)
    wanted = [c for c in COLUMNS if c in header.columns and c not in _UNUSED]
    for chunk in iter_csv(header, chunk_rows, usecols=wanted, desc=f"ingest {header.path.name}", progress=progress):
        yield RawChunk(frame=to_canonical(chunk.frame, chunk.rows, home), rows=chunk.rows)

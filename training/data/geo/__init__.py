"""Coordinates for places named by text (city, state): the lookup behind the TabFormer loader.

The two shipped tables (``us_states.csv``, ``us_cities.csv``) were compiled by
hand from public knowledge because no download was possible; their headers
say so and give the accuracy. Lookups are vectorised over pandas Series and
never fail: every row gets a coordinate and a ``geo_source`` flag saying how
it was obtained, so downstream code can weigh or drop imprecise rows.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np
import pandas as pd

__all__ = [
    "DIVISION_ORDER",
    "GEO_CITY",
    "GEO_EXACT",
    "GEO_ONLINE",
    "GEO_STATE",
    "GEO_UNKNOWN",
    "US_CENTER",
    "GeoTables",
    "geo_tables",
    "normalize_place",
]

#: ``geo_source`` values. ``exact``: the input carried coordinates (Sparkov,
#: generator); the others are the TabFormer treatments documented in docs/data.md.
GEO_EXACT = "exact"
GEO_CITY = "city"
GEO_STATE = "state_centroid"
GEO_ONLINE = "online"
GEO_UNKNOWN = "unknown"

#: Geographic centre of the contiguous United States (near Lebanon, Kansas):
#: the fallback placement when nothing better is known about a cardholder.
US_CENTER: tuple[float, float] = (39.8283, -98.5795)

#: Census divisions in a fixed, documented order
#: (the Census Bureau's own numbering); region partitioning cuts this order.
DIVISION_ORDER: tuple[str, ...] = ("NE", "MA", "ENC", "WNC", "SA", "ESC", "WSC", "MTN", "PAC")


def normalize_place(series: pd.Series) -> pd.Series:
    """Upper-case, drop periods, collapse whitespace, ``SAINT``→``ST``: how names are matched."""
    text = series.fillna("").astype(str).str.upper().str.replace(".", "", regex=False)
    text = text.str.replace(r"\s+", " ", regex=True).str.strip()
    return text.str.replace(r"^SAINT ", "ST ", regex=True)


def _read_table(name: str) -> pd.DataFrame:
    raw = resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
    body = "".join(line for line in io.StringIO(raw) if not line.startswith("#"))
    rows = list(csv.DictReader(io.StringIO(body)))
    frame = pd.DataFrame(rows)
    for col in ("lat", "lon"):
        frame[col] = frame[col].astype(float)
    return frame


@dataclass(frozen=True)
class GeoTables:
    """State centroids (indexed by postal code) and city centres (indexed by ``CITY|ST``)."""

    states: pd.DataFrame
    cities: pd.DataFrame

    def state_order(self) -> list[str]:
        """Postal codes sorted by Census division, then code: the order region partitioning cuts."""
        rank = {d: i for i, d in enumerate(DIVISION_ORDER)}
        frame = self.states.reset_index()
        frame["rank"] = frame["division"].map(rank)
        return frame.sort_values(["rank", "state"])["state"].tolist()

    def is_state(self, codes: pd.Series) -> pd.Series:
        """True where ``codes`` is a known US postal code (after upper-casing)."""
        return codes.fillna("").astype(str).str.strip().str.upper().isin(self.states.index)

    def state_centroids(self, codes: pd.Series) -> tuple[np.ndarray, np.ndarray]:
        """(lat, lon) of each state code; NaN where the code is unknown."""
        key = codes.fillna("").astype(str).str.strip().str.upper()
        lat = key.map(self.states["lat"]).to_numpy(dtype=float, na_value=np.nan)
        lon = key.map(self.states["lon"]).to_numpy(dtype=float, na_value=np.nan)
        return lat, lon

    def city_centres(self, city: pd.Series, state: pd.Series) -> tuple[np.ndarray, np.ndarray]:
        """(lat, lon) of each (city, state) pair; NaN where the pair is not in the table."""
        key = normalize_place(city) + "|" + state.fillna("").astype(str).str.strip().str.upper()
        lat = key.map(self.cities["lat"]).to_numpy(dtype=float, na_value=np.nan)
        lon = key.map(self.cities["lon"]).to_numpy(dtype=float, na_value=np.nan)
        return lat, lon


@lru_cache(maxsize=1)
def geo_tables() -> GeoTables:
    """Load the shipped lookup tables once per process."""
    states = _read_table("us_states.csv").set_index("state")
    cities = _read_table("us_cities.csv")
    cities.index = normalize_place(cities["city"]) + "|" + cities["state"]
    return GeoTables(states=states, cities=cities)

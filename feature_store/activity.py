"""Per-cardholder activity aggregates, updated one transaction at a time (offline and online alike).

Like :mod:`fedfraud.feature_store.egograph`, there is one code path: the offline
writer replays a cardholder's history through :meth:`Activity.update` and
serving applies the same ``update`` to the values it read back from the online
store. Every field is a plain number or string, so a round trip through Feast
(Int64 / Float64 / String) is exact and offline == online bit for bit.

Late events (older than ``last_seen``) count in the totals and decayed rates
but do not move ``last_*`` or the clock, matching the ego graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["ACTIVITY_FEATURES", "Activity", "location_cell"]

_US_PER_HOUR = 3_600_000_000
_TAU_1H_US = float(_US_PER_HOUR)
_TAU_24H_US = 24.0 * _US_PER_HOUR


def location_cell(lat: float, lon: float, cell_deg: float) -> str:
    """Coarse grid cell ``"i:j"`` of a location: enough for "new area" features, not a precise position."""
    return f"{math.floor(lat / cell_deg)}:{math.floor(lon / cell_deg)}"


@dataclass
class Activity:
    """Running aggregates of one cardholder; field names are the ``cardholder_activity`` features."""

    tx_count: int = 0
    first_seen_us: int = 0
    last_seen_us: int = 0
    last_amount: float = 0.0
    amount_sum: float = 0.0
    amount_sumsq: float = 0.0
    amount_max: float = 0.0
    amount_mean: float = 0.0
    amount_std: float = 0.0
    rate_1h: float = 0.0
    rate_24h: float = 0.0
    last_location_cell: str = ""
    last_mcc: str = ""

    def update(self, ts_us: int, amount: float, lat: float, lon: float, mcc: str, cell_deg: float) -> None:
        """Fold one transaction in (``ts_us``: UTC µs since the epoch)."""
        ts_us, amount = int(ts_us), float(amount)
        if self.tx_count == 0:
            self.first_seen_us = self.last_seen_us = ts_us
            self.rate_1h = self.rate_24h = 1.0
            in_order = True
        else:
            dt = ts_us - self.last_seen_us
            in_order = dt >= 0
            if in_order:  # decay the rates to the new clock, then count this one
                self.rate_1h = self.rate_1h * math.exp(-dt / _TAU_1H_US) + 1.0
                self.rate_24h = self.rate_24h * math.exp(-dt / _TAU_24H_US) + 1.0
            else:  # a late event counts with its weight at the (unchanged) clock
                self.rate_1h += math.exp(dt / _TAU_1H_US)
                self.rate_24h += math.exp(dt / _TAU_24H_US)
            self.first_seen_us = min(self.first_seen_us, ts_us)
        self.tx_count += 1
        self.amount_sum += amount
        self.amount_sumsq += amount * amount
        self.amount_max = amount if self.tx_count == 1 else max(self.amount_max, amount)
        self.amount_mean = self.amount_sum / self.tx_count
        self.amount_std = math.sqrt(max(self.amount_sumsq / self.tx_count - self.amount_mean**2, 0.0))
        if in_order:
            self.last_seen_us = ts_us
            self.last_amount = amount
            self.last_location_cell = location_cell(lat, lon, cell_deg)
            self.last_mcc = str(mcc)

    def to_features(self) -> dict[str, Any]:
        """Feature name → value, ready for a Feast row."""
        return {name: getattr(self, name) for name in ACTIVITY_FEATURES}

    @classmethod
    def from_features(cls, values: dict[str, Any]) -> Activity:
        """Inverse of :meth:`to_features`; missing or null fields take their defaults (first transaction)."""
        kwargs = {name: value for name in ACTIVITY_FEATURES if (value := values.get(name)) is not None}
        return cls(**kwargs)


#: The ``cardholder_activity`` feature names, in declaration order.
ACTIVITY_FEATURES: tuple[str, ...] = tuple(f.name for f in fields(Activity))

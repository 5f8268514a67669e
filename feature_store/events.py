"""Transaction events on the ego graph: a cardholder's causal history and each new event measured against it.

The thesis's ego graph holds merchants, locations and transition times, but
not the transaction itself: no amount, no category, no time gap. A graph that
a transaction leaves unchanged (a repeat visit outside the edge window)
carried no signal at all. This module adds the transaction as an *event*:

* :class:`History` layout: a fixed-size float64 vector of running statistics
  of one cardholder (Welford mean/variance of log-amount and of the log time
  gap, decayed 1 h / 24 h counts and 24 h spend, home area as a running mean,
  category and hour-of-day histograms). It lives inside
  :class:`fedfraud.feature_store.egograph.EgoGraphState` and is persisted with it, so
  batch building, online serving and batch scoring fold transactions with the
  one function :func:`update_history`.
* :func:`raw_event` — the new transaction's own values (amount, category
  slot, online flag, time, merchant location, new-merchant flag).
* :func:`event_features` — the model input: the raw event measured against
  the history *before* it (amount z-score, category and hour surprise, time
  since the previous transaction, distance from the previous transaction and
  from home, 24 h count/spend relative to the cardholder's usual day, ...).
  It is vectorised over rows and a pure function of (history, raw event), so
  a negative sample can change the raw event (an amount spike, a far jump, a
  rare hour) and recompute every relative feature consistently.
* :func:`history_summary` — a compact view of the history that the GNN gets as
  a graph-level attribute of G_t.

Everything here is bank-internal; only the derived feature vectors enter a
model, and only model updates leave a bank.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

from fedfraud.feature_store.geo import haversine_km

__all__ = [
    "CATEGORY_SLOTS",
    "EVENT_FEATURES",
    "EVENT_SIZE",
    "HISTORY_SIZE",
    "RAW_EVENT_SIZE",
    "SUMMARY_SIZE",
    "Ev",
    "Hist",
    "category_slot",
    "event_features",
    "history_summary",
    "is_online",
    "new_history",
    "raw_event",
    "update_history",
]

#: Category one-hot width. Sparkov's 14 categories have fixed slots; any other code (an ISO MCC, say) is
#: hashed into the remaining slots, so banks need no shared vocabulary.
CATEGORY_SLOTS = 32
_KNOWN_CATEGORIES = (
    "entertainment",
    "food_dining",
    "gas_transport",
    "grocery_net",
    "grocery_pos",
    "health_fitness",
    "home",
    "kids_pets",
    "misc_net",
    "misc_pos",
    "personal_care",
    "shopping_net",
    "shopping_pos",
    "travel",
)
_KNOWN_SLOT = {name: i for i, name in enumerate(_KNOWN_CATEGORIES)}
_HOURS = 24
_TAU_1H_S = 3600.0
_TAU_24H_S = 86_400.0
_DAY_S = 86_400.0


class Hist:
    """Offsets into a history vector (float64, :data:`HISTORY_SIZE`)."""

    N = 0  # transactions folded in
    LA_MEAN, LA_M2 = 1, 2  # Welford of log1p(amount)
    LAST_TS, FIRST_TS = 3, 4  # seconds since the epoch
    RATE_1H, RATE_24H, SPEND_24H = 5, 6, 7  # exponentially decayed at LAST_TS
    TOTAL = 8  # total amount
    HOME_LAT, HOME_LON = 9, 10  # running mean location
    LAST_LAT, LAST_LON = 11, 12
    LG_MEAN, LG_M2, N_GAPS = 13, 14, 15  # Welford of log1p(gap seconds)
    CATEGORY = 16  # CATEGORY_SLOTS counts
    HOUR = CATEGORY + CATEGORY_SLOTS  # 24 counts
    SIZE = HOUR + _HOURS


class Ev:
    """Offsets into a raw event vector (float64, :data:`RAW_EVENT_SIZE`)."""

    AMOUNT, CATEGORY, ONLINE, TS, LAT, LON, NEW_MERCHANT = range(7)
    SIZE = 7


HISTORY_SIZE = Hist.SIZE
RAW_EVENT_SIZE = Ev.SIZE

#: Names of the :func:`event_features` columns, in order (the model card and tests use them).
EVENT_FEATURES: tuple[str, ...] = (
    "log_amount",
    "amount_z",
    "amount_vs_mean",
    "online",
    "hour_sin",
    "hour_cos",
    "dow_sin",
    "dow_cos",
    "hour_surprise",
    "category_surprise",
    "log_gap",
    "gap_z",
    "log_km_from_previous",
    "log_km_from_home",
    "log_count_1h",
    "count_24h_vs_usual",
    "spend_24h_vs_usual",
    "new_merchant",
    "log_history",
    "first_transaction",
    *(f"category_{i}" for i in range(CATEGORY_SLOTS)),
)
EVENT_SIZE = len(EVENT_FEATURES)
#: Size of :func:`history_summary`.
SUMMARY_SIZE = 7 + CATEGORY_SLOTS + _HOURS


def category_slot(mcc: str) -> int:
    """Fixed slot of a known Sparkov category, else a stable hash into the free slots."""
    slot = _KNOWN_SLOT.get(mcc)
    if slot is not None:
        return slot
    free = CATEGORY_SLOTS - len(_KNOWN_CATEGORIES)
    digest = hashlib.blake2b(str(mcc).encode(), digest_size=4).digest()
    return len(_KNOWN_CATEGORIES) + int.from_bytes(digest, "little") % free


def is_online(mcc: str) -> bool:
    """Card-not-present category (Sparkov's ``*_net``)."""
    return str(mcc).endswith("_net")


def new_history() -> np.ndarray:
    """The history of a cardholder with no transactions."""
    return np.zeros(HISTORY_SIZE, dtype=np.float64)


def raw_event(
    history: np.ndarray, amount: float, mcc: str, ts_s: float, lat: float, lon: float, new_merchant: bool
) -> np.ndarray:
    """The transaction's own values as a raw event vector (``history`` is unused today; kept for symmetry)."""
    ev = np.empty(RAW_EVENT_SIZE, dtype=np.float64)
    ev[Ev.AMOUNT] = amount
    ev[Ev.CATEGORY] = category_slot(mcc)
    ev[Ev.ONLINE] = 1.0 if is_online(mcc) else 0.0
    ev[Ev.TS] = ts_s
    ev[Ev.LAT] = lat
    ev[Ev.LON] = lon
    ev[Ev.NEW_MERCHANT] = 1.0 if new_merchant else 0.0
    return ev


def update_history(h: np.ndarray, ev: np.ndarray) -> None:
    """Fold one raw event into history ``h`` in place (late events count but do not move the clock)."""
    n = h[Hist.N]
    ts = float(ev[Ev.TS])
    amount = max(float(ev[Ev.AMOUNT]), 0.0)
    la = math.log1p(amount)
    if n == 0:
        h[Hist.FIRST_TS] = h[Hist.LAST_TS] = ts
        h[Hist.RATE_1H] = h[Hist.RATE_24H] = 1.0
        h[Hist.SPEND_24H] = amount
        h[Hist.LAST_LAT], h[Hist.LAST_LON] = ev[Ev.LAT], ev[Ev.LON]
    else:
        dt = ts - h[Hist.LAST_TS]
        if dt >= 0:
            lg = math.log1p(dt)
            g = h[Hist.N_GAPS] + 1
            delta = lg - h[Hist.LG_MEAN]
            h[Hist.LG_MEAN] += delta / g
            h[Hist.LG_M2] += delta * (lg - h[Hist.LG_MEAN])
            h[Hist.N_GAPS] = g
            d1, d24 = math.exp(-dt / _TAU_1H_S), math.exp(-dt / _TAU_24H_S)
            h[Hist.RATE_1H] = h[Hist.RATE_1H] * d1 + 1.0
            h[Hist.RATE_24H] = h[Hist.RATE_24H] * d24 + 1.0
            h[Hist.SPEND_24H] = h[Hist.SPEND_24H] * d24 + amount
            h[Hist.LAST_TS] = ts
            h[Hist.LAST_LAT], h[Hist.LAST_LON] = ev[Ev.LAT], ev[Ev.LON]
        else:  # a late event counts with its weight at the (unchanged) clock
            w1, w24 = math.exp(dt / _TAU_1H_S), math.exp(dt / _TAU_24H_S)
            h[Hist.RATE_1H] += w1
            h[Hist.RATE_24H] += w24
            h[Hist.SPEND_24H] += w24 * amount
            h[Hist.FIRST_TS] = min(h[Hist.FIRST_TS], ts)
    n += 1
    h[Hist.N] = n
    delta = la - h[Hist.LA_MEAN]
    h[Hist.LA_MEAN] += delta / n
    h[Hist.LA_M2] += delta * (la - h[Hist.LA_MEAN])
    h[Hist.TOTAL] += amount
    h[Hist.HOME_LAT] += (ev[Ev.LAT] - h[Hist.HOME_LAT]) / n
    h[Hist.HOME_LON] += (ev[Ev.LON] - h[Hist.HOME_LON]) / n
    h[Hist.CATEGORY + int(ev[Ev.CATEGORY])] += 1.0
    h[Hist.HOUR + int((ts % _DAY_S) // 3600.0)] += 1.0


def _usual_day(h: np.ndarray, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(transactions, spend) of the cardholder's average day, over at least one day of history."""
    days = np.maximum((ts - h[:, Hist.FIRST_TS]) / _DAY_S, 1.0)
    return h[:, Hist.N] / days, h[:, Hist.TOTAL] / days


def event_features(h: np.ndarray, ev: np.ndarray) -> np.ndarray:
    """Model input ``[n, EVENT_SIZE]`` float32 of raw events ``ev`` against the histories ``h`` before them.

    Both arguments are ``[n, ·]`` (one row each). Every column is scaled to
    roughly [-3, 3]; with an empty history the relative columns are 0 and
    ``first_transaction`` is 1.
    """
    h = np.atleast_2d(np.asarray(h, dtype=np.float64))
    ev = np.atleast_2d(np.asarray(ev, dtype=np.float64))
    if h.shape[0] != ev.shape[0] or h.shape[1] != HISTORY_SIZE or ev.shape[1] != RAW_EVENT_SIZE:
        raise ValueError(f"event_features: histories {h.shape} and events {ev.shape} do not align")
    rows = h.shape[0]
    n = h[:, Hist.N]
    seen = n > 0
    out = np.zeros((rows, EVENT_SIZE), dtype=np.float64)
    amount = np.maximum(ev[:, Ev.AMOUNT], 0.0)
    la = np.log1p(amount)
    la_std = np.sqrt(h[:, Hist.LA_M2] / np.maximum(n - 1, 1) + 0.25)
    out[:, 0] = la / 5.0
    out[:, 1] = np.where(n >= 2, np.clip((la - h[:, Hist.LA_MEAN]) / la_std, -6, 6) / 3.0, 0.0)
    out[:, 2] = np.where(seen, np.clip(la - h[:, Hist.LA_MEAN], -6, 6) / 2.0, 0.0)
    out[:, 3] = ev[:, Ev.ONLINE]
    ts = ev[:, Ev.TS]
    hour = (ts % _DAY_S) / 3600.0
    dow = (np.floor(ts / _DAY_S) + 3) % 7  # 1970-01-01 was a Thursday; Monday = 0
    out[:, 4], out[:, 5] = np.sin(2 * np.pi * hour / 24), np.cos(2 * np.pi * hour / 24)
    out[:, 6], out[:, 7] = np.sin(2 * np.pi * dow / 7), np.cos(2 * np.pi * dow / 7)
    # surprise = −log of the smoothed relative frequency (0 = as usual; > 0 rarer than usual)
    hours = h[:, Hist.HOUR : Hist.HOUR + _HOURS]
    hi = hour.astype(np.int64) % _HOURS
    near = hours[np.arange(rows), hi] + 0.5 * (
        hours[np.arange(rows), (hi - 1) % _HOURS] + hours[np.arange(rows), (hi + 1) % _HOURS]
    )
    out[:, 8] = np.where(seen, -np.log((near + 0.5) / (2 * n + 0.5 * _HOURS) * (_HOURS / 2)) / 3.0, 0.0)
    cats = h[:, Hist.CATEGORY : Hist.CATEGORY + CATEGORY_SLOTS]
    ci = ev[:, Ev.CATEGORY].astype(np.int64)
    cat_count = cats[np.arange(rows), ci]
    out[:, 9] = np.where(seen, -np.log((cat_count + 0.5) / (n + 0.5 * CATEGORY_SLOTS) * CATEGORY_SLOTS) / 3.0, 0.0)
    gap = np.where(seen, np.maximum(ts - h[:, Hist.LAST_TS], 0.0), 0.0)
    lg = np.log1p(gap)
    out[:, 10] = lg / 12.0
    n_gaps = h[:, Hist.N_GAPS]
    lg_std = np.sqrt(h[:, Hist.LG_M2] / np.maximum(n_gaps - 1, 1) + 0.25)
    out[:, 11] = np.where(n_gaps >= 2, np.clip((lg - h[:, Hist.LG_MEAN]) / lg_std, -6, 6) / 3.0, 0.0)
    d_prev = haversine_km(h[:, Hist.LAST_LAT], h[:, Hist.LAST_LON], ev[:, Ev.LAT], ev[:, Ev.LON])
    d_home = haversine_km(h[:, Hist.HOME_LAT], h[:, Hist.HOME_LON], ev[:, Ev.LAT], ev[:, Ev.LON])
    out[:, 12] = np.where(seen, np.log1p(d_prev) / 8.0, 0.0)
    out[:, 13] = np.where(seen, np.log1p(d_home) / 8.0, 0.0)
    d1, d24 = np.exp(-gap / _TAU_1H_S), np.exp(-gap / _TAU_24H_S)
    count_1h = h[:, Hist.RATE_1H] * d1 + 1.0
    count_24h = h[:, Hist.RATE_24H] * d24 + 1.0
    spend_24h = h[:, Hist.SPEND_24H] * d24 + amount
    usual_count, usual_spend = _usual_day(h, ts)
    out[:, 14] = np.log(count_1h) / 3.0
    out[:, 15] = np.where(seen, np.log(count_24h / np.maximum(usual_count, 1e-3)) / 3.0, 0.0)
    out[:, 16] = np.where(seen, np.log((spend_24h + 1.0) / (usual_spend + 1.0)) / 3.0, 0.0)
    out[:, 17] = ev[:, Ev.NEW_MERCHANT]
    out[:, 18] = np.log1p(n) / 8.0
    out[:, 19] = (~seen).astype(np.float64)
    out[np.arange(rows), 20 + ci] = 1.0
    return out.astype(np.float32)


def history_summary(h: np.ndarray) -> np.ndarray:
    """``[n, SUMMARY_SIZE]`` float32 view of histories for the GNN's graph-level input."""
    h = np.atleast_2d(np.asarray(h, dtype=np.float64))
    n = h[:, Hist.N]
    out = np.zeros((h.shape[0], SUMMARY_SIZE), dtype=np.float64)
    usual_count, usual_spend = _usual_day(h, h[:, Hist.LAST_TS])
    out[:, 0] = np.log1p(n) / 8.0
    out[:, 1] = h[:, Hist.LA_MEAN] / 5.0
    out[:, 2] = np.sqrt(h[:, Hist.LA_M2] / np.maximum(n - 1, 1)) / 2.0
    out[:, 3] = h[:, Hist.LG_MEAN] / 12.0
    out[:, 4] = np.sqrt(h[:, Hist.LG_M2] / np.maximum(h[:, Hist.N_GAPS] - 1, 1)) / 3.0
    out[:, 5] = np.log1p(usual_count) / 3.0
    out[:, 6] = np.log1p(usual_spend) / 8.0
    denom = np.maximum(n, 1.0)[:, None]
    out[:, 7 : 7 + CATEGORY_SLOTS] = h[:, Hist.CATEGORY : Hist.CATEGORY + CATEGORY_SLOTS] / denom
    out[:, 7 + CATEGORY_SLOTS :] = h[:, Hist.HOUR : Hist.HOUR + _HOURS] / denom
    return out.astype(np.float32)

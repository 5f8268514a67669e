"""Label-free negatives for the contrastive readout: the newest transaction changed the way fraud changes it.

Each negative keeps the cardholder's real history (prior) and replaces the
raw event (:mod:`fedfraud.feature_store.events`) by one of these families, mixed by
``AnomalyConfig.negatives`` (``"swap=1,amount=1,..."``); the relative
features are then recomputed against the real history:

* ``swap`` — another cardholder's transaction (from the same bank), at its own
  time of day and time gap;
* ``amount`` — the amount × k, k log-uniform in [3, 30];
* ``burst`` — card testing: a tiny amount ($0.50–$5) seconds after the
  previous transaction, with 2–7 more of them folded into the recent counts;
* ``geo`` — a far jump: a location 500–2,500 km from the cardholder's home;
* ``hour`` — the cardholder's rarest hour of day;
* ``category`` — a category the cardholder has never used;
* ``new-high`` — a new merchant near home with the amount × k, k in [2, 10];
* ``spell`` — an account-takeover spell: 1–7 earlier high-amount transactions
  folded into the last 24 hours, and this one × 2–20.

Nothing here reads a label. Everything is driven by a ``numpy.random.Generator``.
"""

from __future__ import annotations

import numpy as np

from fedfraud.feature_store.events import CATEGORY_SLOTS, Ev, Hist

__all__ = ["FAMILIES", "EventNegativeSampler", "parse_mix"]

FAMILIES: tuple[str, ...] = ("swap", "amount", "burst", "geo", "hour", "category", "new-high", "spell")
_DAY_S = 86_400.0


def parse_mix(spec: str) -> dict[str, float]:
    """``"swap=1,amount=0.5"`` → weights; unknown families or non-positive totals raise ``ValueError``."""
    mix: dict[str, float] = {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, _, weight = part.partition("=")
        name = name.strip()
        if name not in FAMILIES:
            raise ValueError(f"unknown negative family {name!r}; valid: {', '.join(FAMILIES)}")
        try:
            mix[name] = float(weight) if weight else 1.0
        except ValueError:
            raise ValueError(f"negative family {name!r} has a non-numeric weight {weight!r}") from None
        if mix[name] < 0:
            raise ValueError(f"negative family {name!r} has a negative weight")
    if sum(mix.values()) <= 0:
        raise ValueError(f"negative mix {spec!r} has no positive weight")
    return mix


class EventNegativeSampler:
    """Perturbs (prior, event) rows into negatives; donors for ``swap`` come from the bank's own events."""

    def __init__(self, donors_prior: np.ndarray, donors_event: np.ndarray, mix: dict[str, float]) -> None:
        if len(donors_event) == 0 or donors_prior.shape[0] != donors_event.shape[0]:
            raise ValueError("EventNegativeSampler needs aligned, non-empty donor histories and events")
        self.donors_prior, self.donors_event = donors_prior, donors_event
        self.names = list(mix)
        weights = np.array([mix[n] for n in self.names], dtype=np.float64)
        self.p = weights / weights.sum()

    def __repr__(self) -> str:
        mix = ",".join(f"{n}={p:.2f}" for n, p in zip(self.names, self.p, strict=True))
        return f"{self.__class__.__name__}({mix}, donors={len(self.donors_event)})"

    def perturb(
        self, prior: np.ndarray, event: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(prior', event', family index) for each row; the inputs are not modified."""
        h, ev = np.array(prior, dtype=np.float64), np.array(event, dtype=np.float64)
        n = len(ev)
        kind = rng.choice(len(self.names), size=n, p=self.p)
        for k, name in enumerate(self.names):
            idx = np.flatnonzero(kind == k)
            if idx.size:
                getattr(self, "_" + name.replace("-", "_"))(h, ev, idx, rng)
        return h, ev, kind

    def _swap(self, h: np.ndarray, ev: np.ndarray, idx: np.ndarray, rng: np.random.Generator) -> None:
        donor = rng.integers(len(self.donors_event), size=idx.size)
        d_ev, d_h = self.donors_event[donor], self.donors_prior[donor]
        gap = np.where(d_h[:, Hist.N] > 0, np.maximum(d_ev[:, Ev.TS] - d_h[:, Hist.LAST_TS], 0.0), 3600.0)
        ts = h[idx, Hist.LAST_TS] + gap
        ev[idx] = d_ev
        ev[idx, Ev.TS] = ts - ts % _DAY_S + d_ev[:, Ev.TS] % _DAY_S  # the donor's time of day
        ev[idx, Ev.TS] = np.maximum(ev[idx, Ev.TS], h[idx, Hist.LAST_TS])

    @staticmethod
    def _amount(h: np.ndarray, ev: np.ndarray, idx: np.ndarray, rng: np.random.Generator) -> None:
        ev[idx, Ev.AMOUNT] = np.maximum(ev[idx, Ev.AMOUNT], 1.0) * np.exp(rng.uniform(np.log(3), np.log(30), idx.size))

    @staticmethod
    def _burst(h: np.ndarray, ev: np.ndarray, idx: np.ndarray, rng: np.random.Generator) -> None:
        ev[idx, Ev.AMOUNT] = rng.uniform(0.5, 5.0, idx.size)
        ev[idx, Ev.TS] = h[idx, Hist.LAST_TS] + rng.uniform(5.0, 120.0, idx.size)
        extra = rng.integers(2, 8, idx.size).astype(np.float64)
        h[idx, Hist.RATE_1H] += extra
        h[idx, Hist.RATE_24H] += extra
        h[idx, Hist.SPEND_24H] += extra * rng.uniform(0.5, 5.0, idx.size)

    @staticmethod
    def _geo(h: np.ndarray, ev: np.ndarray, idx: np.ndarray, rng: np.random.Generator) -> None:
        km = rng.uniform(500.0, 2500.0, idx.size)
        bearing = rng.uniform(0.0, 2 * np.pi, idx.size)
        lat = h[idx, Hist.HOME_LAT] + (km / 111.0) * np.cos(bearing)
        lon = h[idx, Hist.HOME_LON] + (km / (111.0 * np.maximum(np.cos(np.radians(lat)), 0.2))) * np.sin(bearing)
        ev[idx, Ev.LAT] = np.clip(lat, -89.0, 89.0)
        ev[idx, Ev.LON] = (lon + 180.0) % 360.0 - 180.0
        ev[idx, Ev.NEW_MERCHANT] = 1.0

    @staticmethod
    def _hour(h: np.ndarray, ev: np.ndarray, idx: np.ndarray, rng: np.random.Generator) -> None:
        hours = h[idx, Hist.HOUR : Hist.HOUR + 24] + rng.random((idx.size, 24)) * 0.5
        rare = np.argmin(hours, axis=1) + rng.random(idx.size)
        ts = ev[idx, Ev.TS]
        ev[idx, Ev.TS] = ts - ts % _DAY_S + rare * 3600.0

    @staticmethod
    def _category(h: np.ndarray, ev: np.ndarray, idx: np.ndarray, rng: np.random.Generator) -> None:
        counts = h[idx, Hist.CATEGORY : Hist.CATEGORY + CATEGORY_SLOTS] + rng.random((idx.size, CATEGORY_SLOTS)) * 0.5
        ev[idx, Ev.CATEGORY] = np.argmin(counts, axis=1)
        ev[idx, Ev.ONLINE] = rng.integers(0, 2, idx.size)

    @staticmethod
    def _new_high(h: np.ndarray, ev: np.ndarray, idx: np.ndarray, rng: np.random.Generator) -> None:
        ev[idx, Ev.NEW_MERCHANT] = 1.0
        ev[idx, Ev.AMOUNT] = np.maximum(ev[idx, Ev.AMOUNT], 1.0) * np.exp(rng.uniform(np.log(2), np.log(10), idx.size))

    @staticmethod
    def _spell(h: np.ndarray, ev: np.ndarray, idx: np.ndarray, rng: np.random.Generator) -> None:
        earlier = rng.integers(1, 8, idx.size).astype(np.float64)
        usual = np.expm1(h[idx, Hist.LA_MEAN])
        factor = np.exp(rng.uniform(np.log(2), np.log(20), idx.size))
        h[idx, Hist.RATE_24H] += earlier
        h[idx, Hist.RATE_1H] += earlier * rng.uniform(0.0, 1.0, idx.size)
        h[idx, Hist.SPEND_24H] += earlier * usual * factor
        ev[idx, Ev.AMOUNT] = np.maximum(ev[idx, Ev.AMOUNT], usual) * factor

"""Per-merchant label statistics inside each bank, their daily federation release, and causal features.

Why: a compromised terminal's victims are spread over every bank. One bank sees a few of its frauds there; the
sum over banks sees all of them. Each bank computes, at the end of every day ``r``, two vectors over a **fixed
public domain** of ``buckets`` keyed merchants: its own (:func:`bank_vector`: every statistic below, for its own
``merchant_bank_*`` features; it never leaves the bank) and its part of the release (:func:`release_vector`: the
``released_stats`` only, under a tighter per-cardholder bound, so that the release's noise stays small). A vector is
``statistics × windows`` rows of counts, a merchant's bucket being its 64-bit hash under the
federation's key (:meth:`fedfraud.feature_store.privacy.PrivateFeaturizer.merchant_hash`, the hash
:func:`fedfraud.feature_store.cardholder.merchant_key` renders) modulo ``buckets``. Every bank's vector has the
same layout whatever its customers bought, so secure aggregation can add the vectors without seeing them:
:func:`federation_release` adds them in clear (ε = ∞), :func:`~.release.private_release` with each bank's noise
share as the SecAgg+ app (:mod:`.release_app`) does.

A window ``W`` of release ``r`` is days ``r − W + 1 .. r`` (UTC); a vector carries one block per window
(``window_days`` for the bank's, ``release_window_days`` for the release; a short window follows a breach that has
just started to show in the labels, a long one keeps the evidence of its first days). Per bucket and window:

* ``transactions``: transactions there (capped per cardholder, see below);
* ``cardholders``: distinct cardholders with a transaction there;
* ``labelled``: transactions there whose label had come back by the end of day ``r``;
* ``frauds``: of those, labelled fraud;
* ``sole_frauds``: distinct cardholders whose known frauds of the window are all at this one bucket. Why: a
  breached merchant leaves frauds of many cardholders with nothing else in common, while a stolen card used
  everywhere leaves one fraud at each of many merchants and says little about any of them;
* ``cpp``: common point of purchase: distinct cardholders who transacted there and had a fraud on their card
  (anywhere, this bank's labels) strictly after that visit and within ``cpp_days``, the label known by the end
  of day ``r``.

A label of a transaction at time ``t`` is known from ``t + label_delay_days`` on, never earlier.

Per-cardholder bound (the release's DP sensitivity): in each window a cardholder adds to at most
``max_merchants`` buckets of the bank's vector and ``release_max_merchants`` of the release (chosen by
:func:`_bounded` from the cardholder's own data: labelled frauds first), and at most
``per_merchant_cap`` to each count of one bucket (the flags ``cardholders``, ``sole_frauds`` and ``cpp`` are
0/1; ``sole_frauds`` is 1 at one bucket at most). With the default cap 1, ``transactions`` equals
``cardholders``.

Causality: a transaction on day ``d`` gets features from release ``d − 1`` only (its own bank's vector for the
``bank`` columns; for the ``fed`` columns, the mean of the federation's releases ``d − N .. d − 1``, N =
``release_average``, a post-processing of releases already made).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from fedfraud.training.merchant_risk.config import STATS, MerchantRiskConfig

__all__ = [
    "DAY_S",
    "RATES",
    "SCOPES",
    "STATS",
    "BankActivity",
    "MerchantColumns",
    "ReleaseHook",
    "Releaser",
    "bank_feature_names",
    "bank_vector",
    "daily_merchant_features",
    "federation_release",
    "merchant_feature_names",
    "release_columns",
    "release_feature_names",
    "release_vector",
    "risk_columns",
]

logger = logging.getLogger(__name__)

DAY_S = 86_400
#: Ratios derived from a vector at feature time (NaN when the denominator is 0).
RATES: tuple[str, ...] = ("fraud_rate", "sole_fraud_rate", "cpp_rate")
_RATE_INPUTS: dict[str, tuple[str, str]] = {
    "fraud_rate": ("frauds", "labelled"),
    "sole_fraud_rate": ("sole_frauds", "labelled"),
    "cpp_rate": ("cpp", "cardholders"),
}
#: ``bank``: the bank's own vector; ``fed``: the federation's release (the sum over banks).
SCOPES: tuple[str, ...] = ("bank", "fed")
_TX, _HOLDERS, _LABELLED, _FRAUDS, _SOLE, _CPP = range(len(STATS))


@dataclass(frozen=True)
class BankActivity:
    """One bank's transactions as the merchant statistics need them, sorted by time; never leaves the bank.

    Attributes:
        holder: int64 cardholder code (bank-internal).
        bucket: int64 keyed-merchant bucket in ``[0, buckets)``.
        ts_s: int64 UTC seconds, non-decreasing.
        label: float32 1 fraud / 0 genuine / NaN never labelled.
        row: int64 position of each entry in the caller's row order (entry ``i`` is caller row ``row[i]``).
    """

    holder: np.ndarray
    bucket: np.ndarray
    ts_s: np.ndarray
    label: np.ndarray
    row: np.ndarray

    def __post_init__(self) -> None:
        n = self.ts_s.shape[0]
        for name in ("holder", "bucket", "label", "row"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"BankActivity.{name} must have shape ({n},)")
        if n and np.any(np.diff(self.ts_s) < 0):
            raise ValueError("BankActivity rows must be sorted by ts_s")

    def __len__(self) -> int:
        return int(self.ts_s.shape[0])

    @property
    def day(self) -> np.ndarray:
        """UTC day index (days since the epoch) of each entry."""
        return self.ts_s // DAY_S

    @classmethod
    def of(cls, cardholder: Iterable[object], merchant_hash: np.ndarray, ts_s: np.ndarray, label: np.ndarray,
           buckets: int) -> BankActivity:
        """From per-row cardholder ids, keyed 64-bit merchant hashes, UTC seconds and labels (any row order)."""
        ts = np.asarray(ts_s, dtype=np.int64)
        holder = pd.factorize(pd.Series(list(cardholder), dtype=object).astype(str))[0].astype(np.int64)
        bucket = (np.asarray(merchant_hash, dtype=np.uint64) % np.uint64(buckets)).astype(np.int64)
        lab = np.asarray(label, dtype=np.float32)
        order = np.argsort(ts, kind="stable")
        return cls(holder[order], bucket[order], ts[order], lab[order], order.astype(np.int64))

    def window(self, lo_day: int, hi_day: int) -> slice:
        """Entries of days ``lo_day .. hi_day`` (inclusive), a slice since entries are sorted by time."""
        lo = int(np.searchsorted(self.ts_s, lo_day * DAY_S, side="left"))
        hi = int(np.searchsorted(self.ts_s, (hi_day + 1) * DAY_S, side="left"))
        return slice(lo, hi)


def _cpp_flags(holder: np.ndarray, ts: np.ndarray, fraud_known: np.ndarray, cutoff_s: int, horizon_s: int
               ) -> np.ndarray:
    """Per entry: did a known fraud of the same cardholder follow it, strictly after and within ``horizon_s``?"""
    key_shift = np.int64(1) << np.int64(34)  # seconds since the epoch stay below 2**34 until the year 2514
    fraud_keys = np.sort(holder[fraud_known] * key_shift + ts[fraud_known])
    if not fraud_keys.size:
        return np.zeros(holder.shape[0], dtype=bool)
    upper = np.minimum(ts + horizon_s, cutoff_s)
    base = holder * key_shift
    after = np.searchsorted(fraud_keys, base + ts, side="right")
    until = np.searchsorted(fraud_keys, base + upper, side="right")
    return until > after


def _bounded(pair_holder: np.ndarray, pair_bucket: np.ndarray, last: np.ndarray, per_pair: dict[int, np.ndarray],
             k: int) -> np.ndarray:
    """Which (cardholder, bucket) pairs count: each cardholder's first ``k`` by priority, nothing from the rest.

    Priority (the cardholder's own data only, so one cardholder's part stays bounded whatever the others do):
    a known fraud there, then a common-point-of-purchase flag, then a known label, then the latest visit, then
    the lower bucket. Why not recency alone: the most recent visits have no label yet, and dropping the labelled
    ones would drop the signal the statistic exists for.
    """
    n_pairs = pair_holder.size
    order = np.lexsort((pair_bucket, -last, per_pair[_LABELLED] == 0, ~per_pair[_CPP], per_pair[_FRAUDS] == 0,
                        pair_holder))
    sorted_holder = pair_holder[order]
    first = np.r_[0, np.flatnonzero(np.diff(sorted_holder)) + 1]
    rank = np.arange(n_pairs) - np.repeat(first, np.diff(np.r_[first, n_pairs]))
    keep = np.zeros(n_pairs, dtype=bool)
    keep[order[rank < k]] = True
    return keep


@dataclass(frozen=True)
class _Pairs:
    """One window's (cardholder, bucket) pairs of a bank with each statistic's per-pair value (before any bound)."""

    holder: np.ndarray
    bucket: np.ndarray
    last: np.ndarray
    values: dict[int, np.ndarray]

    def block(self, stats: tuple[str, ...], k: int, buckets: int) -> np.ndarray:
        """int64 ``[len(stats), buckets]``: each statistic summed over the pairs kept by the per-cardholder bound k."""
        out = np.zeros((len(stats), buckets), dtype=np.int64)
        if not self.holder.size:
            return out
        keep = _bounded(self.holder, self.bucket, self.last, self.values, k)
        for i, name in enumerate(stats):
            out[i] = np.bincount(self.bucket[keep], weights=self.values[STATS.index(name)][keep].astype(np.float64),
                                 minlength=buckets).astype(np.int64)
        return out


def _window_pairs(activity: BankActivity, release_day: int, window_days: int, cfg: MerchantRiskConfig) -> _Pairs:
    """The pairs of days ``release_day − W + 1 .. release_day`` with the labels known by the end of ``release_day``."""
    sl = activity.window(release_day - window_days + 1, release_day)
    holder, bucket, ts, label = activity.holder[sl], activity.bucket[sl], activity.ts_s[sl], activity.label[sl]
    if not ts.size:
        empty = np.zeros(0, dtype=np.int64)
        return _Pairs(empty, empty, empty, {})
    end_s = (release_day + 1) * DAY_S
    delay_s = cfg.label_delay_days * DAY_S
    known = (ts + delay_s <= end_s) & np.isfinite(label)
    fraud = known & (label == 1)
    cpp = _cpp_flags(holder, ts, fraud, end_s - delay_s, cfg.cpp_days * DAY_S)

    pairs, inverse = np.unique(holder * np.int64(cfg.buckets) + bucket, return_inverse=True)
    n_pairs = pairs.size
    last = np.full(n_pairs, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(last, inverse, ts)
    pair_holder, pair_bucket = pairs // cfg.buckets, pairs % cfg.buckets
    cap = cfg.per_merchant_cap
    per_pair = {
        _TX: np.minimum(np.bincount(inverse, minlength=n_pairs), cap),
        _HOLDERS: np.ones(n_pairs, dtype=np.int64),
        _LABELLED: np.minimum(np.bincount(inverse, weights=known.astype(np.float64), minlength=n_pairs), cap),
        _FRAUDS: np.minimum(np.bincount(inverse, weights=fraud.astype(np.float64), minlength=n_pairs), cap),
        _CPP: np.bincount(inverse, weights=cpp.astype(np.float64), minlength=n_pairs) > 0,
    }
    # sole frauds: the cardholder's known frauds of the window are all at this one bucket
    fraud_pairs = per_pair[_FRAUDS] > 0
    per_pair[_SOLE] = fraud_pairs & (np.bincount(pair_holder, weights=fraud_pairs.astype(np.float64))[pair_holder] == 1)
    return _Pairs(pair_holder, pair_bucket, last, per_pair)


def bank_vector(activity: BankActivity, release_day: int, cfg: MerchantRiskConfig) -> np.ndarray:
    """The bank's own statistics of day ``release_day``, per-cardholder bounded (k = ``max_merchants``): int64
    ``[len(window_days) * len(STATS), buckets]`` (window-major). It stays in the bank (its ``merchant_bank_*``
    features); what leaves is :func:`release_vector`.

    Window ``W`` uses only the bank's transactions of days ``release_day − W + 1 .. release_day`` and the labels
    known by the end of ``release_day`` (a transaction at ``t`` is labelled from ``t + D``).
    """
    return np.concatenate([_window_pairs(activity, release_day, w, cfg).block(STATS, cfg.max_merchants, cfg.buckets)
                           for w in cfg.window_days])


def release_vector(activity: BankActivity, release_day: int, cfg: MerchantRiskConfig) -> np.ndarray:
    """The bank's part of the federation's release of day ``release_day``: int64
    ``[len(release_window_days) * len(released_stats), buckets]`` (window-major), the fixed layout secure
    aggregation sums. A cardholder adds to at most ``release_max_merchants`` buckets per window (labelled frauds
    first), so one cardholder changes it by at most ``cfg.sensitivity_l1()`` / ``cfg.sensitivity_l2()``.
    """
    return np.concatenate([
        _window_pairs(activity, release_day, w, cfg).block(cfg.released_stats, cfg.release_max_merchants, cfg.buckets)
        for w in cfg.release_window_days])


def federation_release(vectors: Iterable[np.ndarray]) -> np.ndarray:
    """The federation's clear release: the element-wise sum of the banks' release vectors (no noise, no SecAgg:
    ε = ∞).

    Why one function: the only place where banks' numbers meet in clear; :func:`~.release.private_release` is the
    noised, securely aggregated replacement.
    """
    parts = [np.asarray(v, dtype=np.int64) for v in vectors]
    if not parts:
        raise ValueError("a release needs at least one bank's vector")
    if len({p.shape for p in parts}) != 1:
        raise ValueError(f"bank vectors differ in shape: {sorted({p.shape for p in parts})}")
    return np.sum(parts, axis=0)


def _rates(stats: tuple[str, ...]) -> tuple[str, ...]:
    """The ratios of :data:`RATES` whose numerator and denominator are both among ``stats``."""
    return tuple(r for r in RATES if all(s in stats for s in _RATE_INPUTS[r]))


def _columns(vector: np.ndarray, bucket: np.ndarray, stats: tuple[str, ...]) -> np.ndarray:
    """Counts and derivable rates at ``bucket`` of a window-major ``[windows * len(stats), buckets]`` vector."""
    vector = np.asarray(vector)
    if vector.ndim != 2 or vector.shape[0] % len(stats):
        raise ValueError(f"expected a [windows * {len(stats)}, buckets] vector, got shape {vector.shape}")
    idx = np.asarray(bucket, dtype=np.int64)
    parts = []
    for w in range(vector.shape[0] // len(stats)):
        counts = vector[w * len(stats):(w + 1) * len(stats), idx].T.astype(np.float64)
        col = {name: counts[:, i] for i, name in enumerate(stats)}
        rates = []
        with np.errstate(divide="ignore", invalid="ignore"):
            for rate in _rates(stats):
                num, den = _RATE_INPUTS[rate]
                rates.append(np.where(col[den] > 0, col[num] / np.where(col[den] > 0, col[den], 1.0), np.nan))
        parts.append(np.column_stack([counts, *rates]) if rates else counts)
    return np.hstack(parts).astype(np.float32)


def risk_columns(vector: np.ndarray, bucket: np.ndarray) -> np.ndarray:
    """The bank's own feature columns (float32 ``[n, windows * (len(STATS) + len(RATES))]``) of rows at ``bucket``
    under one :func:`bank_vector`, window by window in :func:`merchant_feature_names` ``("bank", ...)`` order.
    """
    return _columns(vector, bucket, STATS)


def release_columns(recent: Sequence[np.ndarray], bucket: np.ndarray, cfg: MerchantRiskConfig) -> np.ndarray:
    """The federation's feature columns of rows at ``bucket``: the mean of the ``recent`` releases (the latest
    ``cfg.release_average``, oldest first), in :func:`release_feature_names` order; before any release, what an
    all-zero release gives (counts 0, rates NaN), which is also what serving reads for a bucket with no row.

    Why the mean: each release carries fresh noise over a window that moves by a day, so averaging N of them
    divides the noise's variance by about N at no privacy cost (post-processing).
    """
    if not recent:
        empty = np.zeros((len(cfg.release_window_days) * len(cfg.released_stats), 1))
        return _columns(empty, np.zeros(np.asarray(bucket).shape[0], dtype=np.int64), cfg.released_stats)
    mean = np.mean([np.asarray(r, dtype=np.float64) for r in recent[-cfg.release_average:]], axis=0)
    return _columns(mean, bucket, cfg.released_stats)


def merchant_feature_names(scope: str, window_days: tuple[int, ...], stats: tuple[str, ...] = STATS
                           ) -> tuple[str, ...]:
    """Column names of one scope's merchant features (``merchant_<scope>_<stat>_<W>d``), column order."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
    return tuple(f"merchant_{scope}_{name}_{w}d" for w in window_days for name in (*stats, *_rates(stats)))


def release_feature_names(cfg: MerchantRiskConfig) -> tuple[str, ...]:
    """Column names of the federation's features: the released statistics (and rates) per release window."""
    return merchant_feature_names("fed", cfg.release_window_days, cfg.released_stats)


def bank_feature_names(cfg: MerchantRiskConfig) -> tuple[str, ...]:
    """Column names of the bank's own merchant features."""
    return merchant_feature_names("bank", cfg.window_days)


@dataclass(frozen=True)
class MerchantColumns:
    """A bank's merchant features per row, in the caller's row order: own vector (``bank``), the federation's
    release (``fed``) and, per name, the same columns under another release mechanism (``private``).
    """

    bank: np.ndarray
    fed: np.ndarray
    private: dict[str, np.ndarray] = field(default_factory=dict)

    def of(self, scope: str) -> np.ndarray:
        """The ``[n, F]`` columns of ``scope`` (``bank`` or ``fed``)."""
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
        return self.bank if scope == "bank" else self.fed


#: Called with (release day, federation release) after every daily release.
ReleaseHook = Callable[[int, np.ndarray], None]
#: Makes a day's release from the banks' release vectors (in sorted bank order), e.g. a private release.
Releaser = Callable[[int, list[np.ndarray]], np.ndarray]


def daily_merchant_features(
    banks: Mapping[int, BankActivity],
    cfg: MerchantRiskConfig,
    on_release: ReleaseHook | None = None,
    progress: bool = False,
    releasers: Mapping[str, Releaser] | None = None,
) -> dict[int, MerchantColumns]:
    """Replay the days: every bank computes its vectors at the end of each day, the federation sums the release
    vectors, and each transaction of day ``d`` gets the features of release ``d − 1`` (the ``fed`` columns average
    releases ``d − N .. d − 1``, N = ``release_average``; zeros before the first release).

    ``on_release(day, release)`` sees every clear federation release (what an operator would be shown);
    each of ``releasers`` makes its own release from the same vectors (``private[name]`` columns), e.g. with noise.
    """
    releasers = dict(releasers or {})
    order = sorted(banks)
    bank_width, fed_width = len(bank_feature_names(cfg)), len(release_feature_names(cfg))
    out = {b: MerchantColumns(np.zeros((len(banks[b]), bank_width), np.float32),
                              np.zeros((len(banks[b]), fed_width), np.float32),
                              {n: np.zeros((len(banks[b]), fed_width), np.float32) for n in releasers})
           for b in order}
    days = [a.day for a in banks.values() if len(a)]
    if not days:
        return out
    recent: dict[str | None, deque[np.ndarray]] = {
        n: deque(maxlen=cfg.release_average) for n in (None, *releasers)}
    first, last = min(int(d[0]) for d in days), max(int(d[-1]) for d in days)
    for release_day in tqdm(range(first - 1, last), desc="merchant releases", disable=not progress,
                            mininterval=2.0):
        shared = [release_vector(banks[b], release_day, cfg) for b in order]
        recent[None].append(federation_release(shared))
        if on_release is not None:
            on_release(release_day, recent[None][-1])
        for name, make in releasers.items():
            recent[name].append(make(release_day, shared))
        for b in order:
            activity = banks[b]
            sl = activity.window(release_day + 1, release_day + 1)
            if sl.start == sl.stop:
                continue
            rows, bucket = activity.row[sl], activity.bucket[sl]
            out[b].bank[rows] = risk_columns(bank_vector(activity, release_day, cfg), bucket)
            out[b].fed[rows] = release_columns(list(recent[None]), bucket, cfg)
            for name in releasers:
                out[b].private[name][rows] = release_columns(list(recent[name]), bucket, cfg)
    logger.info("merchant_releases days=%d banks=%d window_days=%s release_window_days=%s released=%s "
                "delay_days=%d k=%d k_f=%d average=%d", last - first + 1, len(banks),
                ",".join(map(str, cfg.window_days)), ",".join(map(str, cfg.release_window_days)),
                ",".join(cfg.released_stats), cfg.label_delay_days, cfg.max_merchants, cfg.release_max_merchants,
                cfg.release_average)
    return out

"""Cardholder bootstrap of fraud metrics: intervals that tell signal from noise.

Test rows are not independent (a fraud spell is many rows of one
cardholder), so the resampling unit is the **cardholder**: each replicate
draws the test cardholders with replacement and weighs each row by how often
its cardholder was drawn. All variants are scored on the same replicates, so
differences between variants are paired. Rows are sorted by score once per
model; a replicate only re-weights, which keeps 1,000 replicates cheap.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["METRICS", "Interval", "RankedScores", "bootstrap_counts", "interval", "metric_draws", "weighted_metrics"]

METRICS: tuple[str, ...] = ("pr_auc", "recall_at_fpr", "f1")


@dataclass(frozen=True)
class RankedScores:
    """One model's scores on the test rows, pre-sorted for weighted metrics.

    ``decision`` is ``score >= threshold`` per row (thresholds may differ by row: local models).
    """

    order: np.ndarray
    ends: np.ndarray
    label: np.ndarray
    decision: np.ndarray

    @classmethod
    def of(cls, label: np.ndarray, scores: np.ndarray, thresholds: np.ndarray | float) -> RankedScores:
        y = np.asarray(label).astype(bool)
        s = np.asarray(scores, dtype=np.float64)
        if s.shape != y.shape or not np.all(np.isfinite(s)):
            raise ValueError("need one finite score per label")
        order = np.argsort(-s, kind="stable")
        ss = s[order]
        ends = np.r_[np.flatnonzero(np.diff(ss)), ss.size - 1] if ss.size else np.zeros(0, dtype=np.int64)
        decision = s >= np.asarray(thresholds, dtype=np.float64)
        return cls(order, ends, y[order], decision[order])


def weighted_metrics(ranked: RankedScores, weight: np.ndarray, max_fpr: float = 0.01) -> dict[str, float]:
    """PR-AUC (average precision), recall at ``max_fpr`` and F1 at the decision, rows weighted by ``weight``.

    With all weights 1 these equal :func:`fedfraud.training.fraud.metrics.classification_metrics`.
    """
    w = np.asarray(weight, dtype=np.float64)[ranked.order]
    y = ranked.label
    wp = np.where(y, w, 0.0)
    tp = np.cumsum(wp)[ranked.ends]
    fp = np.cumsum(w - wp)[ranked.ends]
    pos = tp[-1] if tp.size else 0.0
    neg = fp[-1] if fp.size else 0.0
    if pos <= 0:
        return dict.fromkeys(METRICS, float("nan"))
    predicted = tp + fp
    precision = np.divide(tp, predicted, out=np.zeros_like(tp), where=predicted > 0)
    recall = tp / pos
    ap = float(np.sum(np.diff(np.r_[0.0, recall]) * precision))
    ok = fp <= max_fpr * neg
    r_at = float(tp[ok].max() / pos) if ok.any() else 0.0
    d = ranked.decision
    tp_d = float(np.sum(wp[d]))
    flagged = float(np.sum(w[d]))
    f1 = 2 * tp_d / (flagged + pos) if flagged + pos > 0 else 0.0
    return {"pr_auc": ap, "recall_at_fpr": r_at, "f1": f1}


def bootstrap_counts(n_holders: int, reps: int, seed: int) -> np.ndarray:
    """``[reps, n_holders]``: per replicate, how often each of the cardholders was drawn (n draws, replacement).

    A row's weight in replicate r is ``counts[r, holder_code_of_row]``. Per-bank figures reuse the
    pooled replicates restricted to the bank's rows (so bank and pooled differences stay paired).
    """
    rng = np.random.default_rng(seed)
    return np.stack([np.bincount(rng.integers(0, n_holders, n_holders), minlength=n_holders)
                     for _ in range(reps)]).astype(np.float64) if n_holders else np.zeros((reps, 0))


@dataclass(frozen=True)
class Interval:
    """A point estimate (full test set, mean over seeds) and its 95 % cardholder-bootstrap interval."""

    point: float
    low: float
    high: float

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    def fmt(self, scale: float = 1.0, digits: int = 3, signed: bool = False) -> str:
        sign = "+" if signed else ""
        return (f"{self.point * scale:{sign}.{digits}f} [{self.low * scale:{sign}.{digits}f}, "
                f"{self.high * scale:{sign}.{digits}f}]")


def interval(point_by_seed: Sequence[float], boot_by_seed: np.ndarray) -> Interval:
    """Seed-averaged point estimate and the 2.5/97.5 % quantiles of the seed-averaged bootstrap replicates.

    ``boot_by_seed`` is ``[seeds, reps]``; replicates with NaN (no positives drawn) are dropped.
    """
    with warnings.catch_warnings():  # a replicate that drew no fraud is NaN in every seed
        warnings.simplefilter("ignore", RuntimeWarning)
        boot = np.nanmean(np.asarray(boot_by_seed, dtype=np.float64), axis=0)
    boot = boot[np.isfinite(boot)]
    finite = np.asarray(point_by_seed, dtype=np.float64)
    point = float(np.mean(finite[np.isfinite(finite)])) if np.isfinite(finite).any() else float("nan")
    if boot.size == 0:
        return Interval(point, float("nan"), float("nan"))
    low, high = np.quantile(boot, [0.025, 0.975])
    return Interval(point, float(low), float(high))


def metric_draws(models: Mapping[str, Sequence[RankedScores]], holder_codes: np.ndarray, counts: np.ndarray,
                 max_fpr: float) -> dict[str, dict[str, np.ndarray]]:
    """Variant → metric → ``[seeds, reps]`` of weighted metrics; row weights ``counts[r, holder_codes]``."""
    codes = np.asarray(holder_codes, dtype=np.int64)
    out: dict[str, dict[str, np.ndarray]] = {}
    done: dict[int, dict[str, np.ndarray]] = {}  # the same RankedScores object (a seed-independent model) once
    for name, per_seed in models.items():
        arr = {m: np.empty((len(per_seed), len(counts))) for m in METRICS}
        for s, ranked in enumerate(per_seed):
            if id(ranked) not in done:
                row = {m: np.empty(len(counts)) for m in METRICS}
                for r in range(len(counts)):
                    got = weighted_metrics(ranked, counts[r, codes], max_fpr)
                    for m in METRICS:
                        row[m][r] = got[m]
                done[id(ranked)] = row
            for m in METRICS:
                arr[m][s] = done[id(ranked)][m]
        out[name] = arr
    return out

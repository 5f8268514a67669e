"""Cardholder bootstrap: the one home of the project's 95 % intervals (fraud models, anomaly detectors, benches).

Test rows are not independent (a fraud spell is many rows of one
cardholder), so the resampling unit is the **cardholder**: each replicate
draws the test cardholders with replacement. Every score column or variant is
scored on the same replicates, so differences between them are paired.

Two ways to score a replicate, one :class:`Interval` for both:

* weights (:func:`bootstrap_counts`, :func:`weighted_metrics`, :func:`metric_draws`): each row weighs how often its
  cardholder was drawn; rows are sorted by score once per model, so 1,000 replicates stay cheap (the fraud
  studies, the retraining policy);
* drawn rows (:func:`bootstrap_by_group`, :func:`bootstrap_statistics`): the drawn cardholders' rows are
  concatenated and ROC-AUC / PR-AUC (scikit-learn's definitions), or any statistic, is computed on them (the
  anomaly benches).

:func:`percentile_interval` turns a point and its replicates into the 2.5 / 97.5 % percentile interval.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["METRICS", "Interval", "RankedScores", "bootstrap_by_group", "bootstrap_counts", "bootstrap_statistics",
           "interval", "metric_draws", "percentile_interval", "weighted_metrics"]

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
    """A point estimate (the full test set; a mean over seeds where there are seeds) and its 95 % bootstrap interval."""

    value: float
    low: float
    high: float

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    def fmt(self, scale: float = 1.0, digits: int = 3, signed: bool = False) -> str:
        sign = "+" if signed else ""
        return (f"{self.value * scale:{sign}.{digits}f} [{self.low * scale:{sign}.{digits}f}, "
                f"{self.high * scale:{sign}.{digits}f}]")

    def __str__(self) -> str:
        return self.fmt()


def percentile_interval(value: float, draws: Sequence[float] | np.ndarray) -> Interval:
    """``value`` with the 2.5 / 97.5 % quantiles of its bootstrap ``draws``; non-finite draws (a replicate that drew
    no fraud) are dropped, and with none left the interval is NaN.
    """
    arr = np.asarray(draws, dtype=np.float64)
    arr = arr[np.isfinite(arr)]
    if not arr.size:
        return Interval(value, float("nan"), float("nan"))
    low, high = np.quantile(arr, [0.025, 0.975])
    return Interval(value, float(low), float(high))


def interval(point_by_seed: Sequence[float], boot_by_seed: np.ndarray) -> Interval:
    """Seed-averaged point estimate and the 2.5/97.5 % quantiles of the seed-averaged bootstrap replicates.

    ``boot_by_seed`` is ``[seeds, reps]``; replicates with NaN (no positives drawn) are dropped.
    """
    with warnings.catch_warnings():  # a replicate that drew no fraud is NaN in every seed
        warnings.simplefilter("ignore", RuntimeWarning)
        boot = np.nanmean(np.asarray(boot_by_seed, dtype=np.float64), axis=0)
    finite = np.asarray(point_by_seed, dtype=np.float64)
    point = float(np.mean(finite[np.isfinite(finite)])) if np.isfinite(finite).any() else float("nan")
    return percentile_interval(point, boot)


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


def _groups(group: np.ndarray) -> tuple[int, list[np.ndarray]]:
    """The number of distinct groups and, per group, the positions of its rows."""
    groups, inverse = np.unique(group, return_inverse=True)
    return len(groups), np.split(np.argsort(inverse, kind="stable"), np.cumsum(np.bincount(inverse))[:-1])


def _ranking(y: np.ndarray, s: np.ndarray) -> tuple[float, float]:
    """ROC-AUC and PR-AUC (average precision) as scikit-learn's ``roc_auc_score`` and ``average_precision_score``
    compute them (tied scores are one threshold); NaN when the rows hold one class only.

    Why not call them: their argument checks cost ~2 ms a call whatever the size, which was most of a
    bootstrap's time (two calls per column per replicate); one sort gives both here.
    """
    if y.all() or not y.any():
        return float("nan"), float("nan")
    order = np.argsort(-s, kind="stable")
    ranked, hits = s[order], y[order]
    last = np.r_[np.flatnonzero(np.diff(ranked)), len(ranked) - 1]  # the last row of each distinct score
    tps = np.cumsum(hits, dtype=np.float64)[last]
    fps = (last + 1) - tps
    recall, fpr = tps / tps[-1], fps / fps[-1]
    roc = float(np.trapezoid(np.r_[0.0, recall], np.r_[0.0, fpr]))
    ap = float(np.sum(np.diff(np.r_[0.0, recall]) * tps / (tps + fps)))
    return roc, ap


def bootstrap_by_group(
    label: np.ndarray,
    scores: Mapping[str, np.ndarray],
    group: np.ndarray,
    *,
    resamples: int = 500,
    seed: int = 0,
    pairs: tuple[tuple[str, str], ...] = (),
) -> dict[str, dict[str, Interval]]:
    """ROC-AUC and PR-AUC of each score with intervals; ``pairs`` adds ``"a − b"`` ROC-AUC differences.

    Rows with a non-finite score in any column are dropped first, so every
    detector is judged on the same transactions.
    """
    label = np.asarray(label, dtype=bool)
    cols = {k: np.asarray(v, dtype=np.float64) for k, v in scores.items()}
    keep = np.ones(len(label), dtype=bool)
    for v in cols.values():
        keep &= np.isfinite(v)
    label, group = label[keep], np.asarray(group)[keep]
    cols = {k: v[keep] for k, v in cols.items()}
    n_groups, rows_of = _groups(group)
    point = {k: _ranking(label, v) for k, v in cols.items()}
    rng = np.random.default_rng(seed)
    draws: dict[str, list[tuple[float, float]]] = {k: [] for k in cols}
    diffs: dict[str, list[float]] = {f"{a} − {b}": [] for a, b in pairs}
    for _ in range(resamples):
        chosen = rng.integers(n_groups, size=n_groups)
        idx = np.concatenate([rows_of[g] for g in chosen])
        y = label[idx]
        got = {k: _ranking(y, v[idx]) for k, v in cols.items()}
        for k, m in got.items():
            draws[k].append(m)
        for a, b in pairs:
            diffs[f"{a} − {b}"].append(got[a][0] - got[b][0])
    out: dict[str, dict[str, Interval]] = {}
    for k in cols:
        out[k] = {
            "roc_auc": percentile_interval(point[k][0], [d[0] for d in draws[k]]),
            "pr_auc": percentile_interval(point[k][1], [d[1] for d in draws[k]]),
        }
    for a, b in pairs:
        out[f"{a} − {b}"] = {"roc_auc": percentile_interval(point[a][0] - point[b][0], diffs[f"{a} − {b}"])}
    return out


def bootstrap_statistics(
    values: Mapping[str, np.ndarray],
    group: np.ndarray,
    statistics: Mapping[str, Callable[[np.ndarray], float]],
    *,
    resamples: int = 500,
    seed: int = 0,
) -> dict[str, dict[str, Interval]]:
    """Every statistic of every column of per-row ``values``, with a 95% percentile-bootstrap interval over
    ``group`` (whole groups are drawn with replacement, the same draws for every column, so columns compare paired).
    """
    n_groups, rows_of = _groups(np.asarray(group))
    rng = np.random.default_rng(seed)
    draws = [np.concatenate([rows_of[i] for i in rng.integers(0, n_groups, n_groups)])
             for _ in range(resamples)]
    out: dict[str, dict[str, Interval]] = {}
    for col, v in values.items():
        v = np.asarray(v, dtype=np.float64)
        out[col] = {}
        for name, stat in statistics.items():
            samples = np.array([stat(v[rows]) for rows in draws])
            out[col][name] = Interval(float(stat(v)), float(np.quantile(samples, 0.025)),
                                      float(np.quantile(samples, 0.975)))
    return out

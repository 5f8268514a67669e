"""Ranking metrics with 95% bootstrap intervals over cardholders (the unit that is sampled, not transactions).

Every score column is resampled with the *same* cardholder draws, so the
interval of a difference between two detectors is paired and honest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
from sklearn.metrics import average_precision_score, roc_auc_score

__all__ = ["Interval", "bootstrap_by_group", "bootstrap_statistics", "fraud_incidents", "paired_difference_rows"]


@dataclass(frozen=True)
class Interval:
    """A point estimate with its 95% percentile-bootstrap interval."""

    value: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]"


RunT = TypeVar("RunT")


@dataclass
class TrainedRunsBench(Generic[RunT]):
    """The models one bench invocation trained, with their validation and test intervals over cardholders
    (keyed by run or baseline name, then metric), the label counts and a heading label.
    """

    source: str
    settings: dict[str, Any]
    runs: list[RunT] = field(default_factory=list)
    test: dict[str, dict[str, Interval]] = field(default_factory=dict)
    val: dict[str, dict[str, Interval]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    label: str = ""


def _metrics(y: np.ndarray, s: np.ndarray) -> tuple[float, float]:
    if y.all() or not y.any():
        return float("nan"), float("nan")
    return float(roc_auc_score(y, s)), float(average_precision_score(y, s))


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
    groups, inverse = np.unique(group, return_inverse=True)
    rows_of = np.split(np.argsort(inverse, kind="stable"), np.cumsum(np.bincount(inverse))[:-1])
    point = {k: _metrics(label, v) for k, v in cols.items()}
    rng = np.random.default_rng(seed)
    draws: dict[str, list[tuple[float, float]]] = {k: [] for k in cols}
    diffs: dict[str, list[float]] = {f"{a} − {b}": [] for a, b in pairs}
    for _ in range(resamples):
        chosen = rng.integers(len(groups), size=len(groups))
        idx = np.concatenate([rows_of[g] for g in chosen])
        y = label[idx]
        got = {k: _metrics(y, v[idx]) for k, v in cols.items()}
        for k, m in got.items():
            draws[k].append(m)
        for a, b in pairs:
            diffs[f"{a} − {b}"].append(got[a][0] - got[b][0])

    def interval(value: float, samples: list[float]) -> Interval:
        arr = np.asarray([x for x in samples if np.isfinite(x)])
        if not arr.size:
            return Interval(value, float("nan"), float("nan"))
        return Interval(value, float(np.quantile(arr, 0.025)), float(np.quantile(arr, 0.975)))

    out: dict[str, dict[str, Interval]] = {}
    for k in cols:
        out[k] = {
            "roc_auc": interval(point[k][0], [d[0] for d in draws[k]]),
            "pr_auc": interval(point[k][1], [d[1] for d in draws[k]]),
        }
    for a, b in pairs:
        out[f"{a} − {b}"] = {"roc_auc": interval(point[a][0] - point[b][0], diffs[f"{a} − {b}"])}
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
    group = np.asarray(group)
    groups, inverse = np.unique(group, return_inverse=True)
    rows_of = np.split(np.argsort(inverse, kind="stable"), np.cumsum(np.bincount(inverse))[:-1])
    rng = np.random.default_rng(seed)
    draws = [np.concatenate([rows_of[i] for i in rng.integers(0, len(groups), len(groups))])
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


def paired_difference_rows(table: Mapping[str, Mapping[str, Interval]], heading: str) -> list[str]:
    """The markdown table of the ``"a − b"`` rows that :func:`bootstrap_by_group` adds (those without a PR-AUC),
    signed, under ``heading``; empty when there are none. One format for every bench's paired differences.
    """
    diffs = [(n, m["roc_auc"]) for n, m in table.items() if "pr_auc" not in m]
    if not diffs:
        return []
    return ["", f"| {heading} | ROC-AUC [95% CI] |", "|---|---|",
            *(f"| {n} | {d.value:+.3f} [{d.low:+.3f}, {d.high:+.3f}] |" for n, d in diffs)]


def fraud_incidents(group: np.ndarray, ts_s: np.ndarray, label: np.ndarray, gap_days: float = 7.0) -> int:
    """Fraud incidents: a cardholder's fraudulent transactions with no gap over ``gap_days`` count as one."""
    label = np.asarray(label, dtype=bool)
    order = np.lexsort((np.asarray(ts_s)[label], np.asarray(group)[label]))
    g, t = np.asarray(group)[label][order], np.asarray(ts_s, dtype=np.float64)[label][order]
    if not len(g):
        return 0
    new = np.r_[True, (g[1:] != g[:-1]) | (np.diff(t) > gap_days * 86_400)]
    return int(new.sum())

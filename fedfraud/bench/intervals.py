"""What the benches share around intervals: the trained-runs table, its paired-difference rows, fraud incidents.

The intervals themselves (the one :class:`~fedfraud.training.bootstrap.Interval`, the cardholder bootstrap of
ROC-AUC / PR-AUC and of any statistic) live in :mod:`fedfraud.training.bootstrap`, below the benches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from fedfraud.training.bootstrap import Interval

__all__ = ["TrainedRunsBench", "fraud_incidents", "paired_difference_rows"]


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


def paired_difference_rows(table: Mapping[str, Mapping[str, Interval]], heading: str) -> list[str]:
    """The markdown table of the ``"a − b"`` rows that :func:`fedfraud.training.bootstrap.bootstrap_by_group` adds
    (those without a PR-AUC), signed, under ``heading``; empty when there are none. One format for every bench's
    paired differences.
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

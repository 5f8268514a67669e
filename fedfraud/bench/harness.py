"""What every bench shares around its figures: markdown tables, interval and paired-difference cells, the
trained-runs result, machine and load lines.

One renderer, so a bench states its columns and rows and nothing else: :func:`table` turns them into a markdown
table (an :class:`~fedfraud.training.bootstrap.Interval` cell prints as ``0.981 [0.978, 0.984]``, a paired
difference through :func:`signed`, ``None`` as ``—``). Not ``DataFrame.to_markdown``: tabulate pads every column
to its widest cell, and these cells hold sentences, so the records' raw markdown would be unreadable and every
re-run would churn their diffs. The intervals themselves (the cardholder bootstrap of ROC-AUC / PR-AUC and of any
statistic) live in :mod:`fedfraud.training.bootstrap`, below the benches.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np

from fedfraud.training.bootstrap import Interval

__all__ = ["TrainedRunsBench", "blocks", "fraud_incidents", "load_average", "loads_now", "machine_line", "met",
           "paired_difference_rows", "rounded", "signed", "table", "test_line",
           "timing_lines"]

RunT = TypeVar("RunT")


def _row(cells: Iterable[object]) -> str:
    return "|" + "|".join(" " if c == "" else f" {'—' if c is None else c} " for c in cells) + "|"


def table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> list[str]:
    """The markdown lines of a table: ``header``, then one line per row; ``align`` has one letter per column,
    ``r`` right-aligns it (``---:``), anything else (or a missing letter) leaves the default.
    """
    rule = "".join("---:|" if align[i:i + 1] == "r" else "---|" for i in range(len(header)))
    return [_row(header), "|" + rule, *(_row(row) for row in rows)]


def blocks(*parts: str | Sequence[str]) -> str:
    """Markdown of ``parts`` (a paragraph, or a block's lines) separated by blank lines, ending in a newline."""
    return "\n\n".join(p if isinstance(p, str) else "\n".join(p) for p in parts) + "\n"


def signed(d: Interval) -> str:
    """A paired difference with its interval, every figure signed: ``+0.012 [-0.003, +0.027]``."""
    return f"{d.value:+.3f} [{d.low:+.3f}, {d.high:+.3f}]"


def rounded(i: Interval) -> str:
    """An interval of errors or rates: 3 decimals below 10, none above (km and hours span both)."""
    digits = 3 if abs(i.value) < 10 else 0
    return f"{i.value:.{digits}f} [{i.low:.{digits}f}, {i.high:.{digits}f}]"


def met(ok: bool) -> str:
    """A target's verdict, bold."""
    return f"**{'met' if ok else 'missed'}**"


def paired_difference_rows(table_: Mapping[str, Mapping[str, Interval]], heading: str) -> list[str]:
    """The markdown table of the ``"a − b"`` rows that :func:`fedfraud.training.bootstrap.bootstrap_by_group` adds
    (those without a PR-AUC), signed, under ``heading``; empty when there are none. One format for every bench's
    paired differences.
    """
    diffs = [(n, signed(m["roc_auc"])) for n, m in table_.items() if "pr_auc" not in m]
    return ["", *table([heading, "ROC-AUC [95% CI]"], diffs)] if diffs else []


def machine_line() -> str:
    """The processor and Python a bench ran on, as the first words of its settings paragraph."""
    return f"Machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}."


def load_average() -> str:
    """``/proc/loadavg`` as written (1, 5, 15 min, runnable/total, last pid), else the three averages."""
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return loads_now()


def loads_now() -> str:
    """The 1, 5 and 15 min load averages (this machine's speed varies 2× with them)."""
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def test_line(c: Mapping[str, int]) -> str:
    """The test split's size from a bench's counts, as the settings paragraphs of the detection benches state it."""
    return (f"Test: {c.get('test_transactions', 0):,} transactions of {c.get('test_cardholders', 0)} cardholders, "
            f"**{c.get('test_frauds', 0):,} frauds in {c.get('test_incidents', 0)} incidents**.")


def timing_lines(timings: Mapping[str, float], fmt: str = ".0f", unit: str = " s") -> list[str]:
    """One bullet per timed step."""
    return [f"- {k}: {v:{fmt}}{unit}" for k, v in timings.items()]


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


def fraud_incidents(group: np.ndarray, ts_s: np.ndarray, label: np.ndarray, gap_days: float = 7.0) -> int:
    """Fraud incidents: a cardholder's fraudulent transactions with no gap over ``gap_days`` count as one."""
    label = np.asarray(label, dtype=bool)
    order = np.lexsort((np.asarray(ts_s)[label], np.asarray(group)[label]))
    g, t = np.asarray(group)[label][order], np.asarray(ts_s, dtype=np.float64)[label][order]
    if not len(g):
        return 0
    new = np.r_[True, (g[1:] != g[:-1]) | (np.diff(t) > gap_days * 86_400)]
    return int(new.sum())

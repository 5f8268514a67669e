"""The Models page's live figures: shadow agreement and drift PSI over time, computed from the topics the index reads.

Why from the topics and not from the scorer's ``/metrics``: the scorer exports only running totals
(``fedfraud_shadow_scored_total``, ``fedfraud_shadow_agreed_total``) and the PSI of its current window
(``fedfraud_drift_psi``), per replica and reset on a restart or a new challenger; a history needs a time-series
store the console does not have, and the console is not given the scorer's URL. The records behind both figures
are on the topics the console already reads with its one index thread (:class:`fedfraud.console.index.TopicIndex`):

- **Shadow agreement.** While a challenger shadows, the scorer produces one ``shadow-scores`` record per fresh
  transaction (:meth:`fedfraud.serving.fraud_stage.FraudStage._shadow_records`) with the challenger's decision;
  the champion's decision is that transaction's ``fraud-decisions`` record. The scorer counts a transaction as
  agreed when the two decisions are equal (``shadow_agreed``); so does this module, joining the two by transaction
  id. It groups by (champion, challenger) pair, since the scorer's counters are per challenger.
- **Drift PSI.** The scorer's :class:`~fedfraud.training.retrain.drift.DriftMonitor` bins every input of the
  champion and its score against the training reference stored with the fraud model version
  (``drift_reference.json``). Of those columns the decision records carry two: the fraud score and the anomaly score
  (a model input). This module bins them in the same reference's bins with the same
  :func:`~fedfraud.training.retrain.drift.psi`, per window of consecutive decisions of one fraud model. A model
  version with no reference is compared with its own first window instead, and the page says so.

Windows are tumbling windows of consecutive rows, cut from the newest backwards, so the last point always covers
the newest rows; a window holds at least ``min_rows`` rows (for PSI the scorer's own ``retrain.drift_min_rows``:
fewer rows and the PSI of ten bins is mostly noise) and there are at most ``max_points`` of them. Nothing is kept
besides the index's compact rows; each figure is computed when the page is asked for.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedfraud.console.cases import svg_data_uri, svg_figure
from fedfraud.console.index import DecisionRow, ShadowRow, TopicIndex
from fedfraud.training.retrain.drift import DRIFT_FILE, DriftReference, psi

__all__ = ["AgreementSeries", "DriftReferences", "DriftSeries", "ModelMonitor", "Point", "agreement_series",
           "drift_series", "model_monitor", "windows"]

log = logging.getLogger(__name__)

#: The decision record's columns that are also columns of the scorer's drift reference (its names).
DRIFT_COLUMNS = ("fraud_score", "anomaly_score")
#: The usual reading of PSI (training/retrain/drift.py): < 0.1 stable, 0.1–0.25 watch, > 0.25 act.
PSI_WATCH, PSI_ACT = 0.1, 0.25
#: At most this many series per chart (the newest models or pairs): more lines are unreadable.
MAX_SERIES = 4
_COLOURS = ("#D55E00", "#0072B2", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")


@dataclass(frozen=True)
class Point:
    """One window: the time of its newest row, how many rows it holds, and the figure over them."""

    at_us: int
    rows: int
    value: float


@dataclass(frozen=True)
class AgreementSeries:
    """Shadow agreement of one (champion, challenger) pair: totals over every joined pair indexed, and per window."""

    champion: str
    challenger: str
    pairs: int
    agreed: int
    points: list[Point]

    @property
    def agreement(self) -> float:
        return self.agreed / self.pairs if self.pairs else float("nan")


@dataclass(frozen=True)
class DriftSeries:
    """PSI of the decision records' columns for one fraud model, per window, against ``baseline``."""

    model: str
    baseline: str  # what the windows are compared with, in words
    rows: int
    psi: dict[str, list[Point]]


@dataclass
class ModelMonitor:
    """What the Models page shows of the live stream: both series, their charts and what was left out."""

    agreement: list[AgreementSeries] = field(default_factory=list)
    drift: list[DriftSeries] = field(default_factory=list)
    agreement_svg: str | None = None
    drift_svg: str | None = None
    shadow_records: int = 0
    unmatched: int = 0  # shadow records whose decision is not in the index (not read yet, or trimmed)
    decisions: int = 0
    min_rows: int = 0
    notes: list[str] = field(default_factory=list)


def windows(n: int, min_rows: int, max_points: int) -> list[slice]:
    """Tumbling windows over ``n`` consecutive rows, oldest first, cut from the newest backwards: each holds
    ``max(min_rows, ceil(n / max_points))`` rows; the oldest rows that do not fill one are left out.
    """
    if n <= 0 or max_points <= 0:
        return []
    size = max(min_rows, 1, math.ceil(n / max_points))
    out = []
    end = n
    while end - size >= 0:
        out.append(slice(end - size, end))
        end -= size
    return out[::-1]


def agreement_series(pairs: Sequence[tuple[ShadowRow, DecisionRow]], max_points: int = 24) -> list[AgreementSeries]:
    """Per (champion, challenger) pair, newest pair first: the share of shadow-scored transactions whose
    challenger decision equals the champion's decision (the scorer's ``shadow_agreed / shadow_scored``).

    ``pairs``: each shadow row with the decision of its transaction. The champion named is the one that decided
    (the decision record's model), which is the one the shadow record names.
    """
    groups: dict[tuple[str, str], list[tuple[int, bool]]] = {}
    for shadow, decision in pairs:
        at = shadow.scored_us or decision.decided_us
        groups.setdefault((decision.fraud_model, shadow.challenger), []).append(
            (at, shadow.decision == decision.decision))
    out = []
    for (champion, challenger), rows in groups.items():
        rows.sort(key=lambda r: r[0])
        agreed = np.asarray([r[1] for r in rows], dtype=bool)
        points = [Point(rows[w.stop - 1][0], w.stop - w.start, float(agreed[w].mean()))
                  for w in windows(len(rows), 1, max_points)]
        out.append(AgreementSeries(champion, challenger, len(rows), int(agreed.sum()), points))
    out.sort(key=lambda s: s.points[-1].at_us if s.points else 0, reverse=True)
    return out


def drift_series(decisions: Sequence[DecisionRow], reference_for: Callable[[str], DriftReference | None],
                 min_rows: int, max_points: int = 24) -> tuple[list[DriftSeries], list[str]]:
    """Per fraud model (the newest first), the PSI of the fraud score and the anomaly score per window of its
    consecutive decisions, in the bins of its training reference and with the scorer's PSI function; a model
    without a reference against its own first window. Returns the series and one note per model left out.
    """
    by_model: dict[str, list[DecisionRow]] = {}
    for row in decisions:  # already in time order
        by_model.setdefault(row.fraud_model, []).append(row)
    notes = []
    out = []
    for model, rows in by_model.items():
        cuts = windows(len(rows), min_rows, max_points)
        if not cuts:
            notes.append(f"{model or 'no model'}: {len(rows)} decisions, fewer than the {min_rows} a PSI window needs")
            continue
        values = {"fraud_score": [r.score for r in rows], "anomaly_score": [r.anomaly_score for r in rows]}
        reference = reference_for(model) if model else None
        if reference is not None:
            names = [n for n in DRIFT_COLUMNS if n in reference.names]
            baseline = f"the training reference stored with {model} ({reference.rows} rows)"
        else:
            names = list(DRIFT_COLUMNS)
            first = cuts[0]
            reference = DriftReference.from_matrix(names, _matrix(values, names, first))
            baseline = f"its own first window ({first.stop - first.start} decisions; {model} has no training reference)"
            cuts = cuts[1:]
        if not names or not cuts:
            notes.append(f"{model}: one window only, nothing to compare it with" if names
                         else f"{model}: its reference has neither a fraud_score nor an anomaly_score column")
            continue
        where = {n: reference.names.index(n) for n in names}
        series: dict[str, list[Point]] = {n: [] for n in names}
        for w in cuts:
            X = _matrix(values, names, w)
            for k, name in enumerate(names):
                j = where[name]
                series[name].append(Point(rows[w.stop - 1].decided_us, w.stop - w.start,
                                          psi(reference.shares[j], _column_counts(reference, j, X[:, k]))))
        out.append(DriftSeries(model, baseline, len(rows), series))
    out.sort(key=lambda s: max((p.at_us for ps in s.psi.values() for p in ps), default=0), reverse=True)
    return out, notes


def _matrix(values: dict[str, list[float | None]], names: list[str], w: slice) -> np.ndarray:
    """Columns ``names`` of rows ``w``; a missing value is NaN (the scorer's own NaN bin: no anomaly score)."""
    return np.column_stack([np.asarray([np.nan if v is None else v for v in values[n][w]], dtype=np.float64)
                            for n in names])


def _column_counts(reference: DriftReference, j: int, col: np.ndarray) -> np.ndarray:
    """Bin counts of ``col`` in the bins of the reference's column ``j`` (its own binning, one column)."""
    one = DriftReference((reference.names[j],), (reference.edges[j],), (reference.shares[j],), reference.rows)
    return one.counts(col.reshape(-1, 1))[0]


class DriftReferences:
    """The training reference of each fraud model version, read from the registry the scorer reads it from
    (``<version>/drift_reference.json``, as :meth:`fedfraud.serving.hotpath.HotPath._drift_monitor` does).

    Versions are immutable, so a reference read once is kept (one per version: bounded by the registry); a
    version not found (not published in this registry, or without a reference) is looked up again next time.
    """

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self._cache: dict[str, DriftReference] = {}
        self._lock = threading.Lock()

    def __call__(self, tag: str) -> DriftReference | None:
        """The reference of fraud model ``tag`` (``fraud:v3``), or None."""
        with self._lock:
            if tag in self._cache:
                return self._cache[tag]
        if self.root is None or not self.root.is_dir():
            return None
        from fedfraud.training.registry import ModelRef, ModelRegistry, RegistryError

        ref = ModelRef.maybe(tag)
        if ref is None or ref.kind != "fraud":
            return None
        try:
            path = ModelRegistry(self.root).get_ref(ref).path / DRIFT_FILE
            if not path.is_file():
                return None
            reference = DriftReference.from_json(json.loads(path.read_text(encoding="utf-8")))
        except (RegistryError, OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("console: no drift reference for %s (%s)", tag, exc)
            return None
        with self._lock:
            self._cache[tag] = reference
        return reference


def model_monitor(index: TopicIndex, references: Callable[[str], DriftReference | None], min_rows: int,
                  max_points: int = 24) -> ModelMonitor:
    """Shadow agreement and drift PSI over time from what ``index`` holds, with their charts."""
    decisions, joined, unmatched = index.monitor_rows()
    agreement = agreement_series(joined, max_points)
    drift, notes = drift_series(decisions, references, min_rows, max_points)
    monitor = ModelMonitor(agreement=agreement, drift=drift, shadow_records=len(joined) + unmatched,
                           unmatched=unmatched, decisions=len(decisions), min_rows=min_rows, notes=notes)
    if len(agreement) > MAX_SERIES:
        monitor.notes.append(f"{len(agreement) - MAX_SERIES} older champion/challenger pairs are not drawn")
    if len(drift) > MAX_SERIES:
        monitor.notes.append(f"{len(drift) - MAX_SERIES} older fraud models are not drawn")
    monitor.agreement_svg = _agreement_svg(agreement[:MAX_SERIES])
    monitor.drift_svg = _drift_svg(drift[:MAX_SERIES])
    return monitor


def _time_axis(stamps: Sequence[int]) -> tuple[int, float, str]:
    """(newest µs, µs per unit, axis label) for times shown before the newest: minutes, hours or days."""
    newest, oldest = max(stamps), min(stamps)
    span = newest - oldest
    for unit_us, name in ((60e6, "minutes"), (3600e6, "hours")):
        if span <= 120 * unit_us:
            return newest, unit_us, f"{name} before the newest point"
    return newest, 86_400e6, "days before the newest point"


def _plain_legend(ax: Any) -> None:
    """A legend whose texts are never read as mathtext (a model tag with ``$`` would fail or be rendered)."""
    legend = ax.legend(loc="best", fontsize=7)
    for text in legend.get_texts():
        text.set_parse_math(False)


def _agreement_svg(series: Sequence[AgreementSeries]) -> str | None:
    """Agreement per window, one line per pair (matplotlib SVG as the case view draws), or None with no point."""
    stamps = [p.at_us for s in series for p in s.points]
    if not stamps:
        return None
    newest, unit, xlabel = _time_axis(stamps)
    fig = svg_figure(6.4, 2.6)
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.2, top=0.95)
    ax = fig.add_subplot()
    for s, colour in zip(series, _COLOURS, strict=False):
        ax.plot([(p.at_us - newest) / unit for p in s.points], [p.value for p in s.points], marker="o",
                markersize=3, color=colour, label=f"{s.challenger} vs {s.champion}")
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("shadow agreement")
    ax.set_xlabel(xlabel)
    _plain_legend(ax)
    return svg_data_uri(fig)


def _drift_svg(series: Sequence[DriftSeries]) -> str | None:
    """PSI per window, one line per (model, column), with the 0.1 and 0.25 reading lines; None with no point."""
    stamps = [p.at_us for s in series for ps in s.psi.values() for p in ps]
    if not stamps:
        return None
    newest, unit, xlabel = _time_axis(stamps)
    fig = svg_figure(6.4, 2.6)
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.2, top=0.95)
    ax = fig.add_subplot()
    colours = iter(_COLOURS)
    top = 0.3
    for s in series:
        for name, points in s.psi.items():
            values = [p.value for p in points]
            top = max(top, *(v for v in values if math.isfinite(v)), 0.0)
            ax.plot([(p.at_us - newest) / unit for p in points], values, marker="o", markersize=3,
                    color=next(colours, "#000000"), linestyle="-" if name == "fraud_score" else "--",
                    label=f"{s.model} {name}")
    ax.axhline(PSI_WATCH, color="#999999", linewidth=0.8, linestyle=":")
    ax.axhline(PSI_ACT, color="#b00020", linewidth=0.8, linestyle=":")
    ax.set_ylim(0, top * 1.1)
    ax.set_ylabel("PSI")
    ax.set_xlabel(xlabel)
    _plain_legend(ax)
    return svg_data_uri(fig)

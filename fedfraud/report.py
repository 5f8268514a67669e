"""The demo's self-contained HTML report: headline figures against their targets, figures, the JSON in an appendix.

:func:`render_report` takes the plain mapping the demo writes as ``summary.json`` (so a saved run renders too) and,
optionally, arrays the summary does not keep (``extra``). The page is a Jinja2 template
(``fedfraud/templates/report.html``, autoescaped) with matplotlib / scikit-learn figures inlined as base64 PNG, so
the file opens with no server. Before anything is rendered the summary is scrubbed: a value under a card key
(``cardholder_id``, ``cc_num``, ...) and any run of 13–19 digits is replaced, so no raw card data reaches the page.

``extra`` (all optional):

- ``latency_ms``: ``{part: sequence of end-to-end latencies in ms}``, e.g. the stream's two halves;
- ``stream_labels`` / ``stream_scores``: the label (bool) and fraud score of each streamed decision, same order;
- ``seconds_per_round``: the federated anomaly training's seconds per round (also read from the summary).
"""

from __future__ import annotations

import base64
import io
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["TARGETS", "render_report", "render_saved", "scrub"]

#: The targets the headline cards compare against (the targets of the records under docs/results/). A summary may carry
#: its own under ``"targets"``.
TARGETS: dict[str, float] = {
    "stream_p99_ms": 50.0,  # `make demo` stream p99 ≤ 50 ms at its 250 tx/s
    "anomaly_roc_auc": 0.93,  # federated, label-free fraud ROC-AUC
    "drift_psi": 0.25,  # retrain.drift_psi_threshold's default: PSI above which an input has shifted
}

CARD_KEYS = frozenset({"cardholder_id", "cardholder", "cc_num", "card_number", "card_no", "pan"})
_CARD_DIGITS = re.compile(r"(?<!\d)\d{13,19}(?!\d)")
REDACTED = "[redacted]"

_BLUE, _ORANGE, _GREEN, _RED, _GREY, _PURPLE = "#0969da", "#d4731b", "#1a7f37", "#cf222e", "#8c959f", "#8250df"


def scrub(value: Any) -> Any:
    """``value`` with card-holder keys' values and 13–19-digit runs (card-number-like) replaced, recursively."""
    if isinstance(value, Mapping):
        return {str(k): REDACTED if str(k).lower() in CARD_KEYS else scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub(v) for v in value]
    if isinstance(value, str):
        return _CARD_DIGITS.sub(REDACTED, value)
    if isinstance(value, int) and not isinstance(value, bool) and 10**12 <= abs(value) < 10**19:
        return REDACTED
    return value


# ---------------------------------------------------------------------------- small helpers


def _num(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out


def _interval(text: Any) -> tuple[float, float, float] | None:
    """``"0.914 [0.855, 0.961]"`` → ``(0.914, 0.855, 0.961)``."""
    m = re.match(r"\s*([-+]?[\d.]+)\s*\[\s*([-+]?[\d.]+)\s*,\s*([-+]?[\d.]+)\s*\]", str(text))
    return (float(m[1]), float(m[2]), float(m[3])) if m else None


def _policy_figures(policy: Mapping[str, Any]) -> dict[str, Any] | None:
    """PR-AUC of champion and challenger, the difference and its 95% interval: from the decision's evidence, else
    read back from its reason (summaries written before the evidence was kept).
    """
    pr = (policy.get("evidence") or {}).get("pr_auc")
    if isinstance(pr, Mapping) and "difference_95ci" in pr:
        out = {"pr_auc": {k: pr[k] for k in ("champion", "challenger", "difference", "difference_95ci")}}
        rec = policy["evidence"].get("recall_at_fpr")
        if isinstance(rec, Mapping) and "difference_95ci" in rec:
            out["recall_at_fpr"] = dict(rec)
        out["frauds"] = policy["evidence"].get("frauds")
        return out
    reason = str(policy.get("reason", ""))
    m = re.search(r"PR-AUC ([\d.]+) vs (?:champion )?([\d.]+)\D*?difference ([-+]?[\d.]+)\D*?95% CI "
                  r"\[([-+]?[\d.]+), ([-+]?[\d.]+)\]", reason)
    if not m:
        return None
    frauds = re.search(r"(\d+) labelled frauds", reason)
    return {"pr_auc": {"challenger": float(m[1]), "champion": float(m[2]), "difference": float(m[3]),
                       "difference_95ci": [float(m[4]), float(m[5])]},
            "frauds": int(frauds[1]) if frauds else None}


def _fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:,.{digits}f}".rstrip("0").rstrip(".") if abs(value) < 1e6 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _inline(value: Any) -> str:
    """One stage figure as a line of text; nested structures are left to the appendix."""
    if isinstance(value, Mapping):
        if all(not isinstance(v, Mapping | list | tuple) for v in value.values()):
            return ", ".join(f"{k}={_fmt(v)}" for k, v in value.items())
        return "(nested: see the appendix)"
    if isinstance(value, list | tuple):
        if all(not isinstance(v, Mapping | list | tuple) for v in value):
            return "; ".join(_fmt(v) for v in value) or "none"
        return "(nested: see the appendix)"
    return _fmt(value)


@dataclass
class _Card:
    label: str
    value: str
    target: str = ""
    status: str = "info"  # met | missed | info
    notes: list[str] = field(default_factory=list)


@dataclass
class _Figure:
    id: str
    title: str
    caption: str
    png: str


@dataclass
class _Section:
    id: str
    title: str
    intro: str = ""
    reason: str = ""
    figures: list[_Figure] = field(default_factory=list)
    table: dict[str, Any] | None = None
    items: list[str] = field(default_factory=list)


class _Data:
    """The summary, looked up by stage name, and the extras."""

    def __init__(self, summary: Mapping[str, Any], extra: Mapping[str, Any]) -> None:
        self.summary = summary
        self.extra = extra
        self.stages: dict[str, Mapping[str, Any]] = {str(s.get("name")): s for s in summary.get("stages", [])
                                                     if isinstance(s, Mapping)}
        self.targets = {**TARGETS, **{k: float(v) for k, v in (summary.get("targets") or {}).items()}}

    def stage(self, name: str) -> Mapping[str, Any]:
        return self.stages.get(name, {})

    def load(self, stage: str) -> tuple[float, float] | None:
        pair = (self.summary.get("load_avg_1m") or {}).get(stage)
        return (float(pair[0]), float(pair[1])) if isinstance(pair, list | tuple) and len(pair) == 2 else None

    def load_text(self, stage: str) -> str:
        pair = self.load(stage)
        cpus = self.summary.get("cpus")
        on = f" on {cpus} CPUs" if cpus else ""
        if pair is None:
            return "Machine load not recorded in this summary"
        return f"Load average (1 min) {pair[0]:.1f} → {pair[1]:.1f} during this stage{on}"

    def confusion(self) -> np.ndarray | None:
        """``[[tn, fp], [fn, tp]]`` of the streamed decisions at the operating threshold."""
        s = self.stage("serve + loop")
        c = s.get("confusion")
        if isinstance(c, Mapping):
            return np.array([[c["tn"], c["fp"]], [c["fn"], c["tp"]]], dtype=int)
        flagged, precision, recall, frauds, decided = (
            s.get(k) for k in ("flagged", "precision", "recall", "frauds_streamed", "decided"))
        if None in (flagged, precision, recall, frauds, decided):
            return None
        # recall = tp / frauds and precision = tp / declined at the threshold: exact up to the summary's rounding
        tp = round(float(recall) * int(frauds))
        fp = (round(tp / float(precision)) if float(precision) > 0 else int(flagged)) - tp
        fn = int(frauds) - tp
        return np.array([[int(decided) - tp - fp - fn, fp], [fn, tp]], dtype=int)


# ---------------------------------------------------------------------------- headline cards


def _cards(d: _Data) -> list[_Card]:
    cards: list[_Card] = []
    stream, anomaly, fraud = d.stage("serve + loop"), d.stage("train anomaly"), d.stage("train fraud")
    merchant = d.stage("merchant risk")

    p99, p50 = _num(stream.get("latency_p99_ms")), _num(stream.get("latency_p50_ms"))
    if p99 is not None:
        target = d.targets["stream_p99_ms"]
        notes = [f"p50 {p50:.1f} ms (no target)"] if p50 is not None else []
        for part, fig in (stream.get("latency_by_part") or {}).items():
            if isinstance(fig, Mapping) and "p99_ms" in fig:
                notes.append(f"{part}: p50 {fig.get('p50_ms')} ms, p99 {fig['p99_ms']} ms")
        if stream.get("achieved_tx_per_s") is not None:
            notes.append(f"at {stream['achieved_tx_per_s']} tx/s achieved of {stream.get('offered_tx_per_s')} "
                         "offered")
        notes.append(d.load_text("serve + loop"))
        cards.append(_Card("Stream latency p99 (end to end)", f"{p99:.1f} ms", f"target ≤ {target:g} ms",
                           "met" if p99 <= target else "missed", notes))

    if stream.get("produced") is not None:
        produced, decided, missing = stream.get("produced"), stream.get("decided"), stream.get("missing", 0)
        ok = produced == decided and not missing
        cards.append(_Card("Stream completeness", f"{_fmt(decided)} of {_fmt(produced)} decided",
                           "target: every produced transaction decided, none lost", "met" if ok else "missed",
                           [f"missing {missing}; dead-lettered {stream.get('dead_lettered', 0)} poison records",
                            f"labels joined {_fmt(stream.get('labels_joined'))} of {_fmt(stream.get('labels_sent'))} "
                            f"sent, duplicates {stream.get('labels_duplicate', 0)}"]))

    if stream.get("pr_auc") is not None:
        frauds, decided = stream.get("frauds_streamed"), stream.get("decided")
        base = f"base rate {int(frauds) / int(decided):.2%}" if frauds is not None and decided else ""
        cards.append(_Card("Stream decisions PR-AUC", _fmt(stream["pr_auc"]),
                           f"no target; {frauds} frauds streamed, {base}", "info",
                           [f"precision {_fmt(stream.get('precision'))}, recall {_fmt(stream.get('recall'))} at the "
                            f"operating threshold ({stream.get('flagged')} flagged)",
                            "few frauds: read it with its count; no interval is computed for it"]))

    if fraud.get("test_pr_auc") is not None:
        frauds, rows = fraud.get("test_frauds"), fraud.get("test_rows")
        notes = [f"{frauds} test frauds" + (f" in {_fmt(rows)} rows, base rate {int(frauds) / int(rows):.2%}"
                                            if rows else "")
                 if frauds is not None else "test frauds not recorded in this summary"]
        fl, local = _num(fraud.get("bank0_federation_pr_auc")), _num(fraud.get("bank0_local_pr_auc"))
        status, target = "info", "no absolute target"
        if fl is not None and local is not None:
            target = "target: federated above Local for the serving bank"
            status = "met" if fl > local else "missed"
            bank_frauds = fraud.get("bank0_test_frauds")
            notes.append(f"bank 0: federated {fl:.3f} vs Local {local:.3f}"
                         + (f" on {bank_frauds} frauds" if bank_frauds is not None else ""))
        notes.append("offline test cardholders (all banks); the stream's PR-AUC is on the live tail of one bank")
        cards.append(_Card(f"Fraud model test PR-AUC ({fraud.get('model', '?')})", _fmt(fraud["test_pr_auc"]), target,
                           status, notes))

    hetero = d.stage("heterogeneous banks")
    if hetero.get("served") is not None:
        schemas = hetero.get("schemas") or {}
        cards.append(_Card(
            f"Heterogeneous banks: FED-SPFD ({hetero.get('model')})",
            f"{_fmt(hetero['served'])} decided by bank {hetero.get('served_bank')}",
            f"{hetero.get('distinct_schemas')} schemas across {len(schemas)} banks; no target", "info",
            ["; ".join(f"{k}: {v}" for k, v in schemas.items()),
             f"test PR-AUC {_fmt(hetero.get('test_pr_auc_all_banks'))} (all banks), "
             f"{_fmt(hetero.get('test_pr_auc_bank' + str(hetero.get('served_bank'))))} (bank "
             f"{hetero.get('served_bank')}); served PR-AUC {_fmt(hetero.get('served_pr_auc'))} on "
             f"{hetero.get('live_frauds')} live frauds",
             "served by the replica's hot path in this process (the stream stage serves the champion); the "
             "generator's demographics are drawn apart from the fraud, so they add no signal here"]))

    roc = _interval(anomaly.get("fraud_roc_auc_95ci"))
    if roc is not None:
        target = d.targets["anomaly_roc_auc"]
        status = "met" if roc[0] >= target else "missed"
        notes = [f"95% interval [{roc[1]:.3f}, {roc[2]:.3f}] on {anomaly.get('test_frauds')} test frauds"]
        pr = _interval(anomaly.get("fraud_pr_auc_95ci"))
        if pr is not None:
            notes.append(f"PR-AUC {pr[0]:.3f} [{pr[1]:.3f}, {pr[2]:.3f}]")
        best = max((anomaly.get("baselines_roc_auc") or {}).items(), key=lambda kv: kv[1], default=None)
        if best is not None:
            notes.append(f"best label-free baseline: {best[0]} {best[1]:.3f}")
        cards.append(_Card(f"Anomaly GNN fraud ROC-AUC, label-free ({anomaly.get('model', '?')})", f"{roc[0]:.3f}",
                           f"target ≥ {target:g}", status, notes))

    if merchant.get("guarantee"):
        g = str(merchant["guarantee"])
        m = re.search(r"\(ε, δ\) = \(([^,]+), ([^)]+)\)", g)
        value = f"(ε, δ) = ({m[1]}, {m[2]})" if m else "see note"
        breached, flagged = merchant.get("breached_by_generator") or [], merchant.get("breached_flagged") or []
        cards.append(_Card("Merchant-risk release guarantee", value, "per cardholder, per daily release", "info",
                           [g, f"breached merchants flagged: {len(flagged)} of {len(breached)}"]))

    policy = stream.get("policy")
    if isinstance(policy, Mapping):
        figures = _policy_figures(policy)
        value = str(policy.get("action", "?"))
        notes = []
        if figures:
            pr = figures["pr_auc"]
            lo, hi = pr["difference_95ci"]
            notes.append(f"challenger − champion PR-AUC {pr['difference']:+.3f}, 95% CI [{lo:+.3f}, {hi:+.3f}]"
                         + (f", {figures['frauds']} labelled frauds" if figures.get("frauds") is not None else ""))
        cycle = stream.get("cycle") or {}
        if cycle.get("fraud"):
            notes.append(f"challenger {cycle.get('anomaly')} + {cycle['fraud']} from a {cycle.get('trigger')} cycle "
                         f"of {cycle.get('seconds')} s")
        cards.append(_Card("Retrain policy verdict", value, "promote only if the PR-AUC gain's 95% interval is above 0",
                           "info", notes))

    drift = stream.get("drift_after_loop")
    if isinstance(drift, Mapping) and drift.get("max_psi") is not None:
        threshold = float(stream.get("drift_psi_threshold", d.targets["drift_psi"]))
        top = next(iter((drift.get("top") or {}).items()), None)
        above = drift["max_psi"] >= threshold
        cards.append(_Card("Largest input drift (PSI) after the loop", f"{drift['max_psi']:.3f}",
                           f"{'above' if above else 'below'} the retrain threshold {threshold:g}", "info",
                           [f"largest: {top[0]}" if top else "", f"over {drift.get('features')} inputs"]))

    if d.summary.get("seconds") is not None:
        cards.append(_Card("Demo wall time", f"{float(d.summary['seconds']):.0f} s", "target: under 10 minutes",
                           "met" if float(d.summary["seconds"]) < 600 else "missed",
                           [_machine_note(d)]))
    return cards


def _machine_note(d: _Data) -> str:
    loads = d.summary.get("load_avg_1m") or {}
    if not loads:
        return "Machine load not recorded in this summary"
    peak = max(max(v) for v in loads.values())
    cpus = d.summary.get("cpus")
    return f"Load average (1 min) up to {peak:.1f}" + (f" on {cpus} CPUs" if cpus else "")


# ---------------------------------------------------------------------------- figures


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _new(width: float = 6.4, height: float = 3.6, cols: int = 1) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, cols)
    return fig, axes


def _fig_stage_seconds(d: _Data) -> tuple[Any, str] | None:
    stages = [(str(s.get("name")), float(s.get("seconds", 0.0))) for s in d.summary.get("stages", [])]
    if not stages:
        return None
    fig, ax = _new(6.4, 0.35 * len(stages) + 1.2)
    names, secs = [n for n, _ in stages][::-1], [s for _, s in stages][::-1]
    bars = ax.barh(names, secs, color=_BLUE)
    ax.bar_label(bars, labels=[f"{s:.1f} s" for s in secs], padding=3, fontsize=8)
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("stage")
    total = sum(secs)
    ax.set_title(f"Wall time per stage ({total:.0f} s in all)")
    ax.set_xlim(0, max(secs) * 1.18 if max(secs) > 0 else 1)
    slowest = max(stages, key=lambda kv: kv[1])
    return fig, f"The slowest stage is {slowest[0]} ({slowest[1] / total:.0%} of the run)." if total else ""


def _fig_latency(d: _Data) -> tuple[Any, str] | None:
    stream = d.stage("serve + loop")
    parts = stream.get("latency_by_part") or {}
    raw = d.extra.get("latency_ms") or {}
    if not parts and not raw:
        return None
    target = d.targets["stream_p99_ms"]
    fig, (ax, ax2) = _new(10.5, 3.7, cols=2)
    colors = [_BLUE, _ORANGE, _GREEN, _PURPLE]
    if raw:
        arrays = {str(k): np.asarray(v, dtype=float) for k, v in raw.items() if len(v)}
        hi = max(float(np.percentile(a, 99.9)) for a in arrays.values()) if arrays else 1.0
        bins = np.linspace(0, max(hi, target) * 1.05, 50)
        for (name, a), color in zip(arrays.items(), colors, strict=False):
            p99 = float(np.percentile(a, 99))
            ax.hist(a, bins=bins, histtype="stepfilled", alpha=0.45, color=color, label=f"{name} (n={len(a)})")
            ax.axvline(p99, color=color, ls=":", lw=1.5, label=f"{name} p99 {p99:.1f} ms")
        ax.axvline(target, color=_RED, ls="--", lw=1.5, label=f"target p99 ≤ {target:g} ms")
        ax.set_xlabel("end-to-end latency, produce → decision (ms)")
        ax.set_ylabel("transactions")
        ax.set_title("Stream latency per half")
        caption = "Histogram of every streamed transaction's latency, per half of the stream."
    else:
        names = list(parts)
        stats = ("p50_ms", "p99_ms", "max_ms")
        x = np.arange(len(names))
        for i, (stat, color) in enumerate(zip(stats, colors, strict=False)):
            vals = [float(parts[n].get(stat, np.nan)) for n in names]
            bars = ax.bar(x + (i - 1) * 0.26, vals, 0.26, color=color, label=stat.removesuffix("_ms"))
            ax.bar_label(bars, fmt="%.0f", fontsize=7, padding=2)
        ax.axhline(target, color=_RED, ls="--", lw=1.5, label=f"target p99 ≤ {target:g} ms")
        ax.set_xticks(x, names)
        ax.set_xlabel("part of the stream")
        ax.set_ylabel("latency (ms)")
        ax.set_title("Stream latency per half (percentiles)")
        caption = "Percentiles per half (this summary keeps no raw latencies, so no histogram)."
    ax.legend(fontsize=7)
    splits = [k for k in ("produced_to_picked_p99_ms", "picked_to_decided_p99_ms")
              if any(k in (p or {}) for p in parts.values())]
    if splits:
        names = list(parts)
        x = np.arange(len(names))
        for i, (key, color) in enumerate(zip(splits, (_GREY, _PURPLE), strict=False)):
            vals = [float(parts[n].get(key, np.nan)) for n in names]
            bars = ax2.bar(x + (i - 0.5) * 0.36, vals, 0.36, color=color,
                           label=key.removesuffix("_p99_ms").replace("_", " "))
            ax2.bar_label(bars, fmt="%.0f", fontsize=7, padding=2)
        ax2.set_xticks(x, names)
        ax2.set_xlabel("part of the stream")
        ax2.set_ylabel("p99 (ms)")
        ax2.set_title("Where the p99 goes (replica's split)")
        ax2.legend(fontsize=7)
        caption += " Right: the replica's p99 from produce to pickup and from pickup to decision."
    else:
        ax2.set_axis_off()
    return fig, caption + f" {d.load_text('serve + loop')}."


def _fig_confusion(d: _Data) -> tuple[Any, str] | None:
    from sklearn.metrics import ConfusionMatrixDisplay

    cm = d.confusion()
    if cm is None:
        return None
    fig, ax = _new(4.6, 3.8)
    ConfusionMatrixDisplay(cm, display_labels=["genuine", "fraud"]).plot(ax=ax, values_format="d", cmap="Blues",
                                                                          colorbar=False)
    ax.set_xlabel("decision at the operating threshold")
    ax.set_ylabel("label (unlabelled counted genuine)")
    ax.set_title("Streamed decisions: confusion matrix")
    (tn, fp), (fn, tp) = cm
    return fig, (f"{tp} frauds caught, {fn} missed, {fp} genuine declined of {tn + fp:,} genuine "
                 "(first decision per transaction, live tail of the serving bank).")


def _fig_stream_curves(d: _Data) -> tuple[Any, str] | None:
    from sklearn.metrics import PrecisionRecallDisplay, RocCurveDisplay

    y, score = d.extra.get("stream_labels"), d.extra.get("stream_scores")
    if y is None or score is None:
        return None
    y, score = np.asarray(y, dtype=bool), np.asarray(score, dtype=float)
    if len(y) != len(score) or y.all() or not y.any():
        return None
    fig, (ax, ax2) = _new(10.0, 4.0, cols=2)
    PrecisionRecallDisplay.from_predictions(y, score, ax=ax, name="served decisions", plot_chance_level=True)
    RocCurveDisplay.from_predictions(y, score, ax=ax2, name="served decisions", plot_chance_level=True)
    stream = d.stage("serve + loop")
    if stream.get("precision") is not None and stream.get("recall") is not None:
        ax.plot([stream["recall"]], [stream["precision"]], "o", color=_RED, label="operating threshold")
        ax.legend(fontsize=8, loc="lower left")
    ax.set_xlabel("recall (frauds caught)")
    ax.set_ylabel("precision (declines that are fraud)")
    ax.set_title("Precision-recall of the streamed decisions")
    ax2.set_xlabel("false positive rate")
    ax2.set_ylabel("true positive rate")
    ax2.set_title("ROC of the streamed decisions")
    ax2.legend(fontsize=8, loc="lower right")
    return fig, (f"{int(y.sum())} frauds among {len(y):,} decided transactions; the dashed line is chance "
                 "(the base rate).")


def _scenario_rows(d: _Data) -> tuple[list[str], dict[str, dict[str, float]]]:
    anomaly, fraud = d.stage("train anomaly"), d.stage("train fraud")
    series: dict[str, dict[str, float]] = {}
    for scen, v in (anomaly.get("roc_auc_by_scenario") or {}).items():
        series.setdefault("anomaly GNN (label-free)", {})[scen] = float(v)
    for key, v in fraud.items():
        if not key.startswith("test_roc_auc_") or _num(v) is None:
            continue
        rest = key.removeprefix("test_roc_auc_")
        for suffix, name in (("_central_without_merchant_risk", "fraud model, central, no merchant risk"),
                             ("_central", "fraud model, central"), ("", "fraud model, federated (served)")):
            if rest.endswith(suffix):
                series.setdefault(name, {})[rest.removesuffix(suffix) if suffix else rest] = float(v)
                break
    order = ["anomaly GNN (label-free)", "fraud model, federated (served)", "fraud model, central",
             "fraud model, central, no merchant risk"]
    series = {k: series[k] for k in order if k in series}
    scenarios = sorted({s for v in series.values() for s in v})
    return scenarios, series


def _fig_scenarios(d: _Data) -> tuple[Any, str] | None:
    scenarios, series = _scenario_rows(d)
    if not scenarios:
        return None
    fig, ax = _new(8.0, 3.9)
    width = 0.8 / len(series)
    x = np.arange(len(scenarios))
    for i, ((name, vals), color) in enumerate(zip(series.items(), (_PURPLE, _BLUE, _GREEN, _GREY), strict=False)):
        ax.bar(x + (i - (len(series) - 1) / 2) * width, [vals.get(s, np.nan) for s in scenarios], width,
               color=color, label=name)
    lo = min(v for vals in series.values() for v in vals.values())
    ax.set_ylim(max(0.0, math.floor((lo - 0.03) * 20) / 20), 1.005)
    ax.set_xticks(x, [s.replace("_", " ") for s in scenarios])
    ax.set_xlabel("fraud scenario (generator)")
    ax.set_ylabel("ROC-AUC on test cardholders")
    ax.set_title("Detection per fraud scenario")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    return fig, "ROC-AUC per scenario; the y axis starts near the lowest value. The numbers are in the table above."


def _fig_anomaly_baselines(d: _Data) -> tuple[Any, str] | None:
    anomaly = d.stage("train anomaly")
    roc = _interval(anomaly.get("fraud_roc_auc_95ci"))
    baselines = anomaly.get("baselines_roc_auc") or {}
    if roc is None and not baselines:
        return None
    rows = sorted(((str(k), float(v)) for k, v in baselines.items()), key=lambda kv: kv[1])
    fig, ax = _new(6.6, 0.3 * (len(rows) + 1) + 1.4)
    names = [k.replace("_", " ") for k, _ in rows]
    vals = [v for _, v in rows]
    ax.barh(names, vals, color=_GREY, label="label-free baselines")
    if roc is not None:
        ax.barh(["anomaly GNN (federated)"], [roc[0]], color=_BLUE,
                xerr=[[roc[0] - roc[1]], [roc[2] - roc[0]]], capsize=4, label="GNN with its 95% interval")
    target = d.targets["anomaly_roc_auc"]
    ax.axvline(target, color=_RED, ls="--", lw=1.3, label=f"target ≥ {target:g}")
    ax.axvline(0.5, color="k", lw=0.8, ls=":", label="chance")
    ax.set_xlim(0.4, 1.0)
    ax.set_xlabel("fraud ROC-AUC (test cardholders, no labels used in training)")
    ax.set_ylabel("scorer")
    ax.set_title("Anomaly GNN against label-free baselines")
    ax.legend(fontsize=7, loc="lower right")
    return fig, f"{anomaly.get('test_frauds')} test frauds; the GNN's bar carries its bootstrap 95% interval."


def _fig_fl_vs_local(d: _Data) -> tuple[Any, str] | None:
    fraud = d.stage("train fraud")
    metrics = [("pr_auc", "PR-AUC"), ("recall_at_fpr", "recall at the FPR target")]
    got = {label: (_num(fraud.get(f"bank0_federation_{m}")), _num(fraud.get(f"bank0_local_{m}")))
           for m, label in metrics}
    got = {k: v for k, v in got.items() if None not in v}
    if not got:
        return None
    fig, ax = _new(6.0, 3.6)
    x = np.arange(len(got))
    for i, (name, color) in enumerate((("federated", _BLUE), ("Local (bank 0 alone)", _GREY))):
        bars = ax.bar(x + (i - 0.5) * 0.38, [v[i] for v in got.values()], 0.38, color=color, label=name)
        ax.bar_label(bars, fmt="%.3f", fontsize=8, padding=2)
    ax.set_xticks(x, list(got))
    ax.set_ylim(0, 1.08)
    ax.set_xlabel("metric on bank 0's test cardholders")
    ax.set_ylabel("value")
    ax.set_title("Fraud model: what joining the federation buys bank 0")
    ax.legend(fontsize=8, loc="upper right")
    frauds = fraud.get("bank0_test_frauds")
    return fig, (f"On {frauds} test frauds of bank 0." if frauds is not None else
                 "Bank 0's test frauds are not recorded in this summary.")


def _fig_policy(d: _Data) -> tuple[Any, str] | None:
    stream = d.stage("serve + loop")
    policy = stream.get("policy")
    if not isinstance(policy, Mapping):
        return None
    figures = _policy_figures(policy)
    if figures is None:
        return None
    pr = figures["pr_auc"]
    cycle = stream.get("cycle") or {}
    fig, (ax, ax2) = _new(10.0, 3.4, cols=2)
    names = ["champion (served)", f"challenger {cycle.get('fraud', '')} (shadow)".replace("  ", " ")]
    bars = ax.bar(names, [pr["champion"], pr["challenger"]], color=[_GREY, _ORANGE])
    ax.bar_label(bars, fmt="%.3f", fontsize=8, padding=2)
    ax.set_ylim(0, 1.1)
    ax.set_xlabel("model")
    ax.set_ylabel("PR-AUC on the shadowed, labelled half")
    ax.set_title("Champion and challenger on the same transactions")
    rows = [("PR-AUC", pr)]
    if "recall_at_fpr" in figures:
        rows.append(("recall at FPR target", figures["recall_at_fpr"]))
    for i, (_, f) in enumerate(rows):
        lo, hi = f["difference_95ci"]
        color = _GREEN if lo > 0 else (_RED if hi < 0 else _GREY)
        ax2.errorbar([f["difference"]], [i], xerr=[[f["difference"] - lo], [hi - f["difference"]]], fmt="o",
                     color=color, capsize=5, lw=2)
        ax2.annotate(f"{f['difference']:+.3f} [{lo:+.3f}, {hi:+.3f}]", (f["difference"], i), xytext=(6, 8),
                     textcoords="offset points", ha="left", fontsize=8)
    ax2.axvline(0, color="k", lw=1, ls="--")
    ax2.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax2.set_ylim(-0.7, len(rows) - 0.3)
    ax2.set_xlabel("challenger − champion (95% cardholder-bootstrap interval)")
    ax2.set_ylabel("metric")
    ax2.set_title(f"Policy verdict: {policy.get('action')}")
    frauds = figures.get("frauds")
    return fig, ("The policy promotes only when the PR-AUC gain's interval lies above zero"
                 + (f"; {frauds} labelled frauds were scored by both." if frauds is not None else "."))


def _fig_drift(d: _Data) -> tuple[Any, str] | None:
    stream = d.stage("serve + loop")
    snaps = {label: stream.get(key) for key, label in (("drift_after_champion", "after the first half (champion)"),
                                                      ("drift_after_loop", "after the whole loop"))}
    snaps = {k: v for k, v in snaps.items() if isinstance(v, Mapping) and v.get("top")}
    if not snaps:
        return None
    features: list[str] = []
    for snap in snaps.values():
        features += [f for f in snap["top"] if f not in features]
    fig, ax = _new(6.8, 3.6)
    x = np.arange(len(features))
    width = 0.8 / len(snaps)
    for i, ((label, snap), color) in enumerate(zip(snaps.items(), (_BLUE, _ORANGE), strict=False)):
        vals = [snap["top"].get(f, np.nan) for f in features]
        bars = ax.bar(x + (i - (len(snaps) - 1) / 2) * width, vals, width, color=color, label=label)
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=2)
    threshold = float(stream.get("drift_psi_threshold", d.targets["drift_psi"]))
    ax.axhline(0.1, color=_GREY, ls=":", lw=1.2, label="0.1: watch")
    ax.axhline(threshold, color=_RED, ls="--", lw=1.3, label=f"{threshold:g}: retrain threshold")
    ax.set_xticks(x, features)
    ax.set_ylim(0, max(threshold * 1.25, max(max(s["top"].values()) for s in snaps.values()) * 1.2))
    ax.set_xlabel("fraud-model input")
    ax.set_ylabel("PSI against the training reference")
    ax.set_title("Drift of the live inputs over time")
    ax.legend(fontsize=7, loc="upper right")
    n = next(iter(snaps.values())).get("features")
    return fig, (f"The three largest PSIs of {n} inputs at each snapshot (a missing bar: not among that snapshot's "
                 "three largest).")


def _fig_rejects(d: _Data) -> tuple[Any, str] | None:
    ingest, stream = d.stage("ingest"), d.stage("serve + loop")
    rejects = {str(k): int(v) for k, v in (ingest.get("rejects_by_reason") or {}).items()}
    dlq = stream.get("dlq_by_reason")
    caption = ""
    if isinstance(dlq, Mapping):
        dead = {str(k): int(v) for k, v in dlq.items()}
    else:
        reasons = [str(r) for r in stream.get("dlq_reasons") or []]
        # the summary keeps the distinct reasons; with as many dead letters as reasons, each reason occurred once
        dead = {r: 1 for r in reasons} if len(reasons) == stream.get("dead_lettered") else {}
        if reasons and not dead:
            caption = f" Dead-letter counts per reason not recorded; reasons: {', '.join(reasons)}."
    if not rejects and not dead:
        return None
    fig, (ax, ax2) = _new(10.0, 3.3, cols=2)
    for axis, counts, color, title, xlabel in (
            (ax, rejects, _ORANGE, f"Ingest: {ingest.get('rejected', sum(rejects.values()))} rows rejected",
             "reject reason (raw CSV)"),
            (ax2, dead, _RED, f"Stream: {stream.get('dead_lettered', sum(dead.values()))} records dead-lettered",
             "dead-letter reason (fraud-dlq)")):
        if counts:
            bars = axis.bar(list(counts), list(counts.values()), color=color)
            axis.bar_label(bars, fontsize=8, padding=2)
            axis.set_ylim(0, max(counts.values()) * 1.25)
            axis.tick_params(axis="x", rotation=20)
        axis.yaxis.get_major_locator().set_params(integer=True)
        axis.set_xlabel(xlabel)
        axis.set_ylabel("records")
        axis.set_title(title)
    return fig, ("Corrupt rows appended on purpose to the raw CSV and poison records put on the topic: each is "
                 "rejected with its reason, none stops the pipeline." + caption)


def _fig_rounds(d: _Data) -> tuple[Any, str] | None:
    anomaly = d.stage("train anomaly")
    rounds = d.extra.get("seconds_per_round", anomaly.get("seconds_per_round"))
    secs = [float(s) for s in (rounds.values() if isinstance(rounds, Mapping) else rounds if rounds is not None
                               else [])]
    if not secs:
        return None
    fig, ax = _new(6.0, 3.3)
    bars = ax.bar(np.arange(1, len(secs) + 1), secs, color=_BLUE)
    ax.bar_label(bars, fmt="%.1f", fontsize=7, padding=2)
    ax.set_xticks(np.arange(1, len(secs) + 1))
    ax.set_xlabel("federated round")
    ax.set_ylabel("wall time (s)")
    ax.set_title(f"Anomaly GNN: seconds per federated round ({anomaly.get('banks', '?')} banks)")
    return fig, (f"{len(secs)} rounds, {sum(secs):.0f} s of the stage's {anomaly.get('seconds', '?')} s; "
                 f"{d.load_text('train anomaly')}.")


def _fig_generated(d: _Data) -> tuple[Any, str] | None:
    gen = d.stage("generate")
    scen = gen.get("scenarios") or {}
    if not scen:
        return None
    fig, ax = _new(6.0, 3.2)
    names = [str(k).replace("_", " ") for k in scen]
    bars = ax.bar(names, [int(v) for v in scen.values()], color=_PURPLE)
    ax.bar_label(bars, fontsize=8, padding=2)
    ax.set_xlabel("fraud scenario")
    ax.set_ylabel("fraudulent transactions")
    ax.set_title("Generated frauds per scenario")
    ax.tick_params(axis="x", rotation=15)
    tx, fr = gen.get("transactions"), gen.get("fraud")
    return fig, (f"{_fmt(fr)} frauds in {_fmt(tx)} transactions ({int(fr) / int(tx):.2%}) over {gen.get('banks')} "
                 "banks." if tx and fr is not None else "")


# ---------------------------------------------------------------------------- page


def _sections(d: _Data, skipped: list[str]) -> list[_Section]:
    def draw(sec: _Section, fid: str, title: str, make: Callable[[_Data], tuple[Any, str] | None]) -> None:
        made = make(d)
        if made is None:
            skipped.append(title)
            return
        fig, caption = made
        sec.figures.append(_Figure(fid, title, caption, _png(fig)))

    stream = d.stage("serve + loop")
    sec_stream = _Section("stream", "The stream",
                          "The serving bank's held-out tail replayed through Kafka and Ray Serve: the champion alone "
                          "for the first half, the retrained challenger shadowing it in the second.")
    draw(sec_stream, "latency", "Stream latency per half", _fig_latency)
    draw(sec_stream, "confusion", "Confusion matrix at the operating threshold", _fig_confusion)
    draw(sec_stream, "stream-curves", "PR and ROC curves of the streamed decisions", _fig_stream_curves)

    sec_models = _Section("models", "The models")
    scenarios, series = _scenario_rows(d)
    if scenarios:
        counts = d.stage("generate").get("scenarios") or {}
        header = ["scenario", *(["frauds generated"] if counts else []), *series]
        rows = [[s.replace("_", " "), *([_fmt(counts.get(s))] if counts else []),
                 *(f"{series[n][s]:.3f}" if s in series[n] else "–" for n in series)] for s in scenarios]
        sec_models.table = {"header": header, "rows": rows}
        sec_models.intro = "Test ROC-AUC per fraud scenario: the label-free anomaly GNN and the supervised fraud model."
    draw(sec_models, "scenarios", "Detection per fraud scenario", _fig_scenarios)
    draw(sec_models, "anomaly", "Anomaly GNN against label-free baselines", _fig_anomaly_baselines)
    draw(sec_models, "fl-local", "Federated against Local", _fig_fl_vs_local)
    draw(sec_models, "generated", "Generated frauds per scenario", _fig_generated)

    sec_loop = _Section("loop", "The retraining loop")
    policy = stream.get("policy")
    if isinstance(policy, Mapping):
        sec_loop.reason = f"Policy: {policy.get('action')}. {policy.get('reason', '')}"
    draw(sec_loop, "policy", "Champion / challenger and the policy's interval", _fig_policy)
    draw(sec_loop, "drift", "Input drift", _fig_drift)

    sec_data = _Section("data", "Data quality and privacy")
    merchant = d.stage("merchant risk")
    for flagged in merchant.get("flagged_merchants") or []:
        sec_data.items.append(f"flagged merchant: {flagged}")
    if merchant.get("breached_by_generator") is not None:
        sec_data.items.append("breached by the generator: " + (", ".join(merchant["breached_by_generator"]) or "none")
                              + "; of them flagged: " + (", ".join(merchant.get("breached_flagged") or []) or "none"))
    if merchant.get("guarantee"):
        sec_data.items.append(f"merchant-risk guarantee: {merchant['guarantee']}")
    draw(sec_data, "rejects", "Rejected rows and dead letters by reason", _fig_rejects)

    sec_time = _Section("time", "Where the time went")
    draw(sec_time, "stage-seconds", "Wall time per stage", _fig_stage_seconds)
    draw(sec_time, "rounds", "Seconds per federated round", _fig_rounds)
    return [s for s in (sec_stream, sec_models, sec_loop, sec_data, sec_time)
            if s.figures or s.table or s.items or s.reason]


def _stage_rows(d: _Data) -> list[dict[str, Any]]:
    rows = []
    for s in d.summary.get("stages", []):
        items = [(str(k), _inline(v)) for k, v in s.items() if k not in ("name", "seconds")]
        rows.append({"name": s.get("name"), "seconds": _fmt(_num(s.get("seconds")) or 0.0, 1), "figures": items})
    return rows


def _environment() -> Any:
    from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

    return Environment(loader=FileSystemLoader(Path(__file__).with_name("templates")),
                       autoescape=select_autoescape(["html"]), undefined=StrictUndefined,
                       trim_blocks=True, lstrip_blocks=True)


def render_report(summary: Mapping[str, Any], path: Path, extra: Mapping[str, Any] | None = None) -> Path:
    """Write the demo report for ``summary`` (the mapping of ``summary.json``) to ``path`` and return ``path``.

    ``extra`` adds what a summary does not keep (see the module's docstring); every figure it cannot draw for lack
    of data is named in the appendix instead.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)  # figures are drawn off screen (matplotlib.figure.Figure, no pyplot state)
    clean = scrub(summary)
    d = _Data(clean, {k: v for k, v in (extra or {}).items() if v is not None})
    skipped: list[str] = []
    sections = _sections(d, skipped)
    loads = clean.get("load_avg_1m") or {}
    page = _environment().get_template("report.html").render(
        total_seconds=f"{float(clean.get('seconds', 0.0)):.0f} s",
        out=str(clean.get("out", "")),
        load_note=_machine_note(d) if loads else "",
        cards=_cards(d),
        sections=sections,
        stages=_stage_rows(d),
        skipped=skipped,
        summary_json=json.dumps(clean, indent=2, default=str, ensure_ascii=False),
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


def render_saved(summary_json: Path, path: Path | None = None) -> Path:
    """Render ``summary.json`` of a finished run (no raw arrays: percentiles instead of histograms)."""
    summary = json.loads(Path(summary_json).read_text(encoding="utf-8"))
    return render_report(summary, path or Path(summary_json).with_name("report.html"))

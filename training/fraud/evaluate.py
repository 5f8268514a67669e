"""The stacking study (thesis Table 4.2): local / federated / centralized, each with and without AS.

Every model is scored on each bank's **test** cardholders (never seen in
training, threshold selection, or anomaly-model training). Per-bank numbers
are averaged over banks with their standard deviation; the pooled row scores
all banks' test rows together (more frauds, less noise). Differences are in
points (1 point = 0.01).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np

from training.fraud.config import FraudConfig
from training.fraud.features import ANOMALY_FEATURE, FraudFeatures
from training.fraud.metrics import ClassificationMetrics, classification_metrics
from training.fraud.model import FraudModel
from training.fraud.train import train_centralized, train_federated, train_local

__all__ = ["VARIANTS", "StackingReport", "evaluate_model", "run_stacking"]

logger = logging.getLogger(__name__)

#: Column key → (training, uses AS); the order of the printed tables.
VARIANTS: dict[str, tuple[str, bool]] = {
    "Local": ("local", False),
    "Local+AS": ("local", True),
    "FL": ("federated", False),
    "FL+AS": ("federated", True),
    "Central": ("centralized", False),
    "Central+AS": ("centralized", True),
}
#: Targets of the issue, in PR-AUC points.
STACKING_TARGET = 2.0
FEDERATED_GAP_TARGET = 2.0


def evaluate_model(model: FraudModel, data: FraudFeatures, max_fpr: float) -> ClassificationMetrics:
    """Metrics of ``model`` at its own threshold on labelled rows."""
    if not data.has_labels:
        raise ValueError("evaluation needs labelled rows")
    return classification_metrics(data.label, model.scores(data.X), model.threshold, max_fpr)


def _mean_std(values: list[float]) -> tuple[float, float]:
    arr = np.asarray([v for v in values if math.isfinite(v)], dtype=np.float64)
    if arr.size == 0:
        return math.nan, math.nan
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0


@dataclass(frozen=True)
class StackingReport:
    """Per-bank and pooled test metrics of the six variants, plus what explains them."""

    per_bank: dict[int, dict[str, ClassificationMetrics]]
    pooled: dict[str, ClassificationMetrics]
    importance: dict[str, dict[str, float]]
    info: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for bank, row in self.per_bank.items():
            if set(row) != set(VARIANTS):
                raise ValueError(f"bank {bank} lacks variants {sorted(set(VARIANTS) - set(row))}")
        if set(self.pooled) != set(VARIANTS):
            raise ValueError("pooled metrics must cover every variant")

    def diff(self, metric: str, a: str, b: str) -> tuple[float, float]:
        """Mean and std over banks of ``metric(a) − metric(b)``, in points."""
        return _mean_std([100 * (getattr(r[a], metric) - getattr(r[b], metric)) for r in self.per_bank.values()])

    def pooled_diff(self, metric: str, a: str, b: str) -> float:
        return 100 * (getattr(self.pooled[a], metric) - getattr(self.pooled[b], metric))

    def targets(self) -> dict[str, tuple[float, bool]]:
        """The issue's two targets: (measured value in points, met?) on the per-bank mean."""
        gain, _ = self.diff("pr_auc", "FL+AS", "FL")
        gap, _ = self.diff("pr_auc", "Central+AS", "FL+AS")
        return {
            f"AS improves FL PR-AUC by >= {STACKING_TARGET:g} points": (gain, gain >= STACKING_TARGET),
            f"FL+AS within {FEDERATED_GAP_TARGET:g} points PR-AUC of Central+AS": (
                gap, abs(gap) <= FEDERATED_GAP_TARGET
            ),
        }

    def _table(self, metric: str, title: str) -> list[str]:
        cols = list(VARIANTS)
        lines = [f"**{title}** (test cardholders)", "",
                 "| bank | frauds | " + " | ".join(cols) + " | FL+AS − FL |",
                 "|---|---:|" + "---:|" * (len(cols) + 1)]
        for bank, row in sorted(self.per_bank.items()):
            values = [getattr(row[c], metric) for c in cols]
            delta = 100 * (getattr(row["FL+AS"], metric) - getattr(row["FL"], metric))
            lines.append(f"| {bank} | {row['FL'].n_pos} | " + " | ".join(f"{v:.3f}" for v in values)
                         + f" | {delta:+.1f} |")
        means = [_mean_std([getattr(r[c], metric) for r in self.per_bank.values()]) for c in cols]
        d_mean, d_std = self.diff(metric, "FL+AS", "FL")
        lines.append("| mean ± std | | " + " | ".join(f"{m:.3f} ± {s:.3f}" for m, s in means)
                     + f" | {d_mean:+.1f} ± {d_std:.1f} |")
        pooled = [getattr(self.pooled[c], metric) for c in cols]
        lines.append(f"| pooled | {self.pooled['FL'].n_pos} | " + " | ".join(f"{v:.3f}" for v in pooled)
                     + f" | {self.pooled_diff(metric, 'FL+AS', 'FL'):+.1f} |")
        return lines + [""]

    def to_markdown(self) -> str:
        """The block for ``docs/benchmarks.md``."""
        info = self.info
        lines = [
            "### Fraud model: anomaly-score stacking (thesis Table 4.2)",
            "",
            f"Data: {info.get('data', '?')}; banks={len(self.per_bank)}; rows={info.get('rows', '?')}; "
            f"frauds={info.get('frauds', '?')}; AS coverage={info.get('as_coverage', float('nan')):.3f} "
            f"(share of rows with an anomaly score; first transactions have none); anomaly model "
            f"{info.get('anomaly_model', 'none')}; federated: FedXgbBagging, {info.get('rounds', '?')} rounds; "
            f"wall {info.get('seconds', float('nan')):.0f} s.",
            "",
        ]
        lines += self._table("f1", "F1 at the validation-chosen threshold")
        lines += self._table("pr_auc", "PR-AUC (average precision)")
        lines += self._table("recall_at_fpr", f"Recall at {100 * float(info.get('fpr', 0.01)):g}% FPR")
        lines += ["**Summary** (points; mean ± std over banks, pooled in brackets)", "",
                  "| comparison | F1 | PR-AUC | recall@FPR |", "|---|---:|---:|---:|"]
        for label, a, b in (
            ("stacking gain FL+AS − FL", "FL+AS", "FL"),
            ("stacking gain Local+AS − Local", "Local+AS", "Local"),
            ("stacking gain Central+AS − Central", "Central+AS", "Central"),
            ("federated gap Central+AS − FL+AS", "Central+AS", "FL+AS"),
            ("federated gain FL − Local", "FL", "Local"),
            ("federated gain FL+AS − Local+AS", "FL+AS", "Local+AS"),
        ):
            cells = []
            for metric in ("f1", "pr_auc", "recall_at_fpr"):
                m, s = self.diff(metric, a, b)
                cells.append(f"{m:+.1f} ± {s:.1f} [{self.pooled_diff(metric, a, b):+.1f}]")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines += ["", "**Targets**", ""]
        for name, (value, met) in self.targets().items():
            lines.append(f"- {name}: measured {value:+.1f} → {'met' if met else 'NOT met'}")
        lines += ["", "**Share of total gain of the anomaly score** (rank among features)", ""]
        for variant, imp in self.importance.items():
            if ANOMALY_FEATURE in imp:
                rank = list(imp).index(ANOMALY_FEATURE) + 1
                top = ", ".join(f"{k} {v:.2f}" for k, v in list(imp.items())[:4])
                lines.append(f"- {variant}: {imp[ANOMALY_FEATURE]:.3f} (rank {rank}/{len(imp)}); top: {top}")
        return "\n".join(lines) + "\n"


def run_stacking(banks: dict[int, FraudFeatures], cfg: FraudConfig, num_cpus: int = 2,
                 rounds: int | None = None, info: dict[str, object] | None = None) -> StackingReport:
    """Train all six variants on the banks' train/valid cardholders and score each bank's test cardholders."""
    unlabelled = [b for b, d in banks.items() if not d.has_labels]
    if unlabelled:
        raise ValueError(f"evaluation needs labels; banks {unlabelled} have rows without is_fraud")
    started = time.perf_counter()
    tests = {b: d.of_split("test") for b, d in banks.items()}
    models: dict[str, dict[int, FraudModel]] = {}
    for key, (variant, use_as) in VARIANTS.items():
        if variant == "local":
            models[key] = {b: train_local(d, use_as, cfg, b) for b, d in banks.items()}
        elif variant == "centralized":
            central = train_centralized(banks, use_as, cfg)
            models[key] = dict.fromkeys(banks, central)
    federated = train_federated(banks, cfg, ("base", "as"), num_cpus=num_cpus, rounds=rounds)
    models["FL"] = dict.fromkeys(banks, federated["base"])
    models["FL+AS"] = dict.fromkeys(banks, federated["as"])

    per_bank: dict[int, dict[str, ClassificationMetrics]] = {b: {} for b in banks}
    pooled: dict[str, ClassificationMetrics] = {}
    for key in VARIANTS:
        labels, scores, thresholds = [], [], []
        for b, test in tests.items():
            model = models[key][b]
            per_bank[b][key] = evaluate_model(model, test, cfg.fpr_target)
            labels.append(test.label)
            scores.append(model.scores(test.X))
            thresholds.append(np.full(len(test), model.threshold))
        # pooled: each row judged by its own bank's model and threshold (local models differ per bank)
        y, s, t = np.concatenate(labels), np.concatenate(scores), np.concatenate(thresholds)
        pooled_at_threshold = classification_metrics(y, s - t + 0.5, 0.5, cfg.fpr_target)
        threshold_free = classification_metrics(y, s, 0.5, cfg.fpr_target)
        pooled[key] = ClassificationMetrics(
            f1=pooled_at_threshold.f1, precision=pooled_at_threshold.precision, recall=pooled_at_threshold.recall,
            pr_auc=threshold_free.pr_auc, recall_at_fpr=threshold_free.recall_at_fpr, threshold=math.nan,
            n=threshold_free.n, n_pos=threshold_free.n_pos,
        )
    importance = {key: models[key][next(iter(banks))].feature_importance() for key in ("FL+AS", "Central+AS")}
    meta = {"seconds": time.perf_counter() - started, "rounds": rounds or cfg.federated_rounds,
            "fpr": cfg.fpr_target, **(info or {})}
    report = StackingReport(per_bank, pooled, importance, meta)
    for name, (value, met) in report.targets().items():
        logger.info("stacking_target name=%r value=%.2f met=%s", name, value, met)
    return report

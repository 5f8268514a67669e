"""Fraud metrics and the one decision-threshold rule, shared by local, centralized and federated models.

PR-AUC, F1 and recall at a false-positive rate are scikit-learn's; what it lacks is here. Threshold rule: the
score threshold that maximises F1 on validation data
(training cardholders held out by a hash of the cardholder). It is computed
from per-threshold counts of positives and negatives, so the same function
serves exact scores (local, centralized) and the summed score histograms that
banks send in federated training (only counts leave a bank).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from sklearn import metrics

__all__ = [
    "ClassificationMetrics",
    "best_f1_threshold",
    "classification_metrics",
    "f1_score",
    "pr_auc",
    "recall_at_fpr",
    "score_histograms",
    "threshold_from_counts",
    "threshold_from_histograms",
]


def _check(y: np.ndarray, s: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    y = np.asarray(y).astype(bool).ravel()
    if s is None:
        return y, None
    s = np.asarray(s, dtype=np.float64).ravel()
    if s.shape != y.shape:
        raise ValueError(f"labels {y.shape} and scores {s.shape} differ in length")
    if not np.all(np.isfinite(s)):
        raise ValueError("scores must be finite")
    return y, s


def f1_score(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """F1 of boolean predictions (scikit-learn's); 0 when there are no true and no predicted positives."""
    y, _ = _check(y_true)
    return float(metrics.f1_score(y, np.asarray(y_pred).astype(bool).ravel(), zero_division=0.0))


def pr_auc(y_true: np.ndarray, scores: np.ndarray) -> float:
    """Area under the precision-recall curve as average precision (scikit-learn's ``average_precision_score``:
    tied scores form one threshold, no interpolation); NaN when there are no positives.
    """
    y, s = _check(y_true, scores)
    return float(metrics.average_precision_score(y, s)) if y.any() else float("nan")


def recall_at_fpr(y_true: np.ndarray, scores: np.ndarray, max_fpr: float = 0.01) -> float:
    """Highest recall of any threshold ``score >= t`` whose false-positive rate is at most ``max_fpr``
    (read off scikit-learn's ``roc_curve``); NaN when there are no positives.
    """
    y, s = _check(y_true, scores)
    if not y.any():
        return float("nan")
    if y.all():
        return 1.0  # no negatives: no threshold has a false positive
    fpr, tpr, _ = metrics.roc_curve(y, s, drop_intermediate=False)
    return float(tpr[fpr <= max_fpr].max())


def threshold_from_counts(thresholds: np.ndarray, pos_at_or_above: np.ndarray, neg_at_or_above: np.ndarray,
                          n_pos: int) -> tuple[float, float]:
    """The threshold (and its F1) maximising F1, from counts of positives/negatives scoring ``>= t``.

    Ties in F1 go to the highest threshold (fewest alerts). With no positives
    the threshold is 1.0 (alert on nothing distinguishable) and F1 is 0.
    """
    t = np.asarray(thresholds, dtype=np.float64)
    tp = np.asarray(pos_at_or_above, dtype=np.float64)
    fp = np.asarray(neg_at_or_above, dtype=np.float64)
    if n_pos <= 0 or t.size == 0:
        return 1.0, 0.0
    f1 = np.where(tp + fp + n_pos > 0, 2 * tp / (tp + fp + n_pos), 0.0)
    best = np.flatnonzero(f1 == f1.max())
    i = int(best[np.argmax(t[best])])
    return float(t[i]), float(f1[i])


def best_f1_threshold(y_true: np.ndarray, scores: np.ndarray) -> tuple[float, float]:
    """Exact max-F1 threshold over the distinct scores (decision: ``score >= threshold``)."""
    y, s = _check(y_true, scores)
    assert s is not None
    if s.size == 0:
        return 1.0, 0.0
    order = np.argsort(-s, kind="stable")
    s, y = s[order], y[order]
    last_of_tie = np.r_[np.flatnonzero(np.diff(s)), s.size - 1]
    return threshold_from_counts(s[last_of_tie], np.cumsum(y)[last_of_tie], np.cumsum(~y)[last_of_tie], int(y.sum()))


def score_histograms(y_true: np.ndarray, scores: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Counts of positive and negative scores in ``bins`` equal bins of [0, 1] (what a bank sends)."""
    y, s = _check(y_true, scores)
    assert s is not None
    idx = np.clip((s * bins).astype(np.int64), 0, bins - 1)
    return np.bincount(idx[y], minlength=bins), np.bincount(idx[~y], minlength=bins)


def threshold_from_histograms(pos_hist: np.ndarray, neg_hist: np.ndarray) -> tuple[float, float]:
    """Max-F1 threshold from summed score histograms: the lower edge of the best bin."""
    pos = np.asarray(pos_hist, dtype=np.float64)
    neg = np.asarray(neg_hist, dtype=np.float64)
    if pos.shape != neg.shape or pos.ndim != 1:
        raise ValueError("histograms must be 1-d and of equal length")
    bins = pos.size
    edges = np.arange(bins, dtype=np.float64) / bins
    # counts at or above the lower edge of each bin: reverse cumulative sums
    tp = np.cumsum(pos[::-1])[::-1]
    fp = np.cumsum(neg[::-1])[::-1]
    return threshold_from_counts(edges, tp, fp, int(pos.sum()))


@dataclass(frozen=True)
class ClassificationMetrics:
    """Metrics of one model on one labelled set at its decision threshold."""

    f1: float
    precision: float
    recall: float
    pr_auc: float
    recall_at_fpr: float
    threshold: float
    n: int
    n_pos: int

    def __post_init__(self) -> None:
        if self.n < 0 or not 0 <= self.n_pos <= self.n:
            raise ValueError("need 0 <= n_pos <= n")

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def classification_metrics(y_true: np.ndarray, scores: np.ndarray, threshold: float,
                           max_fpr: float = 0.01) -> ClassificationMetrics:
    """F1/precision/recall at ``threshold`` plus the threshold-free PR-AUC and recall at ``max_fpr``."""
    y, s = _check(y_true, scores)
    assert s is not None
    pred = s >= threshold
    tp = int(np.sum(y & pred))
    return ClassificationMetrics(
        f1=f1_score(y, pred),
        precision=tp / int(pred.sum()) if pred.any() else 0.0,
        recall=tp / int(y.sum()) if y.any() else float("nan"),
        pr_auc=pr_auc(y, s),
        recall_at_fpr=recall_at_fpr(y, s, max_fpr),
        threshold=float(threshold),
        n=int(y.size),
        n_pos=int(y.sum()),
    )

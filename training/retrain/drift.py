"""Population stability index of each fraud-model input and score, against the champion's training reference.

PSI = Σ_b (a_b − e_b) · ln(a_b / e_b) over bins b, with ``e`` the share of the
training rows in bin b and ``a`` the share of the live window. The bins are
the reference's deciles (plus one bin for NaN: a missing anomaly score is a
state of its own), so every bin holds ~10 % of the reference and the usual
reading applies: < 0.1 stable, 0.1–0.25 watch, > 0.25 act.

Why not a library: the hot path already holds each micro-batch's feature
matrix, and PSI needs only per-bin counts. Counting is one ``searchsorted``
per column per micro-batch (~20 columns), a few microseconds; evidently or
alibi-detect would pull pandas-heavy report code into the scorer for the
same number. The reference is built where the model is trained, from the
bank's own training rows, and stored with the model version.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

import numpy as np

__all__ = ["DRIFT_FILE", "DriftMonitor", "DriftReference", "psi"]

#: File name of the reference inside a fraud model version.
DRIFT_FILE = "drift_reference.json"
#: Share floor of an empty bin (keeps ln finite; the usual 1e-4).
_FLOOR = 1e-4


def psi(expected: np.ndarray, actual: np.ndarray) -> float:
    """PSI of two bin-count (or share) vectors of the same bins."""
    e = np.asarray(expected, dtype=np.float64)
    a = np.asarray(actual, dtype=np.float64)
    if e.sum() <= 0 or a.sum() <= 0:
        return float("nan")
    e = np.maximum(e / e.sum(), _FLOOR)
    a = np.maximum(a / a.sum(), _FLOOR)
    return float(np.sum((a - e) * np.log(a / e)))


@dataclass(frozen=True)
class DriftReference:
    """Per column: interior bin edges (reference quantiles) and the reference share of each bin (+ NaN bin)."""

    names: tuple[str, ...]
    edges: tuple[np.ndarray, ...]
    shares: tuple[np.ndarray, ...]
    rows: int

    @classmethod
    def from_matrix(cls, names: tuple[str, ...] | list[str], X: np.ndarray, bins: int = 10) -> DriftReference:
        """Deciles (``bins`` quantile bins) of each column of ``X`` (rows of the training window)."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != len(names):
            raise ValueError(f"X must be [n, {len(names)}], got {X.shape}")
        edges, shares = [], []
        for j in range(X.shape[1]):
            col = X[:, j]
            finite = col[np.isfinite(col)]
            e = np.unique(np.quantile(finite, np.linspace(0, 1, bins + 1)[1:-1])) if finite.size else np.zeros(0)
            edges.append(e)
            shares.append(_counts(col, e) / max(len(col), 1))
        return cls(tuple(names), tuple(edges), tuple(shares), int(X.shape[0]))

    def counts(self, X: np.ndarray) -> list[np.ndarray]:
        """Bin counts of each column of ``X`` in this reference's bins."""
        return [_counts(X[:, j], e) for j, e in enumerate(self.edges)]

    def to_json(self) -> dict[str, object]:
        return {"names": list(self.names), "rows": self.rows, "edges": [e.tolist() for e in self.edges],
                "shares": [s.tolist() for s in self.shares]}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> DriftReference:
        names = tuple(str(n) for n in data["names"])  # type: ignore[union-attr]
        edges = tuple(np.asarray(e, dtype=np.float64) for e in data["edges"])  # type: ignore[union-attr]
        shares = tuple(np.asarray(s, dtype=np.float64) for s in data["shares"])  # type: ignore[union-attr]
        if not len(names) == len(edges) == len(shares):
            raise ValueError("drift reference: names, edges and shares differ in length")
        return cls(names, edges, shares, int(data.get("rows", 0)))  # type: ignore[call-overload]


def _counts(col: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Counts of ``col`` in the bins cut at ``edges`` (len(edges)+1 bins) and one last bin for NaN/inf."""
    col = np.asarray(col, dtype=np.float64)
    ok = np.isfinite(col)
    idx = np.searchsorted(edges, col[ok], side="right")
    out = np.bincount(idx, minlength=len(edges) + 1).astype(np.float64)
    return np.r_[out, float((~ok).sum())]


class DriftMonitor:
    """Bin counts of the last ``window_rows`` live rows (whole micro-batches) and their PSI per column.

    ``observe`` runs on the hot path (one call per micro-batch); ``psi`` runs
    on a scrape. Both take a lock, held for microseconds.
    """

    def __init__(self, reference: DriftReference, window_rows: int = 5000, min_rows: int = 500) -> None:
        self.reference = reference
        self.window_rows = window_rows
        self.min_rows = min_rows
        self._batches: deque[tuple[int, list[np.ndarray]]] = deque()
        self._totals = [np.zeros_like(s) for s in reference.shares]
        self._rows = 0
        self._lock = threading.Lock()

    @property
    def rows(self) -> int:
        return self._rows

    def observe(self, X: np.ndarray) -> None:
        """Add one micro-batch (columns in ``reference.names`` order); drop the oldest beyond the window."""
        if not len(X):
            return
        counts = self.reference.counts(X)
        with self._lock:
            self._batches.append((len(X), counts))
            for t, c in zip(self._totals, counts, strict=True):
                t += c
            self._rows += len(X)
            while self._batches and self._rows - self._batches[0][0] >= self.window_rows:
                n, old = self._batches.popleft()
                for t, c in zip(self._totals, old, strict=True):
                    t -= c
                self._rows -= n

    def psi(self) -> dict[str, float]:
        """PSI of each column over the window; empty until ``min_rows`` live rows were seen."""
        with self._lock:
            if self._rows < self.min_rows:
                return {}
            return {name: psi(ref, tot) for name, ref, tot in
                    zip(self.reference.names, self.reference.shares, self._totals, strict=True)}

"""Scoring one transaction at a time with a GNN fraud model: the bank's recent past, kept incrementally.

The offline graph (:mod:`.graph`) links a transaction to the k latest earlier transactions of its cardholder and
of its merchant, and the model reads the mean over each relation path of length 1..L (:func:`.model.node_inputs`).
Every one of those means only looks backwards, so it can be kept as a stream goes by: per cardholder and per
merchant, the k latest transactions, each with its transformed row and its own means over the paths of length
1..L−1. A new transaction's mean over the path (r, rest) is the mean, over its r-neighbours, of their stored mean
over ``rest``: the offline value, computed from O(k) stored vectors. Transactions must arrive in the offline
replay order (timestamp, then transaction id) for the scores to equal the offline ones (the test checks this).

This is the state serving would keep per bank; the Ray Serve app does not use it yet (it decides with the
XGBoost model, kind ``fraud``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np
import torch

from fedfraud.training.fraud.gnn.artifact import GnnFraudModel
from fedfraud.training.fraud.gnn.graph import RELATIONS
from fedfraud.training.fraud.gnn.model import transformed_rows

__all__ = ["OnlineGraphScorer"]


class OnlineGraphScorer:
    """A bank's rolling neighbourhood state and the model that scores against it.

    Args:
        model: a trained GNN fraud model (its ``cfg.neighbors`` and ``cfg.layers`` fix what is kept).
    """

    def __init__(self, model: GnnFraudModel) -> None:
        self.model = model
        self.module = model.module()
        self.k = model.cfg.neighbors
        self.layers = model.cfg.layers
        self.paths: list[tuple[int, ...]] = list(self.module.paths)
        self.kept = [p for p in [(), *self.paths] if len(p) < self.layers]  # what a stored transaction carries
        self.recent: list[dict[str, deque[dict[tuple[int, ...], np.ndarray]]]] = [{} for _ in RELATIONS]

    def __repr__(self) -> str:
        keys = ", ".join(f"{r}={len(self.recent[i])}" for i, r in enumerate(RELATIONS))
        return f"{self.__class__.__name__}(k={self.k}, layers={self.layers}, keys: {keys})"

    def inputs(self, row: np.ndarray, keys: Sequence[str]) -> np.ndarray:
        """The model's input row (float64) of one transaction from its feature row and (cardholder, merchant).

        The transaction is then folded into the state.
        """
        base, missing = transformed_rows(self.module, np.asarray(row, dtype=np.float64).reshape(1, -1))
        base, missing = base[0], missing[0]
        neighbours = [list(self.recent[r].get(str(keys[r]), ())) for r in range(len(RELATIONS))]
        blocks: dict[tuple[int, ...], np.ndarray] = {(): base}
        for path in self.paths:  # shortest first
            past = neighbours[path[0]]
            blocks[path] = (np.mean([p[path[1:]] for p in past], axis=0) if past else np.zeros_like(base))
        degrees = [np.log1p(len(n)) for n in neighbours]
        x = np.concatenate([base, missing, degrees, *(blocks[p] for p in self.paths)])
        stored = {p: blocks[p] for p in self.kept}
        for r in range(len(RELATIONS)):
            self.recent[r].setdefault(str(keys[r]), deque(maxlen=self.k)).append(stored)
        return x

    def score(self, row: np.ndarray, cardholder: str, merchant: str) -> float:
        """Fraud probability of one transaction (``score >= model.threshold`` is fraud); updates the state."""
        return float(self.score_batch(np.asarray(row).reshape(1, -1), [cardholder], [merchant])[0])

    def score_batch(self, rows: np.ndarray, cardholders: Sequence[str], merchants: Sequence[str]) -> np.ndarray:
        """Scores of transactions in arrival order (each sees the ones before it in the batch)."""
        X = np.stack([self.inputs(r, (c, m)) for r, c, m in zip(rows, cardholders, merchants, strict=True)])
        with torch.no_grad():
            logits, _ = self.module(torch.as_tensor(X, dtype=torch.float32))
        return torch.softmax(logits, dim=1)[:, 1].double().numpy()

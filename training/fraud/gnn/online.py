"""Scoring one transaction at a time with a GNN fraud model: the bank's recent past, kept incrementally.

The offline graph (:mod:`.graph`) links a transaction to the k latest earlier transactions of its cardholder and
of its merchant, and the model reads the mean over each relation path of length 1..L (:func:`.model.node_inputs`).
Every one of those means only looks backwards, so it can be kept as a stream goes by: per cardholder and per
merchant, the k latest transactions, each with its transformed row and its own means over the paths of length
1..L−1. A new transaction's mean over the path (r, rest) is the mean, over its r-neighbours, of their stored mean
over ``rest``: the offline value, computed from O(k) stored vectors. Transactions must arrive in the offline
replay order (timestamp, then transaction id) for the scores to equal the offline ones (the test checks this).

One implementation for both paths: batch scoring replays a bank through one scorer in memory; serving
(:mod:`fedfraud.serving.graph_fraud`) restores the batch's cardholders and merchants from its KV store
(:meth:`OnlineGraphScorer.restore`), decides (:meth:`OnlineGraphScorer.decide`) and writes them back
(:meth:`OnlineGraphScorer.dump`). A stored neighbourhood names the model that made it: its vectors are rows
transformed with that model's scaler, so another model version starts from an empty one.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Sequence

import numpy as np
import torch

from fedfraud.training.fraud.gnn.artifact import GnnFraudModel
from fedfraud.training.fraud.gnn.graph import RELATIONS
from fedfraud.training.fraud.gnn.model import HOUR_FEATURE, transformed_rows
from fedfraud.training.fraud.model import FraudDecision, Reason

__all__ = ["NEIGHBOUR_REASONS", "OnlineGraphScorer"]

#: Reason names of the neighbourhood's part in a decision, per relation (the value is the neighbour count).
NEIGHBOUR_REASONS: tuple[str, ...] = tuple(f"{r}_neighbours" for r in RELATIONS)
_HEAD = struct.Struct("<HII")  # tag length, entries, floats per entry


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
        self._group_matrix: np.ndarray | None = None

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

    def restore(self, relation: int, key: str, blob: bytes | None, tag: str) -> None:
        """Set the neighbourhood of ``key`` from :meth:`dump`'s bytes (None, or another model's: empty).

        Raises ValueError on bytes of the right model that do not hold its layout (the caller starts it empty).
        """
        self.recent[relation].pop(str(key), None)
        if not blob:
            return
        if len(blob) < _HEAD.size:
            raise ValueError(f"corrupt neighbourhood of {key!r}: {len(blob)} bytes")
        n_tag, entries, width = _HEAD.unpack_from(blob)
        start = _HEAD.size + n_tag
        if blob[_HEAD.size:start] != tag.encode() or not entries:
            return
        expected = len(self.kept) * self.module.shared_width
        if width != expected or len(blob) - start != entries * width * 8 or entries > self.k:
            raise ValueError(f"corrupt neighbourhood of {key!r}: {entries} entries of {width} floats, "
                             f"{len(blob) - start} bytes (the model keeps {expected} floats per entry)")
        flat = np.frombuffer(blob, dtype="<f8", offset=start).reshape(entries, len(self.kept), -1)
        self.recent[relation][str(key)] = deque(
            ({p: flat[e, j].copy() for j, p in enumerate(self.kept)} for e in range(entries)), maxlen=self.k)

    def dump(self, relation: int, key: str, tag: str) -> bytes:
        """The neighbourhood of ``key`` as bytes (float64, so a restored state scores bit for bit the same)."""
        past = self.recent[relation].get(str(key), ())
        name = tag.encode()
        if not past:
            return _HEAD.pack(len(name), 0, 0) + name
        flat = np.stack([np.stack([entry[p] for p in self.kept]) for entry in past]).astype("<f8")
        return _HEAD.pack(len(name), len(past), flat.shape[1] * flat.shape[2]) + name + flat.tobytes()

    def score(self, row: np.ndarray, cardholder: str, merchant: str) -> float:
        """Fraud probability of one transaction (``score >= model.threshold`` is fraud); updates the state."""
        return float(self.score_batch(np.asarray(row).reshape(1, -1), [cardholder], [merchant])[0])

    def score_batch(self, rows: np.ndarray, cardholders: Sequence[str], merchants: Sequence[str]) -> np.ndarray:
        """Scores of transactions in arrival order (each sees the ones before it in the batch)."""
        X = np.stack([self.inputs(r, (c, m)) for r, c, m in zip(rows, cardholders, merchants, strict=True)])
        with torch.no_grad():
            logits, _ = self.module(torch.as_tensor(X, dtype=torch.float32))
        return torch.softmax(logits, dim=1)[:, 1].double().numpy()

    def decide(self, rows: np.ndarray, cardholders: Sequence[str], merchants: Sequence[str], top_k: int = 3,
               reasons_for: str = "all") -> list[FraudDecision]:
        """Score, decision and top reasons of transactions in arrival order (the state is updated), as
        :meth:`fedfraud.training.fraud.model.FraudModel.predict_batch` gives them for XGBoost.

        A reason's contribution is gradient × input of the fraud log-odds (the inputs are standardized, so 0 is
        the training mean), summed over a feature's input columns; the neighbourhood's part is one reason per
        relation (``card_neighbours``, ``merchant_neighbours``) whose value is the neighbour count.
        """
        if reasons_for not in ("all", "fraud"):
            raise ValueError(f"reasons_for must be 'all' or 'fraud', got {reasons_for!r}")
        rows = np.asarray(rows, dtype=np.float64)
        counts = np.asarray([[len(self.recent[r].get(str(k), ())) for r, k in enumerate(keys)]
                             for keys in zip(cardholders, merchants, strict=True)], dtype=np.float64)
        X = torch.as_tensor(np.stack([self.inputs(r, (c, m))
                                      for r, c, m in zip(rows, cardholders, merchants, strict=True)]),
                            dtype=torch.float32).requires_grad_(True)
        logits, _ = self.module(X)
        (logits[:, 1] - logits[:, 0]).sum().backward()  # rows are independent: each row's own gradient
        score = torch.softmax(logits.detach(), dim=1)[:, 1].double().numpy()
        parts = (X.grad * X.detach()).double().numpy() @ self._groups()  # [n, features + relations]
        names = self._reason_names()
        values = np.hstack([rows[:, [self.model.names.index(n) for n in names[: -len(RELATIONS)]]], counts])
        threshold = self.model.threshold
        out = []
        for i, s in enumerate(score.tolist()):
            fraud = s >= threshold
            reasons: tuple[Reason, ...] = ()
            if reasons_for == "all" or fraud:
                order = np.argsort(-parts[i] if fraud else parts[i], kind="stable")[:top_k]
                reasons = tuple(Reason(names[j], float(values[i, j]), float(parts[i, j])) for j in order)
            out.append(FraudDecision(float(min(max(s, 0.0), 1.0)), bool(fraud), reasons))
        return out

    def _reason_names(self) -> tuple[str, ...]:
        lay = self.module.layout
        own = [lay.names[c] for c in lay.numeric]
        own += [HOUR_FEATURE] if lay.hour is not None else []
        own += [lay.names[c] for c in lay.categories]
        return (*own, *NEIGHBOUR_REASONS)

    def _groups(self) -> np.ndarray:
        """``[input width, reasons]`` 0/1: which model input columns make up each reason (built once)."""
        if self._group_matrix is None:
            m, lay = self.module, self.module.layout
            n_num, n_own = len(lay.numeric), len(self._reason_names()) - len(RELATIONS)
            owner = list(range(n_num))  # the base block: numeric, hour (sin, cos), one-hot blocks
            owner += [n_num] * 2 if lay.hour is not None else []
            first_cat = n_num + (1 if lay.hour is not None else 0)
            owner += [first_cat + j for j in range(len(lay.categories)) for _ in range(m.buckets)]
            owner += list(range(n_num))  # missing indicators: their column's feature
            owner += [n_own + r for r in range(len(RELATIONS))]  # log in-degrees
            for path in m.paths:
                owner += [n_own + path[0]] * m.shared_width
            if len(owner) != m.input_width:
                raise AssertionError(f"reason groups cover {len(owner)} of {m.input_width} inputs")
            groups = np.zeros((m.input_width, n_own + len(RELATIONS)))
            groups[np.arange(m.input_width), owner] = 1.0
            self._group_matrix = groups
        return self._group_matrix

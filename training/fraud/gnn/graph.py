"""A bank's transaction graph: the fraud feature rows as nodes, linked through their cardholder and merchant.

Nodes are the bank's transactions, with the very feature rows the XGBoost model reads
(:class:`~fedfraud.training.fraud.features.FraudFeatures`, same order, same split by cardholder). Edges are typed:

* ``card`` (relation 0): from each of the ``k`` latest *earlier* transactions of the same cardholder;
* ``merchant`` (relation 1): from each of the ``k`` latest *earlier* transactions at the same merchant (any of the
  bank's cardholders).

Edges only point from the past to the present (ordered by timestamp, then transaction id, as the features are
replayed), so a transaction's neighbourhood is what the bank held when it arrived: what serving can compute, and
no future row shapes a score. Labels are never node inputs; edges never depend on labels, and the split is by
cardholder, so ``card`` edges never cross it (``merchant`` edges do, carrying feature rows only).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fedfraud.training.fraud.features import FraudFeatures

__all__ = ["RELATIONS", "TransactionGraph", "build_graph", "causal_edges"]

logger = logging.getLogger(__name__)

#: Edge types, in ``edge_type`` order.
RELATIONS: tuple[str, ...] = ("card", "merchant")


def causal_edges(keys: np.ndarray, order_key: np.ndarray, k: int) -> np.ndarray:
    """``[2, E]`` int64 (source, target): each row receives an edge from the ``k`` rows before it that share its key.

    ``order_key``: the rows' replay positions (distinct integers; earlier is smaller).
    """
    n = len(keys)
    if n == 0:
        return np.zeros((2, 0), dtype=np.int64)
    codes = pd.factorize(np.asarray(keys, dtype=object))[0]
    order = np.lexsort((np.asarray(order_key), codes))
    sorted_codes = codes[order]
    src, dst = [], []
    for lag in range(1, k + 1):
        if lag >= n:
            break
        same = sorted_codes[lag:] == sorted_codes[:-lag]
        src.append(order[:-lag][same])
        dst.append(order[lag:][same])
    if not src:
        return np.zeros((2, 0), dtype=np.int64)
    return np.stack([np.concatenate(src), np.concatenate(dst)]).astype(np.int64)


@dataclass(frozen=True)
class TransactionGraph:
    """One bank's transaction graph (checked on construction).

    Attributes:
        features: the node rows (``FraudFeatures``: X, names, ids, cardholder, label, split).
        edge_index: int64 ``[2, E]``, source → target, source replayed before target.
        edge_type: int64 ``[E]``, index into :data:`RELATIONS`.
        position: int64 ``[n]``, each node's replay position (timestamp, transaction id).
        bank: the bank's id.
    """

    features: FraudFeatures
    edge_index: np.ndarray
    edge_type: np.ndarray
    position: np.ndarray
    bank: int = 0

    def __post_init__(self) -> None:
        n = len(self.features)
        e = self.edge_index
        if e.ndim != 2 or e.shape[0] != 2 or e.dtype != np.int64:
            raise ValueError(f"edge_index must be int64 [2, E], got {e.dtype} {e.shape}")
        if self.edge_type.shape != (e.shape[1],) or self.edge_type.dtype != np.int64:
            raise ValueError("edge_type must be int64 [E]")
        if e.size and (e.min() < 0 or e.max() >= n):
            raise ValueError("edge_index points outside the nodes")
        if self.edge_type.size and (self.edge_type.min() < 0 or self.edge_type.max() >= len(RELATIONS)):
            raise ValueError(f"edge_type must be in 0..{len(RELATIONS) - 1}")
        if self.position.shape != (n,):
            raise ValueError("position must hold one entry per node")
        if e.size and np.any(self.position[e[0]] >= self.position[e[1]]):
            raise ValueError("every edge must point from an earlier transaction to a later one")

    def __len__(self) -> int:
        return len(self.features)

    def __repr__(self) -> str:
        counts = np.bincount(self.edge_type, minlength=len(RELATIONS)) if self.edge_type.size else [0] * 2
        rel = ", ".join(f"{r}={int(c)}" for r, c in zip(RELATIONS, counts, strict=True))
        return f"{self.__class__.__name__}(bank={self.bank}, nodes={len(self)}, edges: {rel})"

    def mask(self, *splits: str) -> np.ndarray:
        """Boolean ``[n]``: nodes of the given splits."""
        return np.isin(self.features.split, splits)

    def save(self, path: str | Path) -> None:
        """Two files: ``<name>.npz`` (edges) and ``<name>.features.npz`` (:meth:`FraudFeatures.save`)."""
        path = Path(path)
        if path.suffix != ".npz":
            raise ValueError(f"{path}: a graph file ends in .npz")
        self.features.save(_features_file(path))
        np.savez(path, edge_index=self.edge_index, edge_type=self.edge_type, position=self.position,
                 bank=np.asarray(self.bank))

    @classmethod
    def load(cls, path: str | Path) -> TransactionGraph:
        """Inverse of :meth:`save` (no pickles: ``allow_pickle=False``)."""
        path = Path(path)
        feats = FraudFeatures.load(_features_file(path))
        with np.load(path, allow_pickle=False) as z:
            return cls(feats, z["edge_index"], z["edge_type"], z["position"], int(z["bank"]))


def _features_file(path: Path) -> str:
    return f"{path.with_suffix('')}.features.npz"


def build_graph(features: FraudFeatures, frame: pd.DataFrame, neighbors: int, bank: int = 0) -> TransactionGraph:
    """The transaction graph of one bank from its feature rows and its canonical rows (same order).

    Args:
        features: :func:`fedfraud.training.fraud.dataset.bank_features` of the bank (file order).
        frame: the bank's canonical rows (``read_bank``): ``transaction_id``, ``cardholder_id``, ``merchant_id``,
            ``timestamp``; row i is node i.
        neighbors: k, the earlier transactions per relation each node hears from.
        bank: the bank's id.
    """
    if len(frame) != len(features):
        raise ValueError(f"frame has {len(frame)} rows, features {len(features)}")
    tid = frame["transaction_id"].astype(str).to_numpy(dtype=object)
    if not np.array_equal(tid, features.transaction_id.astype(str)):
        raise ValueError("frame and features are not in the same row order")
    from fedfraud.feature_store.encoders import timestamps_us

    ts = np.asarray(timestamps_us(frame["timestamp"]), dtype=np.int64)
    order = np.lexsort((tid.astype(str), ts))
    position = np.empty(len(frame), dtype=np.int64)
    position[order] = np.arange(len(frame), dtype=np.int64)
    parts, types = [], []
    for r, column in enumerate(("cardholder_id", "merchant_id")):
        e = causal_edges(frame[column].astype(str).to_numpy(dtype=object), position, neighbors)
        parts.append(e)
        types.append(np.full(e.shape[1], r, dtype=np.int64))
    graph = TransactionGraph(features, np.concatenate(parts, axis=1), np.concatenate(types), position, bank)
    logger.info("gnn_graph %r", graph)
    return graph

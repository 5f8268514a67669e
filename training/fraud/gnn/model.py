"""The fraud GNN: the fraud feature row in, mean message passing per relation path, a fraud/legit head out.

Message passing is the SIGN scheme (Frasca et al., 2020, "SIGN: Scalable Inception Graph Neural Networks"; PyG's
``transforms.SIGN``) with typed relations: the mean over a node's past neighbours is taken once per *relation
path* (``card``, ``merchant``, then ``card·card``, ``card·merchant``, ``merchant·card``, ``merchant·merchant`` for
two layers) on the transformed inputs, and the network learns one projection per path and an MLP over their
concatenation. It is a GraphSAGE-mean network whose aggregation is linear and precomputed, so training is
minibatch work on a 2-core CPU (full-graph GraphSAGE measured about 1.5 s per step on a 57k-node bank here).

Input transform (buffers of the model, so a saved model scores raw feature rows):

* ``mcc_code`` and ``prev_mcc_code`` (stable hashes of a category) → one-hot of ``category_buckets`` hash buckets;
* ``hour_utc`` → sin, cos of the hour angle;
* every other column x → sign(x)·log1p(|x|), standardized with the federation's training-row mean and standard
  deviation (:class:`ScalerSums`, summed over banks), clipped to ±10, NaN → 0 plus a "missing" indicator (own row
  only); the node's log in-degree per relation.

The embedding ``h(v)`` of the paper is the last hidden layer; ``Linear(h) → 2`` logits.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedfraud.training.fraud.gnn.config import GnnConfig
from fedfraud.training.fraud.gnn.graph import RELATIONS, TransactionGraph

__all__ = [
    "CATEGORY_FEATURES",
    "HOUR_FEATURE",
    "FraudGNN",
    "InputLayout",
    "ScalerSums",
    "node_inputs",
    "relation_paths",
    "signed_log",
    "transformed_rows",
]

#: Columns that are hashes of a category (one-hot buckets, not scaled); also read by FED-SPFD (:mod:`..spfd`).
CATEGORY_FEATURES = ("mcc_code", "prev_mcc_code", "job_code")  # job_code: FED-SPFD's demographics
HOUR_FEATURE = "hour_utc"


def signed_log(x: np.ndarray) -> np.ndarray:
    """sign(x)·log1p(|x|), NaN kept (heavy-tailed counts and amounts onto a scale a network can read)."""
    x = np.asarray(x, dtype=np.float64)
    return np.sign(x) * np.log1p(np.abs(x))


def relation_paths(layers: int) -> list[tuple[int, ...]]:
    """Every sequence of relations of length 1..``layers`` (the propagated blocks, shortest first)."""
    return [p for k in range(1, layers + 1) for p in itertools.product(range(len(RELATIONS)), repeat=k)]


@dataclass(frozen=True)
class InputLayout:
    """Which columns of the feature row the GNN reads, and as what."""

    names: tuple[str, ...]
    numeric: tuple[int, ...]
    categories: tuple[int, ...]
    hour: int | None

    @classmethod
    def of(cls, names: Sequence[str], used: Sequence[str]) -> InputLayout:
        """The layout of rows ``names`` for a model trained on the columns ``used``."""
        names = tuple(names)
        missing = [u for u in used if u not in names]
        if missing:
            raise ValueError(f"the model's columns {missing} are not in the feature row")
        cats = tuple(names.index(n) for n in used if n in CATEGORY_FEATURES)
        hour = names.index(HOUR_FEATURE) if HOUR_FEATURE in used else None
        numeric = tuple(names.index(n) for n in used if n not in CATEGORY_FEATURES and n != HOUR_FEATURE)
        return cls(names, numeric, cats, hour)

    @property
    def used(self) -> tuple[str, ...]:
        idx = sorted((*self.numeric, *self.categories, *(() if self.hour is None else (self.hour,))))
        return tuple(self.names[i] for i in idx)

    def numeric_values(self, X: np.ndarray) -> np.ndarray:
        """signed_log of the numeric columns, float64 with NaN."""
        return signed_log(np.asarray(X)[:, list(self.numeric)])


@dataclass(frozen=True)
class ScalerSums:
    """Per numeric column: count of finite values, their sum and sum of squares (what a bank sends, once)."""

    count: np.ndarray
    total: np.ndarray
    squares: np.ndarray

    @classmethod
    def of(cls, values: np.ndarray) -> ScalerSums:
        v = np.asarray(values, dtype=np.float64)
        ok = np.isfinite(v)
        z = np.where(ok, v, 0.0)
        return cls(ok.sum(0).astype(np.float64), z.sum(0), (z * z).sum(0))

    def __add__(self, other: ScalerSums) -> ScalerSums:
        return ScalerSums(self.count + other.count, self.total + other.total, self.squares + other.squares)

    def mean_std(self) -> tuple[np.ndarray, np.ndarray]:
        n = np.maximum(self.count, 1.0)
        mean = self.total / n
        var = np.maximum(self.squares / n - mean**2, 0.0)
        return mean, np.maximum(np.sqrt(var), 1e-3)


class FraudGNN(nn.Module):
    """Transaction-node classifier over the propagated blocks of :func:`node_inputs`.

    Args:
        layout: the input columns (:class:`InputLayout`).
        cfg: width, depth (relation-path length), dropout, category buckets.
    """

    def __init__(self, layout: InputLayout, cfg: GnnConfig) -> None:
        super().__init__()
        self.layout = layout
        self.buckets = cfg.category_buckets
        self.paths = relation_paths(cfg.layers)
        n_num = len(layout.numeric)
        self.register_buffer("mean", torch.zeros(n_num))
        self.register_buffer("std", torch.ones(n_num))
        self.shared_width = n_num + (2 if layout.hour is not None else 0) + len(layout.categories) * self.buckets
        self.self_width = self.shared_width + n_num + len(RELATIONS)  # + missing indicators + log in-degrees
        self.self_lin = nn.Linear(self.self_width, cfg.hidden)
        self.path_lins = nn.ModuleList([nn.Linear(self.shared_width, cfg.hidden) for _ in self.paths])
        self.mix = nn.Linear(cfg.hidden * (1 + len(self.paths)), cfg.hidden)
        self.head = nn.Linear(cfg.hidden, 2)
        self.dropout = nn.Dropout(cfg.dropout)
        self.reset_parameters()

    @property
    def input_width(self) -> int:
        return self.self_width + self.shared_width * len(self.paths)

    def reset_parameters(self) -> None:
        for lin in (self.self_lin, *self.path_lins, self.mix, self.head):
            lin.reset_parameters()

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(numeric={len(self.layout.numeric)}, categories="
                f"{len(self.layout.categories)}, hidden={self.head.in_features}, paths={len(self.paths)}, "
                f"relations={len(RELATIONS)})")

    def set_scaler(self, sums: ScalerSums) -> None:
        """The standardization of the numeric columns (the federation's training rows)."""
        mean, std = sums.mean_std()
        self.mean.copy_(torch.as_tensor(mean, dtype=torch.float32))
        self.std.copy_(torch.as_tensor(std, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits ``[n, 2]``, embedding h(v) ``[n, hidden]``) of rows of :func:`node_inputs`."""
        blocks = [torch.relu(self.self_lin(x[:, : self.self_width]))]
        off = self.self_width
        for lin in self.path_lins:
            blocks.append(torch.relu(lin(x[:, off : off + self.shared_width])))
            off += self.shared_width
        h = torch.relu(self.mix(self.dropout(torch.cat(blocks, dim=1))))
        return self.head(self.dropout(h)), h


def _mean_operator(graph: TransactionGraph, relation: int) -> object:
    """Row-normalized in-neighbour matrix of one relation (scipy CSR ``[n, n]``): row i averages i's sources."""
    import scipy.sparse as sp

    n = len(graph)
    e = graph.edge_index[:, graph.edge_type == relation]
    deg = np.bincount(e[1], minlength=n).astype(np.float64)
    vals = 1.0 / np.maximum(deg[e[1]], 1.0)
    return sp.csr_matrix((vals, (e[1], e[0])), shape=(n, n))


def transformed_rows(model: FraudGNN, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the propagated part ``[n, shared_width]``, the missing indicators ``[n, numeric]``) of raw rows, float64."""
    lay = model.layout
    X = np.asarray(X, dtype=np.float64)
    n = len(X)
    num = lay.numeric_values(X)
    ok = np.isfinite(num)
    z = (np.where(ok, num, 0.0) - model.mean.cpu().numpy()) / model.std.cpu().numpy()
    z = np.where(ok, np.clip(z, -10.0, 10.0), 0.0)
    shared = [z]
    if lay.hour is not None:
        hour = np.nan_to_num(X[:, lay.hour]) * (2 * np.pi / 24.0)
        shared += [np.sin(hour)[:, None], np.cos(hour)[:, None]]
    for c in lay.categories:
        onehot = np.zeros((n, model.buckets))
        col = X[:, c]
        known = np.isfinite(col)
        onehot[np.flatnonzero(known), np.nan_to_num(col[known]).astype(np.int64) % model.buckets] = 1.0
        shared.append(onehot)
    return np.concatenate(shared, axis=1), (~ok).astype(np.float64)


def node_inputs(model: FraudGNN, graph: TransactionGraph) -> torch.Tensor:
    """Float32 ``[n, model.input_width]``: each node's own transformed row, then the mean over each relation path.

    Needs the model's scaler (:meth:`FraudGNN.set_scaler`); computed once per graph and scaler.
    """
    base, missing = transformed_rows(model, graph.features.X)
    ops = [_mean_operator(graph, r) for r in range(len(RELATIONS))]
    degrees = [np.log1p(np.asarray(op.getnnz(axis=1), dtype=np.float64))[:, None] for op in ops]  # type: ignore[attr-defined]
    out = [base, missing, *degrees]
    cache: dict[tuple[int, ...], np.ndarray] = {(): base}
    for path in model.paths:  # shortest first: path = (r, *rest) reuses rest's block
        cache[path] = ops[path[0]] @ cache[path[1:]]  # type: ignore[operator]
        out.append(cache[path])
    return torch.as_tensor(np.concatenate(out, axis=1), dtype=torch.float32)

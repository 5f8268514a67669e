"""The contract every pooling operator meets, and the registry its subclasses join by naming themselves.

A new operator is one class in one file: ``class MyPool(GraphPooling, name="mine")``
(or ``names={"mine-a": {...}, "mine-b": {...}}`` for variants that differ only
in constructor options), imported by :mod:`fedfraud.training.anomaly.pool`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["GraphPooling", "PoolResult", "pooling_names", "resolve_pooling"]

#: Registered pooling name → (operator class, constructor options it fixes); filled by subclass definitions.
_REGISTRY: dict[str, tuple[type[GraphPooling], dict[str, Any]]] = {}


@dataclass(frozen=True)
class PoolResult:
    """A coarsened batch of graphs: what one pooling step hands to the next GCN layer.

    Attributes:
        x: ``[n', d]`` node features of the coarsened graphs.
        edge_index: ``[2, e']`` long, indices into ``x``.
        edge_weight: ``[e']`` float edge weights (coarsened adjacency).
        batch: ``[n']`` long, graph of each node; every input graph keeps at least one node.
        aux_loss: scalar auxiliary loss (DiffPool's link + entropy terms; 0 otherwise).
    """

    x: Tensor
    edge_index: Tensor
    edge_weight: Tensor
    batch: Tensor
    aux_loss: Tensor

    def __post_init__(self) -> None:
        n = self.x.shape[0]
        if self.x.dim() != 2:
            raise ValueError(f"PoolResult.x must be [n, d], got {tuple(self.x.shape)}")
        if self.edge_index.dim() != 2 or self.edge_index.shape[0] != 2:
            raise ValueError(f"PoolResult.edge_index must be [2, e], got {tuple(self.edge_index.shape)}")
        if self.edge_weight.shape != (self.edge_index.shape[1],):
            raise ValueError("PoolResult.edge_weight must have one entry per edge")
        if self.batch.shape != (n,):
            raise ValueError("PoolResult.batch must have one entry per node")
        if self.aux_loss.dim() != 0:
            raise ValueError("PoolResult.aux_loss must be a scalar")
        if self.edge_index.numel() and int(self.edge_index.max()) >= n:
            raise ValueError("PoolResult.edge_index refers to a missing node")


class GraphPooling(nn.Module, ABC):
    """Base of all pooling operators: one signature, so the encoder can swap them by name.

    Subclasses register under the name(s) given as class keywords; the config's ``pooling`` picks one.

    Args:
        in_channels: node feature size (unchanged by pooling).
        ratio: fraction of nodes (or clusters) kept.
        max_nodes: upper bound of the input graphs' size at this level (dense operators size on it).
    """

    def __init_subclass__(
        cls, name: str | None = None, names: Mapping[str, Mapping[str, Any]] | None = None, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        entries = {**({name: {}} if name else {}), **dict(names or {})}
        for key, options in entries.items():
            if key != key.strip().lower():
                raise ValueError(f"pooling name {key!r} must be lower-case without spaces")
            if key in _REGISTRY and _REGISTRY[key][0].__qualname__ != cls.__qualname__:
                raise ValueError(f"pooling name {key!r} is taken by {_REGISTRY[key][0].__qualname__}")
            _REGISTRY[key] = (cls, dict(options))

    def __init__(self, in_channels: int, ratio: float, max_nodes: int) -> None:
        super().__init__()
        if not 0.0 < ratio <= 1.0:
            raise ValueError(f"ratio must be in (0, 1], got {ratio}")
        self.in_channels = in_channels
        self.ratio = ratio
        self.max_nodes = max_nodes

    @abstractmethod
    def forward(
        self, x: Tensor, edge_index: Tensor, edge_weight: Tensor | None = None, batch: Tensor | None = None
    ) -> PoolResult:
        """Coarsen a batch of graphs."""

    def reset_parameters(self) -> None:
        """Re-initialise learned parameters (none by default)."""

    def supports_dense(self) -> bool:
        """Whether :meth:`dense` gives what :meth:`forward` gives (the encoder's inference-only fast path)."""
        return False

    def dense(self, x: Tensor, adj: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Coarsen padded graphs (``x`` [B, N, d], ``adj`` [B, N, N] with GCN's self-loops, ``mask`` [B, N]).

        Inference only. Returns the same triple; the kept nodes are those in the
        mask, any other slot is zero in ``x`` and has no edges, loops included
        (:func:`fedfraud.training.anomaly.dense.pad_graphs`).
        """
        raise NotImplementedError(f"{self.__class__.__name__} has no dense form")

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, ratio={self.ratio})"

    @staticmethod
    def _defaults(
        x: Tensor, edge_index: Tensor, edge_weight: Tensor | None, batch: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """Fill in unit edge weights and a single-graph batch vector."""
        if edge_weight is None:
            edge_weight = torch.ones(edge_index.shape[1], dtype=x.dtype, device=x.device)
        if batch is None:
            batch = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        return edge_weight, batch

    @staticmethod
    def _zero(x: Tensor) -> Tensor:
        return x.new_zeros(())


class PyGSelectPooling(GraphPooling):
    """A PyG pooling layer called as ``op(x, edge_index, edge_weight, batch)``, wrapped to the common contract.

    Subclasses name the PyG class in ``op_class``; edge weights are filtered along with the kept edges.
    """

    op_class: type[nn.Module]

    def __init__(self, in_channels: int, ratio: float = 0.5, max_nodes: int = 32) -> None:
        super().__init__(in_channels, ratio, max_nodes)
        self.op = self.op_class(in_channels, ratio=ratio)

    def reset_parameters(self) -> None:
        self.op.reset_parameters()

    def forward(
        self, x: Tensor, edge_index: Tensor, edge_weight: Tensor | None = None, batch: Tensor | None = None
    ) -> PoolResult:
        edge_weight, batch = self._defaults(x, edge_index, edge_weight, batch)
        x, edge_index, edge_weight, batch, _, _ = self.op(x, edge_index, edge_weight, batch)
        return PoolResult(x, edge_index, edge_weight, batch, self._zero(x))


def pooling_names() -> tuple[str, ...]:
    """Every registered pooling name, in definition order (what ``pooling`` in the config may be)."""
    return tuple(_REGISTRY)


def resolve_pooling(name: str, in_channels: int, ratio: float = 0.5, max_nodes: int = 32) -> GraphPooling:
    """Build the pooling operator called ``name``; an unknown name raises ``ValueError`` listing valid ones."""
    key = name.strip().lower()
    if key not in _REGISTRY:
        raise ValueError(f"unknown pooling {name!r}; valid: {', '.join(_REGISTRY)}")
    cls, options = _REGISTRY[key]
    return cls(in_channels, ratio=ratio, max_nodes=max_nodes, **options)

"""TopK pooling (Gao & Ji 2019; Knyazev et al. 2019): keep the ⌈ratio·n⌉ nodes with the highest learned score."""

from __future__ import annotations

from torch import Tensor
from torch_geometric.nn import TopKPooling

from training.anomaly.pool.base import GraphPooling, PoolResult

__all__ = ["TopKPool"]


class TopKPool(GraphPooling):
    """Wraps :class:`torch_geometric.nn.TopKPooling`; edge weights are filtered along with the edges."""

    def __init__(self, in_channels: int, ratio: float = 0.5, max_nodes: int = 32) -> None:
        super().__init__(in_channels, ratio, max_nodes)
        self.op = TopKPooling(in_channels, ratio=ratio)

    def reset_parameters(self) -> None:
        self.op.reset_parameters()

    def forward(
        self, x: Tensor, edge_index: Tensor, edge_weight: Tensor | None = None, batch: Tensor | None = None
    ) -> PoolResult:
        edge_weight, batch = self._defaults(x, edge_index, edge_weight, batch)
        x, edge_index, edge_weight, batch, _, _ = self.op(x, edge_index, edge_weight, batch)
        return PoolResult(x, edge_index, edge_weight, batch, self._zero(x))

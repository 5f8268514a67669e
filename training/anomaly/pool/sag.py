"""Self-attention graph pooling (Lee et al. 2019): node scores come from a GNN, so they see structure."""

from __future__ import annotations

from torch import Tensor
from torch_geometric.nn import SAGPooling

from training.anomaly.pool.base import GraphPooling, PoolResult

__all__ = ["SAGPool"]


class SAGPool(GraphPooling):
    """Wraps :class:`torch_geometric.nn.SAGPooling` (GraphConv scorer); edge weights follow kept edges."""

    def __init__(self, in_channels: int, ratio: float = 0.5, max_nodes: int = 32) -> None:
        super().__init__(in_channels, ratio, max_nodes)
        self.op = SAGPooling(in_channels, ratio=ratio)

    def reset_parameters(self) -> None:
        self.op.reset_parameters()

    def forward(
        self, x: Tensor, edge_index: Tensor, edge_weight: Tensor | None = None, batch: Tensor | None = None
    ) -> PoolResult:
        edge_weight, batch = self._defaults(x, edge_index, edge_weight, batch)
        x, edge_index, edge_weight, batch, _, _ = self.op(x, edge_index, edge_weight, batch)
        return PoolResult(x, edge_index, edge_weight, batch, self._zero(x))

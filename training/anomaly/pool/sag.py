"""Self-attention graph pooling (Lee et al. 2019): node scores come from a GNN, so they see structure."""

from __future__ import annotations

from torch_geometric.nn import SAGPooling

from fedfraud.training.anomaly.pool.base import PyGSelectPooling

__all__ = ["SAGPool"]


class SAGPool(PyGSelectPooling, name="sag"):
    """Wraps :class:`torch_geometric.nn.SAGPooling` (GraphConv scorer); edge weights follow kept edges."""

    op_class = SAGPooling

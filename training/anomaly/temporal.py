"""Time-aware input layer (thesis §4.4.2): ``H0_i = X_i + Σ_{j∈N(i)} tanh(X_j + T'_ij)``."""

from __future__ import annotations

from torch import Tensor
from torch_geometric.nn import MessagePassing

__all__ = ["TemporalMessage"]


class TemporalMessage(MessagePassing):
    """Parameter-free message passing that mixes each arriving transition's time T' into node features.

    ``N(i)`` are the sources of edges ``j → i`` (the merchant visited just
    before ``i``); a node without in-edges keeps ``X_i``.
    """

    def __init__(self) -> None:
        super().__init__(aggr="add", flow="source_to_target")

    def reset_parameters(self) -> None:
        """Nothing to reset; kept for the common operator interface."""

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor) -> Tensor:
        if edge_attr.shape != (edge_index.shape[1], x.shape[1]):
            raise ValueError(f"edge_attr must be [e, {x.shape[1]}], got {tuple(edge_attr.shape)}")
        return x + self.propagate(edge_index, x=x, edge_attr=edge_attr)

    def message(self, x_j: Tensor, edge_attr: Tensor) -> Tensor:
        return (x_j + edge_attr).tanh()

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}()"

"""DiffPool (Ying et al. 2018): a learned soft assignment of nodes to a fixed number of clusters."""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch_geometric.nn import DenseGCNConv, dense_diff_pool
from torch_geometric.utils import to_dense_adj, to_dense_batch

from fedfraud.training.anomaly.pool.base import GraphPooling, PoolResult

__all__ = ["DiffPool"]


class DiffPool(GraphPooling, name="diffpool"):
    """Dense DiffPool behind the sparse interface.

    The assignment ``S = softmax(GCN_pool(X, A))`` maps each graph onto
    ``k = ⌈ratio · max_nodes⌉`` clusters; ``X' = SᵀX``, ``A' = SᵀAS`` via
    :func:`torch_geometric.nn.dense_diff_pool`, whose link-prediction and
    entropy losses are returned as ``aux_loss``. The dense result is turned back
    into a sparse batch (every graph gets exactly ``k`` nodes, weighted edges).
    """

    def __init__(self, in_channels: int, ratio: float = 0.5, max_nodes: int = 32) -> None:
        super().__init__(in_channels, ratio, max_nodes)
        self.clusters = max(1, math.ceil(ratio * max_nodes))
        self.assign = DenseGCNConv(in_channels, self.clusters)

    def reset_parameters(self) -> None:
        self.assign.reset_parameters()

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, ratio={self.ratio}, clusters={self.clusters})"

    def forward(
        self, x: Tensor, edge_index: Tensor, edge_weight: Tensor | None = None, batch: Tensor | None = None
    ) -> PoolResult:
        edge_weight, batch = self._defaults(x, edge_index, edge_weight, batch)
        dense_x, mask = to_dense_batch(x, batch)
        adj = to_dense_adj(edge_index, batch, edge_weight, max_num_nodes=dense_x.shape[1])
        s = self.assign(dense_x, adj, mask)
        out, out_adj, link_loss, ent_loss = dense_diff_pool(dense_x, adj, s, mask)
        graphs, k = out.shape[0], out.shape[1]
        nz = out_adj.nonzero(as_tuple=True)
        edge_index = torch.stack([nz[0] * k + nz[1], nz[0] * k + nz[2]])
        new_batch = torch.arange(graphs, device=x.device).repeat_interleave(k)
        return PoolResult(out.reshape(graphs * k, -1), edge_index, out_adj[nz], new_batch, link_loss + ent_loss)

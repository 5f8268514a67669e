"""Adaptive structure-aware pooling (Ranjan et al. 2020): cluster local neighbourhoods, keep the best clusters."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import ASAPooling
from torch_geometric.utils import add_remaining_self_loops, cumsum, scatter, softmax, to_dense_adj

from fedfraud.training.anomaly.pool.base import PoolResult, PyGSelectPooling

__all__ = ["ASAPool"]


class ASAPool(PyGSelectPooling, name="asap"):
    """ASAPooling with the parameters of :class:`torch_geometric.nn.ASAPooling` and a dense coarsening step.

    Cluster attention, fitness scoring and top-k selection follow PyG's
    operator exactly (its sub-modules are reused). PyG computes ``A' = SᵀAS``
    with sparse CSR products, which have no backward on CPU in torch 2.13, so
    gradients could not reach the attention through the coarsened adjacency.
    Here ``S`` and ``A`` are dense per graph (ego graphs have at most a few
    dozen nodes), so the product is a batched, differentiable ``bmm``.
    """

    op_class = ASAPooling

    def forward(
        self, x: Tensor, edge_index: Tensor, edge_weight: Tensor | None = None, batch: Tensor | None = None
    ) -> PoolResult:
        edge_weight, batch = self._defaults(x, edge_index, edge_weight, batch)
        op, n = self.op, x.shape[0]
        edge_index, edge_weight = add_remaining_self_loops(edge_index, edge_weight, fill_value=1.0, num_nodes=n)
        src, dst = edge_index[0], edge_index[1]

        # cluster attention (PyG ASAPooling.forward)
        x_j = x[src]
        x_q = op.lin(scatter(x_j, dst, dim=0, dim_size=n, reduce="max"))[dst]
        score = F.leaky_relu(op.att(torch.cat([x_q, x_j], dim=-1)).view(-1), op.negative_slope)
        score = softmax(score, dst, num_nodes=n)
        score = F.dropout(score, p=op.dropout, training=self.training)
        clusters = scatter(x_j * score.view(-1, 1), dst, dim=0, dim_size=n, reduce="sum")

        # cluster selection
        fitness = op.gnn_score(clusters, edge_index).sigmoid().view(-1)
        perm = op.select(fitness, batch).node_index
        new_x = clusters[perm] * fitness[perm].view(-1, 1)
        new_batch = batch[perm]

        # dense coarsening A' = Sᵀ A S per graph; S[j, c] = score of edge j → c for kept cluster c
        graphs = int(batch.max()) + 1 if n else 0
        counts = torch.bincount(batch, minlength=graphs)
        kept = torch.bincount(new_batch, minlength=graphs)
        pos = torch.arange(n, device=x.device) - cumsum(counts)[:-1][batch]
        kptr = cumsum(kept)[:-1]
        col = torch.full((n,), -1, dtype=torch.long, device=x.device)
        col[perm] = torch.arange(perm.numel(), device=x.device) - kptr[new_batch]
        n_max, k_max = int(counts.max()), int(kept.max())
        keep_edge = col[dst] >= 0
        s_dense = x.new_zeros(graphs, n_max, k_max).index_put(
            (batch[src][keep_edge], pos[src][keep_edge], col[dst][keep_edge]), score[keep_edge], accumulate=True
        )
        adj = to_dense_adj(edge_index, batch, edge_weight, max_num_nodes=n_max, batch_size=graphs)
        coarse = s_dense.transpose(1, 2) @ adj @ s_dense
        valid = torch.arange(k_max, device=x.device).unsqueeze(0) < kept.unsqueeze(1)
        mask = valid.unsqueeze(2) & valid.unsqueeze(1) & (coarse != 0)
        mask &= ~torch.eye(k_max, dtype=torch.bool, device=x.device).unsqueeze(0)  # PyG default: no self-loops
        g, r, c = mask.nonzero(as_tuple=True)
        new_index = torch.stack([kptr[g] + r, kptr[g] + c])
        return PoolResult(new_x, new_index, coarse[g, r, c], new_batch, self._zero(x))

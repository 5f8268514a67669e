"""Inference-only dense form of the encoder's graph steps: a batch of ≤ max_nodes ego graphs as padded tensors.

The sparse PyG path re-derives structure on every call (``to_undirected``'s
coalesce, ``gcn_norm``'s ``add_remaining_self_loops``, TopK's per-graph sort,
``filter_adj``): ~700–990 torch ops per scoring micro-batch of ~4 tiny graphs.
Padded to ``[B, N, ·]`` with a node mask, the same arithmetic is a small,
constant number of batched ops. :class:`~fedfraud.training.anomaly.model.GraphEncoder`
takes this path only in eval mode without autograd; training keeps the sparse
path (``tests/unit/test_anomaly_dense.py`` checks both give the same embeddings).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch_geometric.nn import GCNConv

__all__ = ["DenseGraphs", "dense_gcn", "dense_readout", "pad_graphs", "supports_dense_gcn"]


@dataclass(frozen=True)
class DenseGraphs:
    """Padded graphs: ``x`` [B, N, F], symmetrised weighted adjacency ``adj`` [B, N, N], node ``mask`` [B, N]."""

    x: Tensor
    adj: Tensor
    mask: Tensor


def pad_graphs(x: Tensor, edge_index: Tensor, batch: Tensor, graphs: int) -> DenseGraphs:
    """Pad a concatenated batch (nodes grouped by graph, as PyG and ``collate_graphs`` lay them out).

    ``adj`` is what ``GCNConv`` normalises: ``to_undirected(edge_index, ones)``
    (every edge j→k adds 1 to both A[j, k] and A[k, j], coalesce's ``add``: a
    duplicate edge or a pair j→k, k→j weighs 2, a self-loop 2), then
    ``add_remaining_self_loops`` (a node's self-loop keeps its weight, the others
    get 1; padded nodes get none). Pooling keeps the loops of the
    nodes it keeps, which is what adding the remaining loops after filtering gives.
    """
    counts = torch.bincount(batch, minlength=graphs)
    size = int(counts.max()) if graphs else 0
    pos = torch.arange(x.shape[0], device=x.device) - (counts.cumsum(0) - counts)[batch]
    h = x.new_zeros(graphs, size, x.shape[1])
    h[batch, pos] = x
    src, dst = edge_index[0], edge_index[1]
    adj = x.new_zeros(graphs, size, size)
    adj.index_put_((batch[src], pos[src], pos[dst]), x.new_ones(src.shape[0]), accumulate=True)
    adj = adj + adj.transpose(1, 2)
    mask = torch.arange(size, device=x.device) < counts[:, None]
    loops = adj.diagonal(dim1=1, dim2=2)
    loops.copy_(torch.where((loops == 0) & mask, 1.0, loops))
    return DenseGraphs(h, adj, mask)


def supports_dense_gcn(conv: GCNConv) -> bool:
    """The dense form covers GCNConv with its defaults (normalised, self-loops added, not cached, not improved)."""
    return bool(conv.normalize and conv.add_self_loops and not (conv.cached or conv.improved) and conv.lin.bias is None)


def dense_gcn(conv: GCNConv, adj: Tensor, xw: Tensor) -> Tensor:
    """``D^-1/2 Â D^-1/2 (X Θ) + b`` on :func:`pad_graphs`' ``Â``, as ``gcn_norm`` and ``GCNConv`` compute it.

    ``xw`` is ``conv.lin(x)`` (the caller may apply it before padding: it is
    row-wise without bias, so padded rows stay 0). ``out_i = Σ_j d_j^-1/2 Â_ji
    d_i^-1/2 (XΘ)_j`` (Â is symmetric); a padded or dropped node has no edges:
    degree 0, clamped so that it stays finite, its row comes out as the bias
    and no other row reads it.
    """
    inv_sqrt = adj.sum(dim=-1).clamp(min=1.0).pow(-0.5)[:, :, None]
    out = inv_sqrt * torch.bmm(adj, inv_sqrt * xw)
    return out + conv.bias if conv.bias is not None else out


def dense_readout(x: Tensor, mask: Tensor) -> Tensor:
    """``[mean ‖ max]`` over each graph's masked nodes, as ``global_mean_pool`` / ``global_max_pool`` (0 if empty).

    ``x`` must be 0 outside the mask (pooling leaves it so).
    """
    keep = mask[:, :, None]
    count = keep.sum(dim=1)
    top = x.masked_fill(~keep, float("-inf")).amax(dim=1)
    return torch.cat([x.sum(dim=1) / count.clamp(min=1), torch.where(count > 0, top, 0.0)], dim=1)

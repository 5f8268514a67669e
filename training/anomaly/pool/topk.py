"""TopK pooling (Gao & Ji 2019; Knyazev et al. 2019): keep the ⌈ratio·n⌉ nodes with the highest learned score."""

from __future__ import annotations

from torch import Tensor
from torch_geometric.nn import TopKPooling

from fedfraud.training.anomaly.pool.base import PyGSelectPooling

__all__ = ["TopKPool"]


class TopKPool(PyGSelectPooling, name="topk"):
    """Wraps :class:`torch_geometric.nn.TopKPooling`; edge weights are filtered along with the edges."""

    op_class = TopKPooling

    def supports_dense(self) -> bool:
        """PyG's ratio mode (``min_score`` None); the softmax-threshold mode has no dense form here."""
        return self.op.min_score is None

    def dense(self, x: Tensor, adj: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``SelectTopK`` + ``filter_adj`` of PyG on padded graphs, masks instead of gathers.

        score = act((x·w) / ‖w‖); each graph keeps its k = ⌈ratio·n⌉ best nodes
        (PyG's ``topk``: k = int(ratio) when ratio ≥ 1) as ``multiplier · x · score``;
        edges (self-loops included) survive between kept nodes. Masks, not a
        gather to fewer slots: a micro-batch of a few graphs pays per op, not per slot.
        """
        select = self.op.select
        score = select.act((x * select.weight).sum(dim=-1) / select.weight.norm(p=2, dim=-1))
        counts = mask.sum(dim=1)
        ratio = self.op.ratio
        k = counts.new_full(counts.shape, int(ratio)) if ratio >= 1 else (float(ratio) * counts.to(x.dtype)).ceil()
        rank = score.masked_fill(~mask, float("-inf")).argsort(dim=1, descending=True).argsort(dim=1)
        keep = (rank < k[:, None]) & mask
        weight = score * keep
        if self.op.multiplier != 1:
            weight = weight * self.op.multiplier
        return x * weight[:, :, None], adj * (keep[:, :, None] & keep[:, None, :]), keep

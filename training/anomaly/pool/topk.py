"""TopK pooling (Gao & Ji 2019; Knyazev et al. 2019): keep the ⌈ratio·n⌉ nodes with the highest learned score."""

from __future__ import annotations

from torch_geometric.nn import TopKPooling

from fedfraud.training.anomaly.pool.base import PyGSelectPooling

__all__ = ["TopKPool"]


class TopKPool(PyGSelectPooling, name="topk"):
    """Wraps :class:`torch_geometric.nn.TopKPooling`; edge weights are filtered along with the edges."""

    op_class = TopKPooling

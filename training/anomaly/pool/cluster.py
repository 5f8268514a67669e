"""Non-learned clustering pooling baselines (thesis §4.5.3): cluster node embeddings, then max- or avg-pool.

Per graph of ``n`` nodes the embeddings are clustered into ``k = ⌈ratio·n⌉``
groups (K-Means, Agglomerative/Ward or Spectral), each group's features are
reduced with max or mean, and the adjacency is coarsened as ``SᵀAS`` (edge
weights summed between clusters). The assignment is not differentiable and is
recomputed on every forward pass from detached embeddings; gradients still
reach the GNN through the pooled features. The algorithms are small numpy /
scipy implementations rather than scikit-learn estimators, whose per-call
overhead (milliseconds) dominates on graphs of at most 32 nodes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import numpy as np
import torch
from scipy.cluster.hierarchy import fcluster, linkage
from torch import Tensor
from torch_geometric.utils import coalesce, scatter

from fedfraud.training.anomaly.pool.base import GraphPooling, PoolResult

__all__ = ["ALGORITHMS", "ClusterPool", "agglomerative_labels", "kmeans_labels", "spectral_labels"]


def kmeans_labels(x: np.ndarray, k: int, iters: int = 10) -> np.ndarray:
    """Lloyd's k-means with deterministic farthest-point initialisation (no random restarts)."""
    n = x.shape[0]
    centers = [int(np.argmax(((x - x.mean(0)) ** 2).sum(1)))]
    dist = ((x - x[centers[0]]) ** 2).sum(1)
    for _ in range(1, k):
        nxt = int(np.argmax(dist))
        if dist[nxt] <= 0.0:
            break  # fewer distinct points than k
        centers.append(nxt)
        dist = np.minimum(dist, ((x - x[nxt]) ** 2).sum(1))
    c = x[centers].copy()
    labels = np.zeros(n, dtype=np.int64)
    for _ in range(iters):
        d = ((x[:, None, :] - c[None, :, :]) ** 2).sum(-1)
        new = d.argmin(1)
        if np.array_equal(new, labels) and _ > 0:
            break
        labels = new
        for j in range(c.shape[0]):
            members = labels == j
            if members.any():
                c[j] = x[members].mean(0)
    return labels


def agglomerative_labels(x: np.ndarray, k: int) -> np.ndarray:
    """Ward agglomerative clustering (scikit-learn's default linkage) cut at ``k`` clusters."""
    return fcluster(linkage(x, method="ward"), t=k, criterion="maxclust").astype(np.int64) - 1


def spectral_labels(x: np.ndarray, k: int) -> np.ndarray:
    """Normalised spectral clustering (Ng–Jordan–Weiss) on an RBF affinity with the median-distance bandwidth."""
    sq = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    off = sq[~np.eye(x.shape[0], dtype=bool)]
    scale = float(np.median(off)) if off.size and np.median(off) > 0 else 1.0
    w = np.exp(-sq / scale)
    deg = w.sum(1)
    inv = 1.0 / np.sqrt(deg)
    lap_sym = np.eye(x.shape[0]) - inv[:, None] * w * inv[None, :]
    _, vecs = np.linalg.eigh(lap_sym)
    emb = vecs[:, :k]
    emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    return kmeans_labels(emb, k)


ALGORITHMS: dict[str, Callable[[np.ndarray, int], np.ndarray]] = {
    "kmeans": kmeans_labels,
    "agglo": agglomerative_labels,
    "spectral": spectral_labels,
}


#: Registered name → options: ``kmeans-avg`` is K-Means clusters, mean-pooled.
_VARIANTS: dict[str, dict[str, str]] = {
    f"{algo}-{short}": {"algorithm": algo, "reduce": reduce}
    for algo in ALGORITHMS
    for short, reduce in (("max", "max"), ("avg", "mean"))
}


class ClusterPool(GraphPooling, names=_VARIANTS):
    """Cluster-then-reduce pooling; ``algorithm`` in :data:`ALGORITHMS`, ``reduce`` max or mean.

    Registered once per pair as ``{algorithm}-{max,avg}`` (``kmeans-max``, ``spectral-avg``, ...).
    """

    def __init__(
        self,
        in_channels: int,
        ratio: float = 0.5,
        max_nodes: int = 32,
        algorithm: str = "kmeans",
        reduce: Literal["max", "mean"] = "max",
    ) -> None:
        super().__init__(in_channels, ratio, max_nodes)
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown clustering algorithm {algorithm!r}; valid: {', '.join(ALGORITHMS)}")
        if reduce not in ("max", "mean"):
            raise ValueError(f"reduce must be 'max' or 'mean', got {reduce!r}")
        self.algorithm = algorithm
        self.reduce = reduce

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, ratio={self.ratio}, {self.algorithm}, {self.reduce})"

    def assign(self, x: Tensor, batch: Tensor) -> tuple[Tensor, Tensor]:
        """Global cluster id per node and the graph of each cluster (both long, on ``x.device``)."""
        counts = torch.bincount(batch).tolist() if batch.numel() else []
        feats = x.detach().to("cpu", torch.float64).numpy()
        cluster_fn = ALGORITHMS[self.algorithm]
        ids = np.empty(x.shape[0], dtype=np.int64)
        cluster_graph: list[int] = []
        start = 0
        for g, n in enumerate(counts):
            if n == 0:
                continue
            k = max(1, math.ceil(self.ratio * n))
            if k >= n:
                labels = np.arange(n)
            elif k == 1:
                labels = np.zeros(n, dtype=np.int64)
            else:
                labels = np.unique(cluster_fn(feats[start : start + n], k), return_inverse=True)[1].reshape(-1)
            ids[start : start + n] = labels + len(cluster_graph)
            cluster_graph.extend([g] * (int(labels.max()) + 1))
            start += n
        return torch.from_numpy(ids).to(x.device), torch.tensor(cluster_graph, dtype=torch.long, device=x.device)

    def forward(
        self, x: Tensor, edge_index: Tensor, edge_weight: Tensor | None = None, batch: Tensor | None = None
    ) -> PoolResult:
        edge_weight, batch = self._defaults(x, edge_index, edge_weight, batch)
        cid, new_batch = self.assign(x, batch)
        m = new_batch.shape[0]
        pooled = scatter(x, cid, dim=0, dim_size=m, reduce=self.reduce)
        new_index, new_weight = coalesce(cid[edge_index], edge_weight, num_nodes=m, reduce="sum")
        return PoolResult(pooled, new_index, new_weight, new_batch, self._zero(x))

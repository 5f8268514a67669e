"""Graph pooling operators behind one signature, resolved by name (``pooling: asap`` in the config).

Learned operators (PyG): ``topk``, ``sag``, ``asap``, ``diffpool``. Non-learned
clustering baselines: ``{kmeans,agglo,spectral}-{max,avg}``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from training.anomaly.config import POOLING_NAMES
from training.anomaly.pool.asap import ASAPool
from training.anomaly.pool.base import GraphPooling, PoolResult
from training.anomaly.pool.cluster import ALGORITHMS, ClusterPool
from training.anomaly.pool.diffpool import DiffPool
from training.anomaly.pool.sag import SAGPool
from training.anomaly.pool.topk import TopKPool

__all__ = [
    "ASAPool",
    "ClusterPool",
    "DiffPool",
    "GraphPooling",
    "LEARNED_POOLINGS",
    "POOLINGS",
    "PoolResult",
    "SAGPool",
    "TopKPool",
    "resolve_pooling",
]

LEARNED_POOLINGS: dict[str, Any] = {"topk": TopKPool, "sag": SAGPool, "asap": ASAPool, "diffpool": DiffPool}

#: Every valid pooling name → a factory taking ``(in_channels, ratio, max_nodes)``.
POOLINGS: dict[str, Any] = {
    **LEARNED_POOLINGS,
    **{
        f"{algo}-{short}": partial(ClusterPool, algorithm=algo, reduce=reduce)
        for algo in ALGORITHMS
        for short, reduce in (("max", "max"), ("avg", "mean"))
    },
}


if tuple(POOLINGS) != POOLING_NAMES:  # pragma: no cover - a developer error caught at import
    raise RuntimeError(f"pooling registry {tuple(POOLINGS)} differs from config.POOLING_NAMES {POOLING_NAMES}")


def resolve_pooling(name: str, in_channels: int, ratio: float = 0.5, max_nodes: int = 32) -> GraphPooling:
    """Build the pooling operator called ``name``; an unknown name raises ``ValueError`` listing valid ones."""
    key = name.strip().lower()
    if key not in POOLINGS:
        raise ValueError(f"unknown pooling {name!r}; valid: {', '.join(POOLINGS)}")
    return POOLINGS[key](in_channels, ratio=ratio, max_nodes=max_nodes)

"""Federated anomaly detection on dynamic ego graphs (thesis chapter 4): negatives, GNN + pooling, discriminator.

Anomaly score = 1 − f(q_{t-1}, q_t); high means unusual. Serving uses
:class:`~training.anomaly.scorer.AnomalyScorer`. Names are re-exported
lazily so that reading the config (``training.anomaly.config``) does not
import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "AnomalyConfig",
    "AnomalyModel",
    "AnomalyScorer",
    "FeaturePool",
    "NegativeSampler",
]

_WHERE = {
    "AnomalyConfig": "training.anomaly.config",
    "AnomalyModel": "training.anomaly.model",
    "AnomalyScorer": "training.anomaly.scorer",
    "FeaturePool": "training.anomaly.negatives",
    "NegativeSampler": "training.anomaly.negatives",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

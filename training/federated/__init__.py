"""Federated training of the anomaly model with Flower (FedProx), simulated on Ray; and its centralized baseline.

Re-exports are lazy so that reading the config (``training.federated.config``) does not import torch or flwr.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["FederatedConfig", "RunSettings", "run_centralized", "run_federated"]

_WHERE = {
    "FederatedConfig": "training.federated.config",
    "RunSettings": "training.federated.task",
    "run_centralized": "training.federated.centralized",
    "run_federated": "training.federated.trainer",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

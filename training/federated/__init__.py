"""Federated training of the anomaly model with Flower (FedProx), simulated on Ray; and its centralized baseline."""

from training.federated.config import FederatedConfig
from training.federated.task import RunSettings

__all__ = ["FederatedConfig", "RunSettings"]

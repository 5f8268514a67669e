"""Typed configuration of the federated run (Flower simulation on Ray)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["FederatedConfig"]


class FederatedConfig(BaseModel):
    """FedProx rounds and client resources; the thesis runs 200 rounds over 5 banks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rounds: int = Field(200, ge=1, description="federated rounds (thesis: 200)")
    proximal_mu: float = Field(0.01, ge=0.0, description="FedProx μ: clients add (μ/2)‖w − w_global‖² to the loss")
    fraction_train: float = Field(1.0, gt=0.0, le=1.0, description="share of banks sampled per round")
    client_cpus: float = Field(1.0, gt=0.0, description="CPUs Ray reserves per simulated bank")
    client_gpus: float = Field(
        -1.0, ge=-1.0, description="GPUs per simulated bank; -1 = auto: 1/banks of one GPU when CUDA exists, else 0"
    )
    ray_cpus: int = Field(2, ge=1, description="CPUs the local Ray instance may use")
    ray_host: str = Field(
        "127.0.0.1", min_length=1,
        description="address the simulation's Ray (GCS, raylet, workers) listens on; the simulation runs on one "
        "machine, so loopback (fedfraud.net.ray_bind)")

"""Typed settings of the FED-SPFD fraud variant (``fraud.spfd`` section of ``fedfraud.yaml``).

The loss weights are the paper's λ_alg, λ_p-n and λ_rec (``papers/fed-spfd-credit-card-fraud.txt``, §3.3); the
sparsity weight is ours (the paper's L_rec adds ``Σ_j z_jᵀ z_j`` unweighted).

``aggregation: dsfl`` replaces the server's FedAvg of the federated arrays (warm start included) by DSFL's
contribution weighting, each bank's update noised inside the bank (:mod:`fedfraud.training.fraud.dsfl`); the
embedding statistics still leave the banks as they are (not covered by its noise).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from fedfraud.training.federated.config import ModelAggregationConfig

__all__ = ["SpfdConfig"]


class SpfdConfig(ModelAggregationConfig):
    """Network widths, the four loss weights and the federated loop."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    embed_dim: int = Field(16, ge=2, le=256, description="h_s: width of the shared embedding z_s")
    private_dim: int = Field(8, ge=1, le=256, description="h_p: width of the private embedding z_p")
    hidden: int = Field(64, ge=4, le=1024, description="hidden width of the encoders and the classifier")
    category_buckets: int = Field(32, ge=4, le=1024, description="hash buckets of a category column's one-hot")

    lambda_alg: float = Field(0.1, ge=0, description="λ_alg: weight of the shared-embedding alignment (KL) loss")
    lambda_pn: float = Field(0.1, ge=0, description="λ_p-n: weight of the private embedding's KL to N(0, I)")
    lambda_rec: float = Field(1.0, ge=0, description="λ_rec: weight of the private reconstruction + sparsity loss")
    sparsity: float = Field(0.01, ge=0, description="weight of the ℓ2 sparsity term inside L_rec (mean ‖z_p‖²)")
    cov_eps: float = Field(1e-3, gt=0, description="ridge added to every covariance before its inverse/log-det")

    warm_rounds: int = Field(2, ge=0, description="federated warm-start rounds: shared autoencoder reconstruction")
    rounds: int = Field(20, ge=1, description="federated training rounds E")
    local_epochs: int = Field(1, ge=1, description="passes over the bank's training rows per round (R steps)")
    batch_size: int = Field(512, ge=16, description="rows per optimizer step")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate")
    weight_decay: float = Field(1e-5, ge=0)
    max_pos_weight: float = Field(20.0, ge=1, description="cap on the fraud weight neg/pos of the BCE loss")
    engine: Literal["loopback", "simulation"] = Field(
        "simulation", description="simulation: Flower's simulation engine on Ray; loopback: the same apps in this "
        "process, every message serialized as over the SuperLink (tests, studies on a 2-core machine)")
    torch_threads: int = Field(1, ge=1, le=64, description="torch threads of the loopback engine")
    seed: int = 13

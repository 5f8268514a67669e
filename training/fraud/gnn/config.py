"""Typed settings of the supervised federated GNN fraud variants (``fraud.gnn`` section of ``fedfraud.yaml``).

``fedavg-gnn`` is the GNN averaged with FedAvg; ``fedrpda`` adds the paper's two strategies
(``papers/fedrpda-risk-aware-graph-fl.txt``), each switchable for the ablation:

* ``risk_aware_aggregation`` (typical-risk dynamic aggregation): each bank's weight in the average is its
  training-node count times ``1 + risk_alpha · exp(−(t − 1) / risk_tau) · H_k``, ``H_k`` the structural risk
  intensity of its fraud nodes (:func:`fedfraud.training.fraud.gnn.rpda.risk_intensity`);
* ``diversified_risk_augmentation`` (diversified-risk average aggregation): variance-perturbation augmentation of
  fraud embeddings and the loss that pulls embeddings to the averaged global class prototypes, weighted by
  ``prototype_weight`` (λ).

``aggregation: dsfl`` replaces the server's weighted mean of the model arrays by DSFL's contribution weighting,
each bank's update noised inside the bank (:mod:`fedfraud.training.fraud.dsfl`); the risk intensities and the
prototypes still leave the banks as they are (not covered by its noise).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from fedfraud.training.federated.config import ModelAggregationConfig

__all__ = ["GNN_VARIANTS", "GnnConfig"]

#: The GNN values of ``fraud.variant``.
GNN_VARIANTS = ("fedavg-gnn", "fedrpda")


class GnnConfig(ModelAggregationConfig):
    """Graph, network, federated loop and the two FedRPDA strategies."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # -- the bank's transaction graph (fedfraud.training.fraud.gnn.graph)
    neighbors: int = Field(
        5, ge=1, le=64, description="a transaction links to the k latest earlier transactions of its cardholder and "
        "the k latest earlier ones at its merchant (past only: what serving has when the transaction arrives)")
    category_buckets: int = Field(32, ge=4, le=1024, description="hash buckets of the category codes' one-hot")

    # -- network (fedfraud.training.fraud.gnn.model.FraudGNN)
    hidden: int = Field(64, ge=4, le=1024, description="width of every layer; h(v), the paper's embedding, too")
    layers: int = Field(2, ge=1, le=3, description="hops: relation paths of length 1..layers are propagated")
    dropout: float = Field(0.1, ge=0, lt=1)

    # -- federated loop (Flower, one SuperNode per bank; full-batch on the bank's graph)
    rounds: int = Field(30, ge=1, description="server rounds")
    local_epochs: int = Field(1, ge=1, description="passes over the bank's training nodes per round")
    batch_size: int = Field(1024, ge=16, description="training nodes per optimizer step (the paper's 1024)")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate (the paper's 1e-3)")
    weight_decay: float = Field(5e-4, ge=0, description="Adam weight decay (the paper's 5e-4)")
    max_pos_weight: float = Field(20.0, ge=1, description="cap on the fraud class weight neg/pos of the CE loss")
    engine: Literal["loopback", "simulation"] = Field(
        "simulation", description="simulation: Flower's simulation engine on Ray (one SuperNode per bank); loopback: "
        "the same ServerApp and ClientApp in this process, every message serialized as over the SuperLink (no "
        "Ray start-up: tests, and studies on a 2-core machine)")
    torch_threads: int = Field(
        1, ge=1, le=64, description="torch threads of the loopback engine (1: a small model's minibatches gain "
        "nothing from a second thread, and lose much on a busy machine)")
    seed: int = 11

    # -- FedRPDA strategy 1: typical-risk dynamic aggregation
    risk_aware_aggregation: bool = Field(True, description="FedRPDA weights the average by risk intensity")
    risk_alpha: float = Field(2.0, ge=0, description="how strongly risk intensity moves a bank's weight")
    risk_tau: float = Field(6.0, gt=0, description="rounds over which the risk term decays (temporal decay)")

    # -- FedRPDA strategy 2: diversified-risk augmentation + global-prototype contrastive loss
    diversified_risk_augmentation: bool = Field(
        True, description="FedRPDA augments fraud embeddings (variance perturbation) and adds the prototype loss")
    prototype_weight: float = Field(0.5, ge=0, description="λ of L = L_CE + λ·L_P (the paper searched 0.1 … 5)")
    stats_momentum: float = Field(0.1, gt=0, le=1, description="m of the running fraud mean/variance (paper: 0.1)")
    augment_ratio: float = Field(1.0, gt=0, le=10, description="augmented fraud embeddings per real training fraud")

"""Typed settings of G-HIN2Vec (thesis chapter 3) and its federated training."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Hin2VecConfig"]


class Hin2VecConfig(BaseModel):
    """Encoder size, the double-triplet loss (Eq. 3.12) and the federation's budget.

    Thesis values where it gives them (margins α1 = 1, α2 = 0.6, β = 0.4, noise level λ = 0.3, M = 5 negatives,
    weight decay 1e-3); sizes are small so a 2-core machine trains it in minutes.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    dim: int = Field(16, ge=2, le=256, description="graph embedding size (the fraud model gets this many columns)")
    hidden: int = Field(32, ge=4, le=512, description="node hidden size of the hetero GNN")
    layers: int = Field(2, ge=1, le=4, description="hetero message-passing layers")
    context: int = Field(16, ge=2, description="size c of the projected metapath / graph representations")
    merchant_buckets: int = Field(4096, ge=16, description="merchant hash buckets of the merchant node table")
    cell_deg: float = Field(1.0, gt=0, description="location nodes: grid cells of this many degrees")
    cardholder_summary: bool = Field(
        True, description="the ego node carries the cardholder's history summary (no id, no coordinates)")
    walk_length: int = Field(4, ge=3, le=16, description="triplets l of a metapath instance")
    negatives: int = Field(5, ge=1, le=16, description="M negative instances per positive (thesis: 5)")
    noise: float = Field(0.3, gt=0, le=1, description="λ: share of triplets replaced in a negative instance")
    beta: float = Field(0.4, gt=0, lt=1, description="β of the triplet operation (Eq. 3.13)")
    alpha_node: float = Field(1.0, ge=0, le=1, description="α1, margin of the node triplet")
    alpha_graph: float = Field(0.6, ge=0, le=1, description="α2, margin of the metapath (graph) triplet")
    dropout: float = Field(0.1, ge=0, lt=1)
    lr: float = Field(5e-3, gt=0, description="Adam learning rate (thesis: 0.005)")
    weight_decay: float = Field(1e-3, ge=0, description="L2 penalty (thesis: 0.001)")
    rounds: int = Field(5, ge=1, description="federated rounds (FedAvg)")
    local_epochs: int = Field(1, ge=1, description="passes over the bank's training graphs per round")
    batch_size: int = Field(32, ge=1, description="graphs per step")
    snapshots_per_cardholder: int = Field(
        4, ge=1, description="ego-graph snapshots of each training cardholder (random moments of its history)")
    max_graphs: int = Field(2048, ge=8, description="at most this many training graphs per bank")
    seed: int = 7

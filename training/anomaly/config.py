"""Typed configuration of the anomaly model, its negative sampling and its local training (thesis ch. 4)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["HEAD_SIZES", "AnomalyConfig", "CardholderDPConfig", "parse_heads"]

#: Discretised fields of the next transaction and their number of classes.
HEAD_SIZES: dict[str, int] = {
    "category": 32,  # fedfraud.feature_store.events.CATEGORY_SLOTS (a test checks they agree)
    "amount": 48,
    "amount-rel": 48,  # log-amount minus the cardholder's running mean, ±4.8 nats in 0.2 steps
    "hour": 24,
    "gap": 32,
    "distance": 24,
    "new-merchant": 2,
}


def parse_heads(spec: str) -> tuple[str, ...]:
    """``"category,amount"`` → ``("category", "amount")``; unknown names raise ``ValueError`` listing the valid ones."""
    names = tuple(h.strip() for h in spec.split(",") if h.strip())
    bad = [h for h in names if h not in HEAD_SIZES]
    if bad or not names:
        raise ValueError(f"unknown next-event head {bad[0] if bad else spec!r}; valid: {', '.join(HEAD_SIZES)}")
    return names


class CardholderDPConfig(BaseModel):
    """DP-SGD inside each bank with the cardholder as the unit of privacy (issue 36; :mod:`.dpsgd`).

    Every local step Poisson-samples the bank's training cardholders at ``sampling_rate``; a sampled
    cardholder's ``pairs_per_step`` transitions form one contribution whose gradient is clipped to
    ``clipping_norm`` in L2 as a whole; the bank adds N(0, (z·C)²) to the sum before the optimizer sees it.
    Steps per round: ``local_epochs × ceil(samples_per_epoch / batch_size)``, public and the same in every bank.
    With ``noise="distributed"`` each of those steps is one DP-FedSGD round over all banks under SecAgg+ (the server
    applies the summed step with Adam at ``lr``); the same count goes to the accountant.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(False, description="cardholder-level DP-SGD in every bank's local training")
    target_epsilon: float = Field(
        8.0, ge=0.0, description="> 0: calibrate the noise multiplier so all steps of all rounds spend this ε at "
        "delta, per cardholder; 0: use noise_multiplier as given")
    noise_multiplier: float = Field(1.0, ge=0.0, description="z: noise std / clipping_norm (if target_epsilon is 0)")
    delta: float = Field(1e-5, gt=0.0, lt=1.0, description="δ per cardholder; keep it below 1 / cardholders")
    clipping_norm: float = Field(1.0, gt=0.0, description="L2 bound on one cardholder's gradient in one step")
    sampling_rate: float = Field(0.25, gt=0.0, le=1.0, description="q: Poisson rate of a cardholder per step")
    pairs_per_step: int = Field(4, ge=1, description="transitions of a sampled cardholder in one step (random)")
    pool_per_cardholder: int = Field(
        64, ge=1, description="training transitions a bank keeps per cardholder (its own reservoir, replacing "
        "max_train_pairs, so one cardholder's data never changes which of another's are kept)")
    cardholders_per_pass: int = Field(
        64, ge=1, description="cardholders per vectorized gradient pass (memory only; no effect on the result)")
    noise: Literal["local", "distributed"] = Field(
        "local", description="'local': every bank adds the full noise to every local step (each update is DP by "
        "itself); 'distributed': DP-FedSGD, one private step per round, each bank adds a Skellam share of the noise "
        "and only the SecAgg+ sum of at least min_banks banks carries all of it (training/anomaly/distributed_dp.py)")
    min_banks: int = Field(
        0, ge=0, description="distributed noise: t, the fewest banks whose shares a round sums (each share has 1/t of "
        "the variance); 0: SecAgg+'s reconstruction threshold, a majority of the banks (fewer survivors halt it)")


class AnomalyConfig(BaseModel):
    """GNN + pooling encoder, readout, negative sampling and local-training knobs.

    Training defaults follow the thesis (dropout 0.1, Adam lr 1e-3, 10 local
    epochs). The encoder defaults do not: with the next-event readout a 2-layer,
    64-wide GCN with TopK pooling scored validation cardholders of the Sparkov
    data as well as the thesis's 5 × 128 (ROC-AUC 0.986 vs 0.988) at a fraction
    of the cost, and ASAP was the slowest pooling (docs/anomaly.md). ``ratio``:
    the thesis keeps 5% of the nodes per layer, which on our ego graphs (at most
    32 nodes) would collapse every graph to one node after the first layer.
    The thesis's Table 4.1 setting is ``readout=thesis, pooling=asap, layers=5,
    hidden=128`` (``fedfraud bench anomaly-thesis``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Checked against the operators' own registry (fedfraud.training.anomaly.pool) where a run is built, not here:
    # reading the registry imports torch and PyG (seconds), which every CLI command would pay to load a config.
    pooling: str = Field("topk", description="pooling operator, one of fedfraud.training.anomaly.pool.pooling_names()")
    layers: int = Field(2, ge=1, le=10, description="GCN layers, each followed by pooling")
    hidden: int = Field(64, ge=8, description="node embedding size of the GCN layers")
    ratio: float = Field(0.5, gt=0.0, le=1.0, description="fraction of nodes kept by each pooling step")
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    disc_hidden: int = Field(128, ge=4, description="hidden units of the 2-layer discriminator MLP")
    lr: float = Field(1e-3, gt=0.0, description="Adam learning rate")
    local_epochs: int = Field(10, ge=1, description="passes per round (federated) over samples_per_epoch pairs")
    samples_per_epoch: int = Field(1024, ge=1, description="real pairs drawn per local epoch (each gets a negative)")
    batch_size: int = Field(128, ge=1, description="real pairs per optimizer step")
    max_train_pairs: int = Field(4000, ge=1, description="pool of training pairs kept per bank (memory bound)")
    max_test_pairs: int = Field(600, ge=1, description="test pairs per bank for the negative-sampling test task")
    max_eval_normal: int = Field(3000, ge=1, description="non-fraud test pairs kept for the real-label evaluation")
    perturb_min: float = Field(0.1, gt=0.0, le=1.0, description="smallest fraction of edges/nodes a negative alters")
    perturb_max: float = Field(0.5, gt=0.0, le=1.0, description="largest fraction of edges/nodes a negative alters")
    readout: Literal["next-event", "contrastive", "thesis", "thesis-newest"] = Field(
        "next-event",
        description=(
            "how the newest transaction is scored against G_{t-1}. 'next-event' (default): likelihood of the "
            "transaction under a factorised next-event model of q_{t-1} (training/anomaly/heads.py); 'contrastive': "
            "a discriminator of (history, event) against event negatives; 'thesis': f(q_{t-1}, q_t) with "
            "q = Σ_l [mean_l ‖ max_l] (thesis §4.4, Table 4.1); 'thesis-newest': that plus the newest node's "
            "first-layer embedding. Chosen by measurement on validation cardholders (docs/anomaly.md)"
        ),
    )
    heads: str = Field(
        "category,amount,amount-rel,hour,gap",
        description=(
            "next-event fields, comma-separated, of fedfraud.training.anomaly.heads.HEAD_SIZES. 'amount-rel' (the "
            "amount against the cardholder's own mean) joined the default on validation of both generators: "
            "handbook ROC-AUC 0.718 → 0.772, Sparkov unchanged (docs/anomaly.md)"
        ),
    )
    upper_tail: str = Field(
        "amount",
        description=(
            "next-event heads scored by their upper tail, −log P(X ≥ x), instead of −log P(x): for amount heads, "
            "an unusually *small* amount is then no surprise and a large one is (comma-separated, of `heads`; "
            "empty: every head two-sided; a head not in `heads` is ignored). A scoring rule only: training is "
            "unchanged. A published model.json "
            "without this key scores as it did when published. 'amount' chosen on validation of both generators "
            "(docs/anomaly.md)"
        ),
    )
    negatives: str = Field(
        "swap=1,amount=1,burst=1,geo=1,hour=1,category=1,new-high=1,spell=1",
        description="contrastive readout: mix of event-negative families (fedfraud.training.anomaly.event_negatives)",
    )
    val_fraction: float = Field(
        0.15, ge=0.0, lt=0.75, description="share of all cardholders held out of training for model selection"
    )
    lr_schedule: Literal["constant", "cosine"] = Field(
        "cosine", description="learning rate over rounds: constant, or cosine from lr to lr_min_factor·lr"
    )
    lr_min_factor: float = Field(0.1, gt=0.0, le=1.0)
    newest_share: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description=(
            "thesis readouts: share of graph negatives that change only the newest node/edge by one transaction's "
            "worth (0 = the thesis's 10-50% perturbations only; see fedfraud.training.anomaly.negatives)"
        ),
    )
    aux_weight: float = Field(1.0, ge=0.0, description="weight of a pooling operator's auxiliary loss (DiffPool)")
    ablate: Literal["none", "no-graph", "no-history", "freeze-merchants", "no-location-time"] = Field(
        "none",
        description=(
            "remove one part of the encoder to measure what it adds (`fedfraud bench anomaly-ablation`): 'none' "
            "(default) is the full model; 'no-graph' q = the history summary only (no GNN); 'no-history' q = the "
            "GNN readout only; 'freeze-merchants' the merchant table stays at its N(0, 0.1) initialisation; "
            "'no-location-time' nodes get no L' and edges no T' (merchant table only). 'no-graph' and 'no-history' "
            "need an event readout (the thesis readouts have no history summary)"
        ),
    )
    init_from: str = Field(
        "",
        description=(
            "registry folder of a published anomaly model to start from instead of a random draw (same "
            "architecture; '' = random). Meant for public pretraining: a model trained on data that is not any "
            "bank's (the project generator), then fine-tuned under cardholder-level DP, which protects only the "
            "fine-tuning data (docs/privacy.md)"
        ),
    )
    cardholder_dp: CardholderDPConfig = Field(
        default_factory=CardholderDPConfig,
        description="cardholder-level DP-SGD in local training (run keys cardholder-dp-*; docs/privacy.md)")
    seed: int = 7

    @field_validator("readout", mode="before")
    @classmethod
    def _legacy_readout(cls, value: object) -> object:
        return {"hierarchical": "thesis", "newest": "thesis-newest"}.get(value, value)  # type: ignore[call-overload]

    @property
    def uses_events(self) -> bool:
        """The readout scores (G_{t-1}, newest event) rather than (G_{t-1}, G_t)."""
        return self.readout in ("next-event", "contrastive")

    @model_validator(mode="after")
    def _check(self) -> AnomalyConfig:
        if self.perturb_min > self.perturb_max:
            raise ValueError("perturb_min must be <= perturb_max")
        if self.ablate in ("no-graph", "no-history") and not self.uses_events:
            raise ValueError(f"ablate={self.ablate!r} needs an event readout: readout {self.readout!r} has no "
                             "history summary to keep or remove")
        if self.cardholder_dp.enabled and self.readout != "next-event":
            raise ValueError(f"cardholder_dp needs readout 'next-event', not {self.readout!r}: its negatives mix "
                             "other cardholders' data into a cardholder's loss, so clipping would not bound them")
        from fedfraud.training.anomaly.event_negatives import parse_mix
        parse_heads(self.heads)
        stray = [h for h in (t.strip() for t in self.upper_tail.split(",")) if h and h not in HEAD_SIZES]
        if stray:  # a head named here but not in `heads` is simply not scored (a variant with fewer heads)
            raise ValueError(f"upper_tail names {stray[0]!r}, not a next-event head; valid: {', '.join(HEAD_SIZES)}")
        parse_mix(self.negatives)
        return self

"""Typed configuration of the central fraud model (``fraud:`` section of ``fedfraud.yaml``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedfraud.training.fraud.gnn.config import GnnConfig
from fedfraud.training.fraud.spfd.config import SpfdConfig

__all__ = ["FraudConfig", "FraudDPConfig"]


class FraudDPConfig(BaseModel):
    """Variant ``federated-dp``: cardholder-level DP boosting, random trees with noised leaf sums under SecAgg+
    (:mod:`fedfraud.training.fraud.dp_boost`). Defaults chosen on validation cardholders (docs/fraud.md).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    epsilon: float = Field(8.0, gt=0, description="ε per cardholder over every release (training cardholders: "
                           "candidates + trees; validation cardholders: the threshold)")
    delta: float = Field(1e-5, gt=0, lt=1, description="δ per cardholder; keep it below 1 / cardholders")
    trees: int = Field(100, ge=1, le=1000, description="random trees, one SecAgg+ release each")
    depth: int = Field(4, ge=1, le=8, description="depth of every tree (2**depth leaves)")
    eta: float = Field(0.6, gt=0, le=1, description="shrinkage of the Newton leaf weights")
    reg_lambda: float = Field(30.0, gt=0, description="λ of −η·G/(H + λ·clip): damps leaves the noise dominates")
    clip: float = Field(1.0, gt=0, description="L2 bound on one cardholder's per-leaf (Σg, Σh) vector in one tree")
    positive_weight: float = Field(20.0, ge=1, description="weight of a fraud row's gradient (public, unlike the "
                                   "default model's neg/pos ratio, which is computed from the labels)")
    candidates: int = Field(15, ge=1, le=64, description="split-candidate quantiles per feature")
    candidate_noise_ratio: float = Field(0.25, gt=0, le=1, description="the candidate release's noise multiplier "
                                         "relative to the trees' (it spreads a cardholder's mass over every feature)")
    candidate_cut: float = Field(1.5, ge=0, description="a candidate bin counts only if its noised mass is above "
                                 "this many standard deviations of the summed noise (the rest is taken for noise)")
    threshold_bins: int = Field(100, ge=10, le=2000, description="score bins of the threshold release")
    threshold_clip: float = Field(4.0, gt=0, description="L2 bound on one validation cardholder's score histogram")
    min_banks: int = Field(0, ge=0, description="t: the fewest banks a release may sum; 0: SecAgg+'s majority")


class FraudConfig(BaseModel):
    """Fraud features, XGBoost training, federated rounds and the decision-threshold rule."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # -- features (one incremental state per cardholder, see fedfraud.training.fraud.features)
    velocity_windows_s: tuple[int, ...] = Field(
        (3600, 86_400, 604_800), min_length=1, description="rolling windows (seconds) for count and amount velocity"
    )
    max_history: int = Field(512, ge=8, le=65535, description="most recent transactions kept for velocity")
    max_merchants: int = Field(1024, ge=8, le=65535, description="most recently visited merchant buckets remembered")
    previous_transaction_features: bool = Field(
        True, description="the previous transaction's category, −log P(category | previous category) from the bank's "
        "training rows, and amount / previous amount in the feature row (a model trained before they existed has "
        "no such key in its registry config and is served without them)")
    merchant_risk_features: bool = Field(
        True, description="the merchant-risk columns (the bank's own merchant label statistics and the federation's "
        "private daily release, `merchant_risk` settings) in the feature row; the replica then reads each "
        "merchant's `merchant_risk` row with the cardholder states")

    # -- XGBoost
    num_boost_round: int = Field(200, ge=1, description="trees of the local and centralized models")
    max_depth: int = Field(4, ge=1, le=16)
    eta: float = Field(0.1, gt=0, le=1)
    subsample: float = Field(
        1.0, gt=0, le=1,
        description=(
            "1.0 (no row/column sampling) so a model with and without AS differs only by the AS column: with 0.8, "
            "two federated runs whose AS column was all-NaN (no information) differed by 13.6 PR-AUC points"
        ),
    )
    colsample_bytree: float = Field(1.0, gt=0, le=1, description="see subsample")
    min_child_weight: float = Field(1.0, ge=0)
    max_scale_pos_weight: float = Field(
        200.0, ge=1, description="cap on neg/pos weighting so a bank with 3 frauds does not get weight 10,000"
    )
    nthread: int = Field(2, ge=1, description="XGBoost threads; the dev machine has 2 cores")
    seed: int = 7

    # -- federated, histogram-based (xgboost.federated; the default variant "federated")
    federated_tls: bool = Field(
        True, description="mutual TLS between banks and the server (throwaway certificates). false: the banks speak "
        "plaintext to a relay on 127.0.0.1 (to read the wire); the server, which libxgboost binds to 0.0.0.0, is "
        "always mutual TLS")
    federated_timeout_s: float = Field(1800.0, gt=0, description="wall-clock limit of one federation session")

    # -- federated, Flower FedXgbBagging (variant "federated-bagging", kept for comparison)
    federated_rounds: int = Field(60, ge=1, description="server rounds; each bank adds one tree per round")
    federated_eta_scaling: bool = Field(
        True,
        description=(
            "divide eta by the number of banks: bagging sums one tree per bank per round, so unscaled it takes "
            "a step #banks times larger than centralized boosting would"
        ),
    )

    # -- evaluation and threshold
    validation_fraction: float = Field(
        0.2, gt=0, lt=1, description="share of *training* cardholders held out to choose the decision threshold"
    )
    threshold_bins: int = Field(
        2000, ge=10, description="score histogram bins banks send so the server picks a federated threshold"
    )
    fpr_target: float = Field(0.01, gt=0, lt=1, description="report recall at this false-positive rate")
    top_reasons: int = Field(3, ge=1, le=32, description="features listed as the reasons of a decision")

    # -- stacking study (`fedfraud eval stacking`)
    stacking_folds: int = Field(5, ge=2, le=20, description="cardholder folds of the cross-fitted anomaly score")
    eval_seeds: int = Field(5, ge=1, le=50, description="model seeds per variant")
    bootstrap_reps: int = Field(1000, ge=50, description="cardholder-bootstrap replicates for 95 % intervals")
    crossfit_anomaly_rounds: int = Field(
        1, ge=1, description="centralized rounds of the default cross-fit anomaly adapter (anomaly section budget)"
    )

    # -- what `fedfraud train fraud` publishes
    variant: Literal["local", "federated", "federated-bagging", "federated-dp", "centralized", "fedavg-gnn", "fedrpda",
                     "fed-spfd"] = "federated"
    use_anomaly_score: bool = True
    extra_features: tuple[Literal["hin2vec"], ...] = Field(
        (), description="stacked feature sets appended to the row: hin2vec (the registry's G-HIN2Vec embedding of "
        "the cardholder's ego graph before the transaction, `fedfraud train embeddings`; --features +hin2vec)")
    hin2vec_version: str = Field("latest", description="the registry's hin2vec version extra_features reads")

    # -- the cardholder-level DP variant "federated-dp" (fedfraud.training.fraud.dp_boost)
    dp: FraudDPConfig = Field(default_factory=FraudDPConfig)
    # -- the supervised federated GNN variants "fedavg-gnn" and "fedrpda" (fedfraud.training.fraud.gnn)
    gnn: GnnConfig = Field(default_factory=GnnConfig)
    # -- the heterogeneous-banks variant "fed-spfd" (fedfraud.training.fraud.spfd; the columns: `banks` section)
    spfd: SpfdConfig = Field(default_factory=SpfdConfig)

    @model_validator(mode="after")
    def _windows(self) -> FraudConfig:
        if any(w <= 0 for w in self.velocity_windows_s) or list(self.velocity_windows_s) != sorted(
            set(self.velocity_windows_s)
        ):
            raise ValueError("velocity_windows_s must be positive, distinct and increasing")
        return self

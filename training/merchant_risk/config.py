"""Typed settings of the federated merchant-risk statistics (``fedfraud eval backtest`` options) and of their
private release (:class:`MerchantNoiseConfig`).
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["MerchantNoiseConfig", "MerchantRiskConfig"]


class MerchantRiskConfig(BaseModel):
    """Window, label delay, common-point-of-purchase horizon, the per-cardholder bound and the bucket domain."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window_days: tuple[int, ...] = Field(
        (10, 21), min_length=1, max_length=8,
        description="windows W (days, increasing): a release counts each window's transactions, one block per W",
    )
    label_delay_days: int = Field(
        7, ge=0, le=365,
        description="a transaction's label (fraud or genuine) is known D days after it, never earlier",
    )
    cpp_days: int = Field(
        7, ge=1, le=365,
        description="common point of purchase: a visitor counts when a fraud on their card follows within N days",
    )
    max_merchants: int = Field(
        10, ge=1, le=65_535,
        description=(
            "k: a cardholder adds to at most k merchants per window (labelled frauds first, then recent): with "
            "per_merchant_cap this bounds one cardholder's part of a bank's vector, the sensitivity DP will need"
        ),
    )
    per_merchant_cap: int = Field(
        1, ge=1, le=1_000,
        description="a cardholder adds at most this much to each count of one merchant (1: transactions = visitors)",
    )
    buckets: int = Field(
        1 << 15, ge=16, le=1 << 22,
        description=(
            "the public domain of the vector: merchants keyed-hashed (federation key) into this many buckets, so "
            "every bank's vector has the same fixed layout and secure aggregation can later sum it blind"
        ),
    )

    @model_validator(mode="after")
    def _windows(self) -> MerchantRiskConfig:
        w = self.window_days
        if any(d < 1 or d > 365 for d in w) or list(w) != sorted(set(w)):
            raise ValueError("window_days must be distinct, increasing, between 1 and 365")
        return self

    def sensitivity_l1(self) -> int:
        """Most one cardholder can change a bank's vector (L1): per window, k × (3 capped counts + 2 flags) + 1
        sole fraud.

        Why: DP noise for the release will be calibrated to this bound.
        """
        return len(self.window_days) * (self.max_merchants * (3 * self.per_merchant_cap + 2) + 1)

    def sensitivity_l2(self) -> float:
        """Most one cardholder can change a bank's vector in L2: per window, k buckets × (3 capped counts of at most
        ``per_merchant_cap`` + 2 flags) and 1 sole fraud, squared and summed, over the windows.

        Why: the release's noise is calibrated to this bound (its leading privacy term is L2's).
        """
        cap = self.per_merchant_cap
        return math.sqrt(len(self.window_days) * (self.max_merchants * (3 * cap * cap + 2) + 1))


class MerchantNoiseConfig(BaseModel):
    """Noise of the daily merchant-risk release: each bank adds its share, SecAgg+ sums (see ``merchant_risk.dp``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    noise_multiplier: float = Field(
        5.0, ge=0.0, le=1e4,
        description=(
            "z: std of the noise in the summed release is z × the L2 sensitivity; 0 releases the clear sum (ε = ∞); "
            "ignored if target_epsilon > 0"
        ),
    )
    target_epsilon: float = Field(
        0.0, ge=0.0,
        description="> 0: the noise is calibrated so that period_days daily releases stay within this ε per cardholder",
    )
    delta: float = Field(
        1e-8, gt=0.0, lt=1e-3,
        description="δ of the per-cardholder (ε, δ); keep it well below 1 / (cardholders in the federation)",
    )
    period_days: int = Field(61, ge=1, le=3660, description="daily releases the reported (or targeted) ε composes")
    min_banks: int = Field(
        0, ge=0, le=1_000,
        description=(
            "t: fewest banks whose noise is in a release; each bank adds variance σ²/t. 0: SecAgg+'s reconstruction "
            "threshold (a majority, at least 2), below which no release is made"
        ),
    )
    count_cap: int = Field(
        1 << 20, ge=1, le=1 << 26,
        description=(
            "a bank's counts are clipped to this before noise (public, so the noised sum fits the SecAgg+ field); "
            "clipping never raises the sensitivity"
        ),
    )

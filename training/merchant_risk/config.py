"""Typed settings of the federated merchant-risk statistics (``fedfraud eval backtest`` options) and of their
private release (:class:`MerchantNoiseConfig`).
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["STATS", "MerchantNoiseConfig", "MerchantRiskConfig"]

#: Statistics a bank counts per keyed-merchant bucket and window, in the order of its vector's rows.
STATS: tuple[str, ...] = ("transactions", "cardholders", "labelled", "frauds", "sole_frauds", "cpp")
#: Statistics one cardholder adds up to ``per_merchant_cap`` to, per merchant (the others are 0/1 flags).
CAPPED: frozenset[str] = frozenset({"transactions", "labelled", "frauds"})


def _check_windows(w: tuple[int, ...], name: str) -> None:
    if any(d < 1 or d > 365 for d in w) or list(w) != sorted(set(w)):
        raise ValueError(f"{name} must be distinct, increasing, between 1 and 365")


class MerchantRiskConfig(BaseModel):
    """Window, label delay, common-point-of-purchase horizon, the per-cardholder bounds and the bucket domain.

    Two vectors come out of a bank each day. Its own (``window_days``, every statistic, ``max_merchants``) feeds
    the bank's ``merchant_bank_*`` features and never leaves it. The release (``release_window_days``,
    ``released_stats``, ``release_max_merchants``) is all that leaves it, and the sensitivities are that vector's.
    Why two: a release's noise grows with its sensitivity, and the rich statistics a bank may use on its own
    customers would need ~10× the noise (L2 10.1 against 1.0 at the defaults), which drowns a compromised
    terminal's handful of victims.
    """

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
            "k: a cardholder adds to at most k merchants per window of the bank's own vector (labelled frauds first, "
            "then recent); the release has its own, smaller bound (release_max_merchants)"
        ),
    )
    per_merchant_cap: int = Field(
        1, ge=1, le=1_000,
        description="a cardholder adds at most this much to each count of one merchant (1: transactions = visitors)",
    )
    released_stats: tuple[str, ...] = Field(
        ("frauds",), min_length=1, max_length=len(STATS),
        description=(
            "statistics that leave the bank in the federation's release (subset of the bank's, in its order); each "
            "one added raises the sensitivity"
        ),
    )
    release_window_days: tuple[int, ...] = Field(
        (21,), min_length=1, max_length=8,
        description="windows (days, increasing) of the release; each one added raises the sensitivity",
    )
    release_max_merchants: int = Field(
        1, ge=1, le=65_535,
        description=(
            "k_f: a cardholder adds to at most this many buckets of the release per window (labelled frauds first): "
            "with per_merchant_cap, the release's sensitivity"
        ),
    )
    release_average: int = Field(
        14, ge=1, le=60,
        description=(
            "the merchant_fed_* features average the latest N daily releases: post-processing of what was released, "
            "so it costs no ε, and it averages N independent noises over a window that barely moves"
        ),
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
        _check_windows(self.window_days, "window_days")
        _check_windows(self.release_window_days, "release_window_days")
        unknown = [s for s in self.released_stats if s not in STATS]
        if unknown:
            raise ValueError(f"released_stats: unknown {unknown}; choose from {list(STATS)}")
        if list(self.released_stats) != [s for s in STATS if s in self.released_stats]:
            raise ValueError(f"released_stats must be distinct and in the order {list(STATS)}")
        return self

    def _per_bucket(self, power: int) -> int:
        """Σ over the released statistics but ``sole_frauds`` of the most one cardholder adds to one bucket, ^power."""
        cap = self.per_merchant_cap
        return sum((cap if s in CAPPED else 1) ** power for s in self.released_stats if s != "sole_frauds")

    def sensitivity_l1(self) -> int:
        """Most one cardholder can change a bank's release vector (L1): per release window, k_f buckets × the
        released statistics (``per_merchant_cap`` for a count, 1 for a flag), + 1 if ``sole_frauds`` is released
        (1 at one bucket at most).

        Why: the release's noise is calibrated to this bound and :func:`~.dp.skellam_rdp` needs it.
        """
        sole = int("sole_frauds" in self.released_stats)
        return len(self.release_window_days) * (self.release_max_merchants * self._per_bucket(1) + sole)

    def sensitivity_l2(self) -> float:
        """Most one cardholder can change a bank's release vector in L2: as :meth:`sensitivity_l1`, squared entries.

        Why: the release's noise is calibrated to this bound (its leading privacy term is L2's).
        """
        sole = int("sole_frauds" in self.released_stats)
        return math.sqrt(len(self.release_window_days) * (self.release_max_merchants * self._per_bucket(2) + sole))


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

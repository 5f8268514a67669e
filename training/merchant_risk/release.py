"""The federation's private release: each bank clips, adds its noise share and reduces modulo a public field;
the sum of the residues, decoded, is the release (what SecAgg+ lets the server learn, and nothing else).

Why a field of its own: Flower's SecAgg+ adds the banks' vectors modulo ``2**32`` after mapping each entry of
``[-c, c]`` to ``[0, 2c]`` (``c``: its ``clipping_range``), and gives the server the *mean* back as floats. A
bank here sends its noised counts as residues ``y = (min(x, cap) + noise) mod M`` in ``[0, M)``, ``M = 2**bits``,
with ``c = M`` and ``2c`` quantization levels, so Flower's mapping is the identity shifted by ``M``: nothing is
clipped or rounded, and with ``2·n·M < 2**32`` nothing wraps, so ``n × mean`` is the exact integer ``Σ y``. The
true sum ``Σ (min(x, cap) + noise)`` is congruent to it modulo ``M``; it lies in ``[-τ, n·cap + τ]`` where ``τ``
bounds the summed noise (Bernstein, failure probability ``2**-64`` per entry), and ``M`` is chosen larger than
that window, so :func:`decode_sum` recovers it exactly.

:func:`private_release` is the in-process simulation of exactly that (the backtest's release); the Flower app
(:mod:`.release_app`) runs it across the banks' SuperNodes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedfraud.training.merchant_risk.config import MerchantNoiseConfig, MerchantRiskConfig
from fedfraud.training.merchant_risk.dp import release_epsilon, release_noise_std, skellam_rdp, skellam_share

__all__ = [
    "SECAGG_MODULUS",
    "ReleasePlan",
    "decode_sum",
    "encode_share",
    "load_release_vector",
    "plan_release",
    "release_privacy_card",
    "private_release",
    "reconstruction_threshold",
    "save_release_vector",
    "vector_path",
]

logger = logging.getLogger(__name__)

#: Flower's SecAgg+ modulus (``SecAggPlusWorkflow(modulus_range=...)``; it must stay <= 2**32).
SECAGG_MODULUS = 1 << 32
#: -ln of the chance that the summed noise of one entry leaves the decoding window: 2**-64 (two-sided).
_TAIL_LOG = 65 * math.log(2.0)


def _margin(variance: float) -> int:
    """τ with ``P(|Z| ≥ τ) ≤ 2**-64`` for Skellam ``Z`` of ``variance``: the root of ``τ² = 2(V + τ/3)·L``."""
    if variance == 0:
        return 0
    return math.ceil(_TAIL_LOG / 3 + math.sqrt(_TAIL_LOG * _TAIL_LOG / 9 + 2 * variance * _TAIL_LOG))


def reconstruction_threshold(banks: int) -> int:
    """SecAgg+ shares needed to rebuild a dropped bank's key, and so the fewest banks a release can sum: a
    majority, at least 2 (2 of 3, 3 of 5).
    """
    return max(2, banks // 2 + 1)


@dataclass(frozen=True)
class ReleasePlan:
    """What every bank and the server agree on for a federation of ``banks``: the noise and the field.

    Attributes:
        noise_std: std of the noise in a release that sums ``survivors`` banks (more banks: more noise).
        banks: banks asked to contribute (SecAgg+'s sample).
        survivors: t, the fewest banks a release can sum; each bank's share has variance ``noise_std² / t``.
        count_cap: a bank's counts are clipped to ``[0, count_cap]`` before noise.
        field_bits: the field is ``2**field_bits``.
    """

    noise_std: float
    banks: int
    survivors: int
    count_cap: int
    field_bits: int

    def __post_init__(self) -> None:
        if not 1 <= self.survivors <= self.banks:
            raise ValueError(f"survivors must be in [1, banks={self.banks}], got {self.survivors}")
        if self.noise_std < 0 or self.count_cap < 1:
            raise ValueError(f"invalid release plan {self}")
        if self.banks * self.count_cap + 2 * self.margin >= self.modulus:
            raise ValueError(f"field 2**{self.field_bits} cannot hold {self.banks} banks × count_cap "
                             f"{self.count_cap} ± {self.margin} of noise")
        if 2 * self.banks * self.modulus >= SECAGG_MODULUS:
            raise ValueError(f"{self.banks} banks × 2 × field 2**{self.field_bits} overflow SecAgg+'s 2**32: "
                             "lower count_cap")

    @property
    def modulus(self) -> int:
        """M = 2**field_bits: every bank's residue lies in [0, M)."""
        return 1 << self.field_bits

    @property
    def share_variance(self) -> float:
        """Variance of one bank's noise share per entry: σ² / t."""
        return self.noise_std * self.noise_std / self.survivors

    @property
    def margin(self) -> int:
        """τ: the summed noise of all ``banks`` (variance n·σ²/t) stays in [-τ, τ] but with probability 2**-64 per
        entry (Bernstein's inequality, which holds for Skellam: ``P(|Z| ≥ τ) ≤ 2·exp(-τ² / (2(V + τ/3)))``).
        """
        return _margin(self.banks * self.share_variance)

    def epsilon(self, releases: int, delta: float, risk: MerchantRiskConfig) -> float:
        """Per-cardholder ε at ``delta`` after ``releases`` daily releases of this plan (∞ without noise)."""
        return release_epsilon(self.noise_std, releases, delta, float(risk.sensitivity_l1()), risk.sensitivity_l2())

    def rdp(self, risk: MerchantRiskConfig, orders: Sequence[int]) -> np.ndarray:
        """One release's RDP per cardholder at ``orders`` (what a bank's privacy ledger adds up; ∞ without noise)."""
        if self.noise_std <= 0:
            return np.full(len(orders), np.inf)
        return skellam_rdp(self.noise_std, float(risk.sensitivity_l1()), risk.sensitivity_l2(), orders)


def plan_release(risk: MerchantRiskConfig, noise: MerchantNoiseConfig, banks: int) -> ReleasePlan:
    """The plan for ``banks`` banks: the noise of :func:`~.dp.release_noise_std`, t from ``noise.min_banks`` or
    SecAgg+'s threshold, and the smallest field that holds the sum.
    """
    if banks < 1:
        raise ValueError(f"banks must be >= 1, got {banks}")
    survivors = noise.min_banks or min(banks, reconstruction_threshold(banks))
    std = release_noise_std(risk, noise)
    bits = max(8, (banks * noise.count_cap + 2 * _margin(banks * std * std / survivors)).bit_length())
    return ReleasePlan(std, banks, survivors, noise.count_cap, bits)


def encode_share(vector: np.ndarray, plan: ReleasePlan, rng: np.random.Generator) -> np.ndarray:
    """A bank's contribution: ``(min(vector, count_cap) + Skellam share) mod M``, int64 in ``[0, M)``.

    Why clip here: ``count_cap`` is public, so the field can be sized without looking at any bank's data, and
    clipping each entry never raises a cardholder's effect on it.
    """
    x = np.asarray(vector)
    if not np.issubdtype(x.dtype, np.integer):
        raise TypeError(f"a bank vector holds integer counts, got {x.dtype}")
    if x.size and int(x.min()) < 0:
        raise ValueError("a bank vector holds counts, got a negative entry")
    over = int(np.count_nonzero(x > plan.count_cap))
    if over:
        logger.warning("merchant_release_clipped entries=%d count_cap=%d", over, plan.count_cap)
    clipped = np.minimum(x.astype(np.int64), plan.count_cap)
    return np.mod(clipped + skellam_share(x.shape, plan.share_variance, rng), plan.modulus)


def decode_sum(residues: np.ndarray, plan: ReleasePlan) -> np.ndarray:
    """The release from ``Σ residues`` (any integer congruent to it mod M): the representative in
    ``[-τ, M - τ)``, which holds every sum of clipped counts plus noise within the margin.
    """
    total = np.asarray(residues, dtype=np.int64)
    return np.mod(total + plan.margin, plan.modulus) - plan.margin


def private_release(bank_vectors: Sequence[np.ndarray], noise: ReleasePlan, rng: np.random.Generator) -> np.ndarray:
    """The federation's private release of one day: each bank's vector clipped, plus its own noise share (bank
    ``i`` draws from the ``i``-th of ``rng.spawn``), reduced mod M, summed and decoded: int64, the shape of a
    bank's vector. With ``noise_std`` 0 it is the clear sum of the clipped vectors (ε = ∞).

    Why here: the backtest replays exactly what the Flower app computes, without the network.
    """
    parts = [np.asarray(v) for v in bank_vectors]
    if not parts:
        raise ValueError("a release needs at least one bank's vector")
    if len({p.shape for p in parts}) != 1:
        raise ValueError(f"bank vectors differ in shape: {sorted({p.shape for p in parts})}")
    if not noise.survivors <= len(parts) <= noise.banks:
        raise ValueError(f"the plan sums {noise.survivors}..{noise.banks} banks, got {len(parts)} vectors")
    shares = [encode_share(v, noise, r) for v, r in zip(parts, rng.spawn(len(parts)), strict=True)]
    return decode_sum(np.sum(shares, axis=0), noise)


def vector_path(data_dir: Path, release_day: int) -> Path:
    """Where a bank keeps its vector of ``release_day`` (UTC day index), inside its own data folder."""
    return Path(data_dir) / "merchant_risk" / f"vector-{int(release_day)}.npz"


def save_release_vector(data_dir: Path, release_day: int, vector: np.ndarray, risk: MerchantRiskConfig) -> Path:
    """Store a bank's :func:`~.stats.release_vector` with the settings it was computed under (the bank's daily job).

    Why the settings: the release's sensitivity assumes them, so the ClientApp refuses a vector made otherwise.
    """
    path = vector_path(data_dir, release_day)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, vector=np.asarray(vector, dtype=np.int64), config=np.asarray(risk.model_dump_json()))
    return path


def load_release_vector(data_dir: Path, release_day: int, risk: MerchantRiskConfig) -> np.ndarray:
    """A bank's stored vector of ``release_day``, checked against ``risk`` (settings and shape)."""
    path = vector_path(data_dir, release_day)
    if not path.is_file():
        raise FileNotFoundError(f"no merchant-risk vector for day {release_day} at {path}")
    with np.load(path, allow_pickle=False) as data:
        vector, stored = data["vector"], MerchantRiskConfig.model_validate_json(str(data["config"]))
    if stored != risk:
        raise ValueError(f"{path} was computed under {stored}, the release runs under {risk}")
    expected = (len(risk.release_window_days) * len(risk.released_stats), risk.buckets)
    if vector.shape != expected:
        raise ValueError(f"{path} has shape {vector.shape}, expected {expected}")
    return vector


def release_privacy_card(risk: MerchantRiskConfig, noise: MerchantNoiseConfig, banks: int) -> dict[str, object]:
    """What a model card says of the merchant-risk release its features read: what leaves each bank, the mechanism,
    the unit and the per-cardholder (ε, δ) per release and over ``noise.period_days`` releases.
    """
    from fedfraud.training.merchant_risk.dp import ACCOUNTANT

    plan = plan_release(risk, noise, banks)

    def finite(x: float) -> float | str:
        return round(x, 4) if math.isfinite(x) else "inf"

    windows = "/".join(map(str, risk.release_window_days))
    return {
        "leaves_a_bank": (f"per keyed-merchant bucket ({risk.buckets}) and window ({windows} d): "
                          f"{', '.join(risk.released_stats)}, at most {risk.release_max_merchants} bucket(s) per "
                          f"cardholder per window, each count clipped to {plan.count_cap}, plus the bank's Skellam "
                          "noise share; summed under SecAgg+, so the server sees only the noised sum"),
        "unit": "one cardholder (add/remove)",
        "sensitivity_l1": risk.sensitivity_l1(), "sensitivity_l2": round(risk.sensitivity_l2(), 6),
        "noise_std": round(plan.noise_std, 6), "min_banks_summed": plan.survivors, "delta": noise.delta,
        "epsilon_per_release": finite(plan.epsilon(1, noise.delta, risk)),
        "period_days": noise.period_days,
        "epsilon_period": finite(plan.epsilon(noise.period_days, noise.delta, risk)),
        "accountant": ACCOUNTANT,
        "bank_own_counts": "the bank's own merchant statistics never leave it",
    }

"""Privacy accountant of the anomaly federation: (ε, δ) of client-level DP composed over all rounds.

Each round the server releases ``mean of the banks' clipped updates + N(0, (z·C/n)²)``
(Flower's fixed-clipping DP wrapper). Removing one bank changes the *sum*
of the clipped updates by at most ``C`` in L2, and the sum's noise is
``N(0, (z·C)²)``, so one round is the Gaussian mechanism with noise
multiplier ``z`` under add/remove-one-bank adjacency; dividing by the public
``n`` is post-processing. The rounds are composed with Rényi DP
(``dp_accounting.rdp.RdpAccountant``, the backend Flower's own
``RdpAccountant`` wraps) and converted to (ε, δ).

Sampling: :func:`gaussian_epsilon` takes a Poisson sampling rate ``q``.
The federation passes ``q = 1`` even when ``fraction_train < 1``: Flower
samples a fixed number of banks, chosen and known by the server, which is
not the secret Poisson sampling that amplification needs. Charging every
round in full is an upper bound for any sampling of banks.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fedfraud.training.federated.config import DPConfig

__all__ = [
    "ACCOUNTANT",
    "DPRound",
    "dp_card",
    "dp_off_card",
    "epsilon_spent",
    "gaussian_epsilon",
    "noise_for_epsilon",
    "smallest_noise",
    "plan_noise",
    "rdp_epsilon",
]

#: What the model card names as the accountant.
ACCOUNTANT = "dp_accounting RDP (RdpAccountant, add/remove-one), Gaussian mechanism composed over rounds"
_ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024])


def _event(noise_multipliers: Sequence[float], sampling_rate: float) -> Any:
    """The composed DpEvent of one Gaussian release per round (identical rounds grouped)."""
    import dp_accounting

    parts = []
    for z, count in sorted(Counter(noise_multipliers).items()):
        gaussian = dp_accounting.GaussianDpEvent(z)
        one = gaussian if sampling_rate >= 1.0 else dp_accounting.PoissonSampledDpEvent(sampling_rate, gaussian)
        parts.append(dp_accounting.SelfComposedDpEvent(one, count))
    return dp_accounting.ComposedDpEvent(parts)


def _check(delta: float, sampling_rate: float) -> None:
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not 0.0 < sampling_rate <= 1.0:
        raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate}")


def epsilon_spent(noise_multipliers: Sequence[float], delta: float, sampling_rate: float = 1.0) -> float:
    """ε at ``delta`` of one Gaussian release per entry (a round's noise multiplier); a round without noise → ∞."""
    _check(delta, sampling_rate)
    if not noise_multipliers:
        return 0.0
    if min(noise_multipliers) <= 0.0:
        return math.inf
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant(_ORDERS)
    accountant.compose(_event(noise_multipliers, sampling_rate))
    return float(accountant.get_epsilon(delta))


def rdp_epsilon(rdp: Callable[[float], float], delta: float) -> float:
    """ε at ``delta`` of a mechanism given by its composed RDP curve (order → RDP), on this accountant's orders and
    conversion (dp-accounting ``compute_epsilon``): for mechanisms ``dp_accounting`` has no event for (DSFL).
    """
    _check(delta, 1.0)
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    eps, _ = compute_epsilon(list(_ORDERS), [rdp(a) for a in _ORDERS], delta)
    return float(eps)


def gaussian_epsilon(noise_multiplier: float, rounds: int, delta: float, sampling_rate: float = 1.0) -> float:
    """ε at ``delta`` after ``rounds`` releases with the same ``noise_multiplier`` (∞ without noise)."""
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    return epsilon_spent([noise_multiplier] * rounds, delta, sampling_rate)


def smallest_noise(epsilon_of: Callable[[float], float], target: float, start: float = 1.0, rel_tol: float = 1e-4,
                   floor: float = 0.0) -> float:
    """The smallest noise (within ``rel_tol``, not below ``floor``) whose ``epsilon_of`` is at most ``target``.

    Why bisection: ε falls monotonically as the noise grows, and the value returned always meets the target (the
    DP-FedSGD, merchant-release and DP-boosting calibrations share it).
    """
    hi = start
    while epsilon_of(hi) > target:
        hi *= 2.0
    lo = hi / 2.0
    while lo > floor and epsilon_of(lo) <= target:
        hi, lo = lo, lo / 2.0
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        if epsilon_of(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi


def noise_for_epsilon(
    target_epsilon: float, rounds: int, delta: float, sampling_rate: float = 1.0, spent: Sequence[float] = ()
) -> float:
    """The smallest noise multiplier for ``rounds`` more releases such that they and the ``spent`` ones (earlier
    rounds' multipliers, e.g. before a resume) stay within ``target_epsilon`` at ``delta``.
    """
    _check(delta, sampling_rate)
    if not (target_epsilon > 0.0 and math.isfinite(target_epsilon)):
        raise ValueError(f"target epsilon must be positive and finite, got {target_epsilon}")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    already = epsilon_spent(spent, delta, sampling_rate)
    if already >= target_epsilon:
        raise ValueError(f"the budget is spent: earlier rounds used epsilon={already:.3f} >= {target_epsilon}")
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    def total(z: float) -> float:
        return epsilon_spent([*spent, *([z] * rounds)], delta, sampling_rate)

    z = float(
        dp_accounting.calibrate_dp_mechanism(
            lambda: RdpAccountant(_ORDERS),
            lambda s: _event([*spent, *([s] * rounds)], sampling_rate),
            target_epsilon,
            delta,
            bracket_interval=dp_accounting.LowerEndpointAndGuess(1e-3, 1.0),
            tol=1e-4,
        )
    )
    # Brent's method stops within tol of the boundary, on either side: step up until the budget holds.
    while total(z) > target_epsilon:
        z += 1e-4
    return z


def plan_noise(dp: DPConfig, rounds: int, spent: Sequence[float] = ()) -> float:
    """This run's noise multiplier: ``dp.noise_multiplier``, or calibrated so that all rounds meet
    ``dp.target_epsilon``; 0.0 when DP is off.
    """
    if not dp.enabled:
        return 0.0
    if dp.target_epsilon > 0:
        return noise_for_epsilon(dp.target_epsilon, rounds, dp.delta, spent=spent)
    return dp.noise_multiplier


@dataclass(frozen=True)
class DPRound:
    """One released round as the accountant sees it (``noise_multiplier`` 0: released without noise).

    ``sensitivity``: the aggregation rule's L2 sensitivity in units of the mean's C/banks (1 for FedAvg; larger
    for the robust rules, :func:`~.strategy.dp_sensitivity_factor`); the noise was scaled by it,
    so ``noise_multiplier`` is still the z the accountant composes.
    """

    noise_multiplier: float
    clipping_norm: float
    banks: int
    sensitivity: float = 1.0

    def __post_init__(self) -> None:
        if self.noise_multiplier < 0 or self.clipping_norm < 0 or self.banks < 1 or self.sensitivity < 1:
            raise ValueError(f"invalid DP round {self}")

    @property
    def noise_std(self) -> float:
        """Std of the noise on each coordinate of the aggregate: z·C·sensitivity / banks aggregated."""
        return self.noise_multiplier * self.clipping_norm * self.sensitivity / self.banks

    @classmethod
    def of(cls, entry: DPRound | Mapping[str, Any]) -> DPRound:
        return (
            entry
            if isinstance(entry, DPRound)
            else cls(
                **{k: entry[k] for k in ("noise_multiplier", "clipping_norm", "banks")},
                sensitivity=float(entry.get("sensitivity", 1.0)),
            )
        )


def dp_off_card(reason: str) -> dict[str, Any]:
    """The privacy section's ``dp`` entry of a model trained without client-level DP: said plainly."""
    return {"dp": "off", "epsilon": "none (no differential-privacy guarantee)", "why": reason}


def dp_card(ledger: Sequence[DPRound | Mapping[str, Any]], delta: float, banks: int) -> dict[str, Any]:
    """The privacy section's ``dp`` entry for the rounds a federated run released (all of them, not only the
    published one: every round's global model went to every bank).
    """
    rounds = [DPRound.of(r) for r in ledger]
    noised = [r.noise_multiplier if r.noise_multiplier > 0 and r.clipping_norm > 0 else 0.0 for r in rounds]
    partial = sum(z == 0.0 for z in noised)
    if partial == len(rounds):
        return dp_off_card("federated run without client-level DP: updates were neither clipped nor noised")
    multipliers = sorted({r.noise_multiplier for r in rounds})
    norms = sorted({r.clipping_norm for r in rounds})
    card: dict[str, Any] = {
        "dp": f"partial: {partial} of {len(rounds)} rounds were released without DP, so no guarantee"
        if partial
        else "on",
        "epsilon": epsilon_spent(noised, delta),
        "delta": delta,
        "unit_of_privacy": "one bank: its whole update in every round (all its cardholders together)",
        "protects": "the released global models (every round's, as the banks and the registry see them) against "
        "anyone but the aggregation server",
        "mechanism": "Flower DifferentialPrivacyClientSideFixedClipping: each bank clips its update to L2 <= "
        "clipping_norm before it leaves (fixedclipping_mod); the server averages the banks with equal weights (or "
        "applies the robust rule, with the noise scaled by its sensitivity_factor) and adds N(0, noise_std^2) to "
        "every coordinate",
        "noise_multiplier": multipliers[0] if len(multipliers) == 1 else multipliers,
        "clipping_norm": norms[0] if len(norms) == 1 else norms,
        "noise_std": sorted({round(r.noise_std, 8) for r in rounds}),
        "sensitivity_factor": sorted({r.sensitivity for r in rounds}),
        "rounds": len(rounds),
        "banks": banks,
        "banks_per_round": sorted({r.banks for r in rounds}),
        "sampling": "no amplification claimed: every round is charged in full",
        "accountant": ACCOUNTANT,
        "not_covered": "the server sees each bank's clipped, un-noised update; scalar metrics (losses, counts, "
        "test metrics) leave the banks without noise",
    }
    return card

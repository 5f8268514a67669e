"""Distributed Skellam noise for the merchant-risk release, and its per-cardholder accountant.

Mechanism. Every bank adds to each entry of its (clipped, integer) vector an independent Skellam share
``Poisson(λ) − Poisson(λ)``, ``2λ = σ²/t``, before SecAgg+ masks it. A sum of independent Skellam variables is a
Skellam variable with the variances added, so a release that sums ``m ≥ t`` banks carries Skellam noise of
variance ``m·σ²/t ≥ σ²`` on every entry, exactly, in integers: nothing is rounded, so the modular arithmetic of
secure aggregation adds it as it is. Why Skellam: a sum of discrete Gaussian shares is not a discrete Gaussian
(its accounting is an approximation), and a continuous Gaussian cannot go through SecAgg's integer field.

Accountant. Agarwal, Kairouz & Liu, *The Skellam Mechanism for Differentially Private Federated Learning*
(NeurIPS 2021, §3): for integer vectors with L1 and L2 sensitivities ``Δ1``, ``Δ2`` and Skellam noise of
variance ``V`` per entry, the release is ``(α, ε(α))``-RDP for every **integer** ``α > 1`` with

    ε(α) ≤ α·Δ2² / (2V) + min(((2α − 1)·Δ2² + 6·Δ1) / (4V²), 3·Δ1 / (2V)).

The first term is the Gaussian mechanism's RDP at ``σ² = V``; it is taken from dp-accounting
(``RdpAccountant`` with ``GaussianDpEvent(σ / Δ2)``) and the second, the price of being discrete, is added.
Daily releases compose by adding RDP curves; (ε, δ) comes from dp-accounting's RDP conversion
(``compute_epsilon``, the one ``RdpAccountant.get_epsilon`` uses), over integer orders only.

Unit of privacy: one cardholder (the per-cardholder bound of :mod:`.stats`, sensitivities from
:class:`~.config.MerchantRiskConfig`), add/remove adjacency. Every daily release is charged in full.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fedfraud.training.merchant_risk.config import MerchantNoiseConfig, MerchantRiskConfig

__all__ = [
    "ACCOUNTANT",
    "ORDERS",
    "noise_for_epsilon",
    "release_epsilon",
    "release_noise_std",
    "skellam_rdp",
    "skellam_share",
]

#: What a release's card names as the accountant.
ACCOUNTANT = (
    "dp_accounting RDP: Gaussian RDP (RdpAccountant, GaussianDpEvent) + the Skellam discretisation term of "
    "Agarwal, Kairouz & Liu 2021, integer orders, composed over daily releases, converted with compute_epsilon"
)
#: Integer Rényi orders (the Skellam bound is proven for integer α only).
ORDERS: tuple[int, ...] = (*range(2, 129), *range(136, 257, 8), 320, 384, 512, 768, 1024)


def _check(delta: float, l1: float, l2: float) -> None:
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not (l2 > 0 and l1 >= l2):
        raise ValueError(f"sensitivities must satisfy L1 >= L2 > 0, got L1={l1}, L2={l2}")


def skellam_rdp(noise_std: float, l1: float, l2: float, orders: Sequence[int] = ORDERS) -> np.ndarray:
    """RDP ε(α) of one release with Skellam noise of std ``noise_std`` on the sum, at each integer order.

    Why two parts: the Gaussian part comes from dp-accounting itself, so the figure can be checked against it;
    the discretisation term vanishes as the noise grows.
    """
    from dp_accounting import GaussianDpEvent
    from dp_accounting.rdp import RdpAccountant

    if noise_std <= 0:
        return np.full(len(orders), np.inf)
    if any(int(a) != a or a < 2 for a in orders):
        raise ValueError("the Skellam RDP bound holds for integer orders >= 2 only")
    accountant = RdpAccountant([float(a) for a in orders])
    accountant.compose(GaussianDpEvent(noise_std / l2))
    alpha = np.asarray(orders, dtype=np.float64)
    var = noise_std * noise_std
    discrete = np.minimum(((2 * alpha - 1) * l2 * l2 + 6 * l1) / (4 * var * var), 3 * l1 / (2 * var))
    return accountant.rdp + discrete


def release_epsilon(noise_std: float, releases: int, delta: float, l1: float, l2: float) -> float:
    """Per-cardholder ε at ``delta`` after ``releases`` daily releases with Skellam noise of std ``noise_std`` on
    the sum (∞ without noise, 0 for no release).
    """
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    _check(delta, l1, l2)
    if releases < 0:
        raise ValueError(f"releases must be >= 0, got {releases}")
    if releases == 0:
        return 0.0
    if noise_std <= 0:
        return math.inf
    eps, _ = compute_epsilon(ORDERS, releases * skellam_rdp(noise_std, l1, l2), delta)
    return float(eps)


def noise_for_epsilon(target_epsilon: float, releases: int, delta: float, l1: float, l2: float,
                      rel_tol: float = 1e-6) -> float:
    """The smallest std of the summed noise (within ``rel_tol``) such that ``releases`` daily releases stay within
    ``target_epsilon`` at ``delta`` (``releases=1``: a budget per release).

    Why bisection: ε falls monotonically as the noise grows, and the answer returned always meets the target.
    """
    _check(delta, l1, l2)
    if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
        raise ValueError(f"target epsilon must be positive and finite, got {target_epsilon}")
    if releases < 1:
        raise ValueError(f"releases must be >= 1, got {releases}")
    from fedfraud.training.federated.accountant import smallest_noise

    return smallest_noise(lambda std: release_epsilon(std, releases, delta, l1, l2), target_epsilon, start=l2,
                          rel_tol=rel_tol)


def release_noise_std(risk: MerchantRiskConfig, noise: MerchantNoiseConfig) -> float:
    """Std of the noise in the summed release: ``noise_multiplier × L2 sensitivity``, or calibrated so that
    ``period_days`` releases meet ``target_epsilon``; 0.0 for the clear sum.
    """
    l1, l2 = float(risk.sensitivity_l1()), risk.sensitivity_l2()
    if noise.target_epsilon > 0:
        return noise_for_epsilon(noise.target_epsilon, noise.period_days, noise.delta, l1, l2)
    return noise.noise_multiplier * l2


def skellam_share(shape: tuple[int, ...], variance: float, rng: np.random.Generator) -> np.ndarray:
    """One bank's noise share: int64 Skellam entries of ``variance`` (``Poisson(v/2) − Poisson(v/2)``); zeros for
    ``variance`` 0.
    """
    if variance < 0:
        raise ValueError(f"variance must be >= 0, got {variance}")
    if variance == 0:
        return np.zeros(shape, dtype=np.int64)
    lam = variance / 2.0
    return rng.poisson(lam, shape).astype(np.int64) - rng.poisson(lam, shape).astype(np.int64)

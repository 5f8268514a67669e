"""Cardholder-level DP-FedSGD with distributed noise: each bank adds a share, SecAgg+ sums them (issue 36).

Why: with the noise added inside each bank (:mod:`.dpsgd`, ``noise="local"``), every bank pays the full noise on its
own ~120 cardholders. Here the full noise appears only once, in the sum over all banks, so it is shared by the
cardholders of the whole federation (each bank's update alone is *not* DP against the server; SecAgg+ makes sure the
server never sees it, only the sum).

One round (:func:`bank_share` in every bank, :class:`ServerStep` on the server):

1. every training cardholder of bank b is in the round with probability ``q`` (Poisson sampling, the bank's own
   draw); a sampled cardholder contributes ``pairs_per_step`` of its transitions, its gradient is computed per
   cardholder (:func:`.dpsgd.per_cardholder_gradients`, one batched pass) at the server's current weights;
2. each cardholder's whole gradient is clipped to ``C`` (times ``1 − 1e-6``, so float error cannot exceed ``C``),
   scaled by ``s = 2**scale_bits / C`` and rounded to integers, **per cardholder**: one cardholder's integer vector
   ``u`` has ``‖u‖₂ ≤ sC + √d/2 = Δ₂`` and ``‖u‖₁ ≤ √d·sC + d/2 = Δ₁`` (rounding moves each of the ``d``
   coordinates by at most 1/2), whatever the other cardholders hold;
3. the bank adds a Skellam share of variance ``σ²/t`` per coordinate (``σ = z·Δ₂``), reduces the integer sum modulo
   the public field ``M = 2**field_bits`` and hands the residues to Flower's ``secaggplus_mod``, which masks them.
   Nothing else leaves the bank in the round (the expected batch ``q·N`` is public: ``N`` is the federation's count
   of training cardholders, a plan constant);
4. the server receives only the SecAgg+ aggregate, decodes it to the signed integer sum (the representative in
   ``[-M/2, M/2)``), divides by ``s·q·N`` and applies it with Adam (``anomaly.lr``), its own state.

**Why the sum is (ε, δ)-DP per cardholder** (add/remove one cardholder, all of its transactions):

- A cardholder is in exactly one bank, and banks sample independently at the same ``q``, so the union of the banks'
  samples is a Poisson sample at rate ``q`` of the federation's cardholders, and ``Σ_b Σ_{i∈b} u_i`` is the sum of
  the sampled cardholders' vectors: DP-SGD over the union dataset, one step per round. Adding or removing one
  cardholder changes that sum by its own ``u``: L2 ≤ Δ₂, L1 ≤ Δ₁.
- Skellam is closed under sums: the shares of ``m`` banks add up to Skellam of variance ``m·σ²/t`` exactly. SecAgg+
  halts a round in which fewer than ``t`` banks' masked vectors arrive (its reconstruction threshold, the default
  ``t``; ``min_banks`` may only raise it), so every sum the server can decode carries Skellam noise of variance
  ≥ σ² (the accountant charges exactly σ², which is conservative when more banks survive). A bank that drops takes
  its cardholders out of the sum entirely, which depends on no cardholder's data. :class:`ServerStep` also refuses
  a round that sums fewer than ``t`` banks.
- Every quantity is an integer before the noise and the field: the mechanism the server observes is the Skellam
  mechanism on an integer query, reduced mod ``M`` (a post-processing: no clamping, nothing data-dependent after the
  noise). ``M`` holds every clean sum of up to ``n̄`` sampled cardholders (``|Σ u_j| ≤ n̄·2**scale_bits`` per
  coordinate; ``n̄`` = ``q·N`` plus a Bernstein margin, exceeded with probability ≤ 2⁻⁶⁴) plus a noise margin the
  summed noise exceeds with probability ≤ 2⁻⁶⁴ per coordinate (Bernstein); a wrap is a wrong update, not a privacy
  loss (the residues mod ``M`` are a function of the noised sum whatever its size).
- Accountant: the Skellam mechanism's RDP (Agarwal, Kairouz & Liu 2021, Thm 3.5;
  :func:`fedfraud.training.merchant_risk.dp.skellam_rdp`: dp-accounting's Gaussian RDP at ``σ/Δ₂ = z`` plus the
  discretisation term), amplified by Poisson sampling with the general bound of Zhu & Wang 2019 (Thm 6, valid for
  any mechanism with an RDP curve, integer orders; :func:`poisson_subsampled_rdp`), composed over every round and
  converted with dp-accounting's ``compute_epsilon``. A Gaussian share would not do: rounding each bank's noised
  Gaussian for the field is not a post-processing of the Gaussian sum, and a sum of discrete Gaussians is not one.
  The card also states the ε dp-accounting gives ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` at the same z
  (smaller: exact for the Gaussian and without the discretisation term) for comparison only.

Multi-step local training with noise shares would not be DP under this argument (a bank's intermediate steps see
only its own share of the noise), so each round is exactly one private step. The merchant table is frozen, and the
readout must be ``next-event``, as in :mod:`.dpsgd`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedfraud.training.anomaly.config import CardholderDPConfig
from fedfraud.training.anomaly.data import PairSet
from fedfraud.training.anomaly.dpsgd import CardholderPool, cardholder_epsilon, per_cardholder_gradients
from fedfraud.training.anomaly.model import AnomalyModel
from fedfraud.training.federated.ledger import ORDERS as LEDGER_ORDERS

__all__ = [
    "ACCOUNTANT",
    "FIELD_BITS_MAX",
    "ORDERS",
    "SECAGG_MODULUS",
    "BankShare",
    "DistributedPlan",
    "RoundRefused",
    "ServerStep",
    "bank_share",
    "clipped_integer_sum",
    "decode_sum",
    "distributed_card",
    "distributed_epsilon",
    "distributed_rdp",
    "load_trainable",
    "plan_distributed",
    "poisson_subsampled_rdp",
    "reconstruction_threshold",
    "run_distributed",
    "simulate_round",
    "trainable",
]

logger = logging.getLogger(__name__)

#: Contiguous integer Rényi orders: Zhu & Wang's bound at order α reads the base RDP at every order 2..α (the
#: banks' privacy ledger keeps every flow's curve at these orders).
ORDERS: tuple[int, ...] = LEDGER_ORDERS
#: Flower's SecAgg+ modulus is 2**32; the residues go in as ``x + M`` per bank (``clipping_range = M``), so
#: ``2·banks·M`` must stay below it (and below int32 in Flower's quantizer).
SECAGG_MODULUS = 1 << 32
FIELD_BITS_MAX = 30
#: Clip to C·(1 − 1e-6): float error in the norm cannot push a clipped gradient above C.
_CLIP_SAFETY = 1.0 - 1e-6
_TAIL_LOG = 65 * math.log(2.0)

ACCOUNTANT = (
    "Skellam mechanism RDP (Agarwal, Kairouz & Liu 2021) at sigma = z * L2-sensitivity of one cardholder's rounded "
    "clipped gradient, Poisson-subsampled at q with Zhu & Wang 2019 Thm 6 (general upper bound, integer orders "
    "2..256), composed over every DP-FedSGD round, dp-accounting compute_epsilon; add/remove one cardholder"
)


class RoundRefused(RuntimeError):
    """A round summed fewer banks than the plan's t: its noise would be below σ², so it is not applied."""


def reconstruction_threshold(banks: int) -> int:
    """SecAgg+'s default threshold here: a majority of the banks, at least 2 (2 of 3, 3 of 5)."""
    return max(2, banks // 2 + 1)


def _margin(variance: float) -> int:
    """τ with P(|Z| ≥ τ) ≤ 2⁻⁶⁴ for Skellam Z of ``variance`` (Bernstein: τ² = 2(V + τ/3)·L)."""
    if variance <= 0:
        return 0
    return math.ceil(_TAIL_LOG / 3 + math.sqrt(_TAIL_LOG * _TAIL_LOG / 9 + 2 * variance * _TAIL_LOG))


def poisson_subsampled_rdp(rdp: np.ndarray, q: float) -> np.ndarray:
    """RDP of the Poisson-subsampled mechanism at orders 2..A from the base RDP ``rdp`` at orders 2..A (contiguous).

    Zhu & Wang 2019, "Poisson Subsampled Rényi Differential Privacy", Theorem 6 (any mechanism, integer α ≥ 2)::

        ε'(α) ≤ 1/(α−1) · log[ (1−q)^(α−1)·(αq − q + 1) + C(α,2)·q²·(1−q)^(α−2)·e^ε(2)
                              + 3·Σ_{l=3..α} C(α,l)·(1−q)^(α−l)·q^l·e^((l−1)·ε(l)) ]

    and never above ``rdp`` itself.
    """
    from scipy.special import gammaln, logsumexp

    base = np.asarray(rdp, dtype=np.float64)
    if not 0.0 < q <= 1.0:
        raise ValueError(f"sampling rate must be in (0, 1], got {q}")
    if q == 1.0:
        return base.copy()
    lq, l1q = math.log(q), math.log1p(-q)
    out = np.empty_like(base)
    for i in range(len(base)):
        a = i + 2
        ls = np.arange(3, a + 1)
        log_binom = gammaln(a + 1) - gammaln(ls + 1) - gammaln(a - ls + 1)
        terms = [
            (a - 1) * l1q + math.log(a * q - q + 1),
            math.log(a * (a - 1) / 2) + 2 * lq + (a - 2) * l1q + base[0],
            *(math.log(3.0) + log_binom + (a - ls) * l1q + ls * lq + (ls - 1) * base[ls - 2]),
        ]
        out[i] = float(logsumexp(terms)) / (a - 1)
    # Poisson sampling never raises the RDP (joint quasi-convexity of the Rényi divergence: the subsampled output is
    # a mixture over samples, each pair of components differing in one cardholder at most), so keep the smaller.
    return np.minimum(out, base)


def distributed_rdp(noise_multiplier: float, q: float, l1: float, l2: float) -> np.ndarray:
    """RDP at :data:`ORDERS` of one round of Poisson-sampled Skellam noise of std ``z·l2`` (rounds add up)."""
    from fedfraud.training.merchant_risk.dp import skellam_rdp

    return poisson_subsampled_rdp(skellam_rdp(noise_multiplier * l2, l1, l2, ORDERS), q)


def distributed_epsilon(noise_multiplier: float, steps: int, delta: float, q: float, l1: float, l2: float) -> float:
    """ε per cardholder at ``delta`` after ``steps`` rounds of Poisson-sampled Skellam noise of std ``z·l2``."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    if steps == 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    eps, _ = compute_epsilon(ORDERS, steps * distributed_rdp(noise_multiplier, q, l1, l2), delta)
    return float(eps)


@dataclass(frozen=True)
class DistributedPlan:
    """What every bank and the server agree on, from public settings only.

    Attributes:
        noise_multiplier: z; the summed noise has std ``z·Δ₂`` in integer units (``z·C·Δ₂/(sC)`` in gradient units).
        clipping_norm: C.
        sampling_rate: q.
        banks: banks asked every round (SecAgg+'s sample).
        survivors: t, the fewest banks a round may sum; each share has variance σ²/t.
        dims: d, trainable coordinates (the merchant table is frozen).
        cardholders: N, training cardholders of the whole federation (the public divisor q·N).
        scale_bits: ``s·C = 2**scale_bits``.
        field_bits: ``M = 2**field_bits``.
    """

    noise_multiplier: float
    clipping_norm: float
    sampling_rate: float
    banks: int
    survivors: int
    dims: int
    cardholders: int
    scale_bits: int
    field_bits: int

    def __post_init__(self) -> None:
        if not (2 <= self.survivors <= self.banks):
            raise ValueError(f"t must be in [2, banks={self.banks}], got {self.survivors}")
        if self.noise_multiplier < 0 or not math.isfinite(self.noise_multiplier):
            raise ValueError(f"noise multiplier must be finite and >= 0, got {self.noise_multiplier}")
        if 2 * self.banks * self.modulus > SECAGG_MODULUS or self.field_bits > FIELD_BITS_MAX:
            raise ValueError(f"{self.banks} banks × 2 × 2**{self.field_bits} overflow SecAgg+'s 2**32")
        if 2 * (self.sampled_bound * (1 << self.scale_bits) + self.margin) >= self.modulus:
            raise ValueError(f"field 2**{self.field_bits} cannot hold {self.sampled_bound} sampled cardholders × 2**"
                             f"{self.scale_bits} ± {self.margin} of noise")

    @property
    def sampled_bound(self) -> int:
        """Cardholders a round sums, but with probability ≤ 2⁻⁶⁴ (Bernstein on Binomial(N, q)); at most N."""
        n, q = self.cardholders, self.sampling_rate
        tail = _TAIL_LOG / 3 + math.sqrt(_TAIL_LOG * _TAIL_LOG / 9 + 2 * n * q * (1 - q) * _TAIL_LOG)
        return min(n, math.ceil(n * q + tail))

    @property
    def scale(self) -> float:
        """s: integer units per gradient unit."""
        return (1 << self.scale_bits) / self.clipping_norm

    @property
    def l2(self) -> float:
        """Δ₂: L2 bound on one cardholder's integer vector."""
        return float(1 << self.scale_bits) + math.sqrt(self.dims) / 2

    @property
    def l1(self) -> float:
        """Δ₁: L1 bound on one cardholder's integer vector."""
        return math.sqrt(self.dims) * (1 << self.scale_bits) + self.dims / 2

    @property
    def noise_std(self) -> float:
        """σ = z·Δ₂: std of the noise in a sum of t banks, integer units."""
        return self.noise_multiplier * self.l2

    @property
    def share_variance(self) -> float:
        """σ²/t per coordinate of one bank's share."""
        return self.noise_std**2 / self.survivors

    @property
    def modulus(self) -> int:
        return 1 << self.field_bits

    @property
    def margin(self) -> int:
        """Noise margin of a sum of all ``banks`` shares (variance banks·σ²/t): exceeded w.p. ≤ 2⁻⁶⁴ per coordinate."""
        return _margin(self.banks * self.share_variance)

    @property
    def divisor(self) -> float:
        """s·q·N: from the decoded integer sum to the mean clipped gradient."""
        return self.scale * self.sampling_rate * self.cardholders

    @property
    def noise_std_gradient(self) -> float:
        """The summed noise's std in gradient units (σ/s), before the division by q·N."""
        return self.noise_std / self.scale

    def epsilon(self, steps: int, delta: float) -> float:
        return distributed_epsilon(self.noise_multiplier, steps, delta, self.sampling_rate, self.l1, self.l2)

    def rdp(self, steps: int) -> np.ndarray:
        """The RDP curve at :data:`ORDERS` of ``steps`` rounds under this plan (what a bank's ledger adds up)."""
        return steps * distributed_rdp(self.noise_multiplier, self.sampling_rate, self.l1, self.l2)


def _field_bits(banks: int) -> int:
    """The largest field SecAgg+ can hold for ``banks`` (2·banks·M ≤ 2**32)."""
    return min(FIELD_BITS_MAX, 31 - math.ceil(math.log2(banks)))


def _calibrate(target: float, steps: int, delta: float, q: float, dims: int, scale_bits: int) -> float:
    """The smallest z (within 1e-4 relative) whose ε over ``steps`` rounds is ≤ ``target``."""
    from fedfraud.training.federated.accountant import smallest_noise

    l2 = float(1 << scale_bits) + math.sqrt(dims) / 2
    l1 = math.sqrt(dims) * (1 << scale_bits) + dims / 2
    return smallest_noise(lambda z: distributed_epsilon(z, steps, delta, q, l1, l2), target, floor=1e-3)


def plan_distributed(cfg: CardholderDPConfig, steps: int, banks: int, dims: int, cardholders: int) -> DistributedPlan:
    """The plan of a run: z calibrated to ``cfg.target_epsilon`` over ``steps`` rounds (or ``cfg.noise_multiplier``),
    t from ``cfg.min_banks`` or SecAgg+'s threshold, and the finest integer scale the field holds.
    """
    if banks < 3:
        raise ValueError(f"SecAgg+ needs >= 3 banks, got {banks}")
    if steps < 1 or dims < 1 or cardholders < 1:
        raise ValueError(f"bad plan input: steps={steps}, dims={dims}, cardholders={cardholders}")
    t = cfg.min_banks or reconstruction_threshold(banks)
    if t >= banks:
        raise ValueError(f"min_banks must be below banks ({banks}): SecAgg+'s threshold is < num_shares")
    bits = _field_bits(banks)

    def noise(scale_bits: int) -> float:
        if cfg.target_epsilon <= 0:
            return cfg.noise_multiplier
        return _calibrate(cfg.target_epsilon, steps, cfg.delta, cfg.sampling_rate, dims, scale_bits)

    def plan(z: float, scale_bits: int) -> DistributedPlan | None:
        try:
            return DistributedPlan(z, cfg.clipping_norm, cfg.sampling_rate, banks, t, dims, cardholders, scale_bits,
                                   bits)
        except ValueError as err:
            if "cannot hold" not in str(err):
                raise
            return None

    # z hardly depends on the scale (only through the small discretisation term): find the finest scale that fits
    # with z from a fine scale plus 5%, then calibrate at that scale and step down until the plan fits
    scale_bits = 24
    rough = noise(scale_bits) * 1.05
    while scale_bits > 4 and plan(rough, scale_bits) is None:
        scale_bits -= 1
    while scale_bits > 4:
        found = plan(noise(scale_bits), scale_bits)
        if found is not None:
            return found
        scale_bits -= 1
    raise ValueError(f"no integer scale fits {cardholders} cardholders in a 2**{bits} field")


def trainable(model: AnomalyModel) -> list[tuple[str, torch.nn.Parameter]]:
    """The parameters DP-FedSGD trains, in a fixed order: every one but the frozen merchant table."""
    return [(n, p) for n, p in model.named_parameters() if n != "encoder.merchant.weight"]


@dataclass(frozen=True)
class BankShare:
    """A bank's round: the residues it hands to SecAgg+ and, for logs and tests only, what they are made of."""

    residues: np.ndarray
    clean: np.ndarray
    noise: np.ndarray
    cardholders: int
    clipped: int
    loss: float


def clipped_integer_sum(per: np.ndarray, plan: DistributedPlan) -> tuple[np.ndarray, int]:
    """Σ over cardholders (rows of ``per``) of each one's vector clipped to the plan's C (times ``1 − 1e-6``),
    scaled to integer units and rounded **per cardholder**: the step that bounds one cardholder's integer vector by
    Δ₂ and Δ₁. Returns (int64 sum, cardholders clipped). DP-FedSGD and DP boosting both call it.
    """
    bound = plan.clipping_norm * _CLIP_SAFETY
    norms = np.linalg.norm(per, axis=1)
    factor = np.minimum(bound / np.maximum(norms, 1e-300), 1.0)
    units = np.rint(per * (factor * plan.scale)[:, None]).astype(np.int64)
    return units.sum(0), int((norms > bound).sum())


def bank_share(
    model: AnomalyModel,
    sets: Sequence[PairSet],
    pool: CardholderPool,
    cfg: CardholderDPConfig,
    plan: DistributedPlan,
    sample_rng: np.random.Generator,
    noise_rng: np.random.Generator,
) -> BankShare:
    """One bank's contribution to a round at the model's current weights: Σ of its sampled cardholders' clipped,
    scaled, rounded gradients, plus its Skellam share, mod M (int64 in [0, M)).
    """
    names = [n for n, _ in trainable(model)]
    contributions = pool.sample(plan.sampling_rate, cfg.pairs_per_step, sample_rng)
    total = np.zeros(plan.dims, dtype=np.int64)
    clipped, loss_sum = 0, 0.0
    for a in range(0, len(contributions), cfg.cardholders_per_pass):
        grads, losses = per_cardholder_gradients(model, sets, contributions[a : a + cfg.cardholders_per_pass])
        flat = torch.cat([grads[n].reshape(grads[n].shape[0], -1).double() for n in names], dim=1)
        part, n_clipped = clipped_integer_sum(flat.detach().cpu().numpy(), plan)
        if part.shape[0] != plan.dims:
            raise ValueError(f"model has {part.shape[0]} trainable coordinates, the plan {plan.dims}")
        total += part
        clipped += n_clipped
        loss_sum += float(losses.sum())
    from fedfraud.training.merchant_risk.dp import skellam_share

    noise = skellam_share((plan.dims,), plan.share_variance, noise_rng)
    n = len(contributions)
    return BankShare(np.mod(total + noise, plan.modulus), total, noise, n, clipped, loss_sum / n if n else math.nan)


def decode_sum(residues: np.ndarray, plan: DistributedPlan) -> np.ndarray:
    """The signed integer sum from any integer congruent to Σ residues mod M: the representative in [-M/2, M/2)."""
    half = plan.modulus // 2
    return np.mod(np.asarray(residues, dtype=np.int64) + half, plan.modulus) - half


class ServerStep:
    """The server's side of DP-FedSGD: decode the SecAgg+ sum, scale it to a mean gradient, one Adam step.

    Why Adam on the server: the banks send one noised gradient sum per round, nothing stateful; the optimizer's
    state is a function of the released sums only (post-processing).
    """

    def __init__(self, model: AnomalyModel, plan: DistributedPlan, lr: float) -> None:
        self.model = model
        self.plan = plan
        self.params = [p for _, p in trainable(model)]
        if sum(p.numel() for p in self.params) != plan.dims:
            raise ValueError("the plan's dims differ from the model's trainable coordinates")
        self.optimizer = torch.optim.Adam(self.params, lr=lr)

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def apply(self, summed: np.ndarray, banks_summed: int) -> np.ndarray:
        """Apply the decoded sum of ``banks_summed`` banks' residues; returns the mean gradient it applied.

        Raises:
            RoundRefused: fewer than t banks in the sum (SecAgg+ already halts such a round; this is the second lock),
                or more than the plan's banks (the field is sized for them: a larger sum may have wrapped).
        """
        if not self.plan.survivors <= banks_summed <= self.plan.banks:
            raise RoundRefused(f"{banks_summed} banks summed, the plan needs t = {self.plan.survivors} to "
                               f"{self.plan.banks}")
        mean = decode_sum(summed, self.plan).astype(np.float64) / self.plan.divisor
        offset = 0
        self.optimizer.zero_grad()
        for p in self.params:
            k = p.numel()
            p.grad = torch.from_numpy(mean[offset : offset + k]).reshape(p.shape).to(p.dtype)
            offset += k
        self.optimizer.step()
        return mean

    def weights(self) -> list[np.ndarray]:
        """The trainable weights, in :func:`trainable` order (what the server sends the banks)."""
        return [p.detach().cpu().numpy().copy() for p in self.params]


def load_trainable(model: AnomalyModel, arrays: Sequence[np.ndarray]) -> None:
    """Set the trainable weights from ``arrays`` (:func:`trainable` order)."""
    params = trainable(model)
    if len(arrays) != len(params):
        raise ValueError(f"expected {len(params)} arrays, got {len(arrays)}")
    with torch.no_grad():
        for (_, p), a in zip(params, arrays, strict=True):
            p.copy_(torch.from_numpy(np.asarray(a)).reshape(p.shape))


def distributed_card(cfg: CardholderDPConfig, plan: DistributedPlan, steps: int, rounds: int) -> dict[str, Any]:
    """The model card's ``client_dp`` entry of a DP-FedSGD run with distributed noise under SecAgg+."""
    epsilon = plan.epsilon(steps, cfg.delta)
    gaussian = cardholder_epsilon(plan.noise_multiplier, steps, cfg.delta, plan.sampling_rate)
    return {
        "dp": "on",
        "noise": "distributed",
        "unit_of_privacy": "one cardholder: all of its transactions in its bank (add/remove); a person with "
        "cards at two banks is two cardholders",
        "epsilon": epsilon,
        "delta": cfg.delta,
        "epsilon_gaussian_reference": gaussian,
        "noise_multiplier": plan.noise_multiplier,
        "clipping_norm": cfg.clipping_norm,
        "sampling_rate": plan.sampling_rate,
        "pairs_per_step": cfg.pairs_per_step,
        "steps": steps,
        "rounds": rounds,
        "banks": plan.banks,
        "min_banks_summed": plan.survivors,
        "cardholders": plan.cardholders,
        "scale_bits": plan.scale_bits,
        "field_bits": plan.field_bits,
        "sensitivity_l2_units": plan.l2,
        "sensitivity_l1_units": plan.l1,
        "noise_std_sum": plan.noise_std_gradient,
        "accountant": ACCOUNTANT,
        "mechanism": "DP-FedSGD under SecAgg+: per round each bank Poisson-samples its cardholders, clips each "
        "one's gradient to clipping_norm, rounds it to 2**scale_bits units per clipping_norm, adds a Skellam share "
        "of variance sigma^2/t and sends the sum mod 2**field_bits masked by SecAgg+; the server decodes only the "
        "sum over >= t banks (noise >= sigma^2), divides by q*N and steps Adam; merchant table frozen",
        "protects": "each training cardholder in the sums the server decodes and in every released model "
        "(post-processing); a single bank's masked vector is not DP by itself and only SecAgg+ keeps it from "
        "the server",
        "not_covered": "validation and test cardholders' data, which enter only scalar metrics (validation "
        "loss selects the published round; test metrics); per-bank counts of training cardholders (N is public); "
        "the feature mechanism's per-report ε is separate (feature_ldp); a server colluding with k of the m summed "
        "banks knows their shares, so the stated ε holds only while k <= m - t (5 banks, t = 3: up to 2)",
    }


def simulate_round(
    model: AnomalyModel,
    banks: Sequence[tuple[Sequence[PairSet], CardholderPool]],
    cfg: CardholderDPConfig,
    plan: DistributedPlan,
    server: ServerStep,
    rngs: Sequence[tuple[np.random.Generator, np.random.Generator]],
) -> tuple[list[BankShare], np.ndarray]:
    """One round in one process: every bank's :func:`bank_share`, summed as SecAgg+ would (mod M), applied.

    Why: the bench replays exactly the arithmetic of the Flower path (:mod:`fedfraud.training.federated.dp_fedsgd`)
    without the network; the SecAgg+ test checks the Flower path gives the same sum.
    """
    shares = [bank_share(model, sets, pool, cfg, plan, *r) for (sets, pool), r in zip(banks, rngs, strict=True)]
    summed = np.mod(np.sum([s.residues for s in shares], axis=0), plan.modulus)
    return shares, server.apply(summed, len(shares))


def run_distributed(settings: Any, threads: int = 1, noise_seed: int | None = None) -> Any:
    """Train the anomaly model with DP-FedSGD (distributed noise) over every bank of ``settings.data_dir`` in one
    process, evaluate and checkpoint every ``steps per round`` rounds, publish; returns the run's summary.

    The arithmetic is the Flower path's (:func:`simulate_round`); the bench uses this to avoid SecAgg+'s four
    message stages per round on a shared CPU. Sampling and noise draw from OS entropy, as the Flower client's do:
    the model is published with a card that states ε, and noise drawn from a known seed (the config's ``seed``
    was used until 2026-11-27) could be subtracted by whoever knows it. ``noise_seed`` makes a run reproducible
    for a test; its card then says the noise was seeded.
    """
    from tqdm.auto import tqdm

    from fedfraud.feature_store.privacy import feature_ldp_card
    from fedfraud.training.anomaly.engine import sources_of
    from fedfraud.training.anomaly.federated.task import bank_data, initial_model, local_test, lr_factor, total_dp_steps
    from fedfraud.training.anomaly.federated.trainer import RunResult, prepare
    from fedfraud.training.anomaly.run import Checkpoint, RoundRecord, checkpoint_dir, log_round, publish_run
    from fedfraud.training.registry import ModelRegistry

    cfg = settings.anomaly
    dp = cfg.cardholder_dp
    if not dp.enabled or dp.noise != "distributed":
        raise ValueError("run_distributed needs anomaly.cardholder_dp.enabled and noise=distributed")
    if cfg.readout != "next-event":
        raise ValueError("cardholder-level DP needs the next-event readout")
    # prepare() checks the data and the checkpoint; its local DP-SGD check refuses distributed noise by design
    banks = prepare(type(settings).from_flat({**settings.to_flat(), "cardholder-dp-enabled": False}), "federated")
    torch.set_num_threads(threads)
    model = initial_model(settings)
    model.encoder.merchant.weight.requires_grad_(False)
    data = [bank_data(settings, b) for b in banks]
    sets = [[sources_of([d], cfg, settings.egograph.max_nodes)[0].pairs] for d in data]
    pools = [CardholderPool.of(s) for s in sets]
    rounds = settings.federated.rounds
    steps = total_dp_steps(settings)
    per_round = steps // rounds
    dims = sum(p.numel() for _, p in trainable(model))
    plan = plan_distributed(dp, steps, len(banks), dims, sum(len(p) for p in pools))
    logger.info("distributed_dp plan z=%.4f t=%d/%d N=%d dims=%d scale_bits=%d field_bits=%d noise_std=%.4g eps=%.4f",
                plan.noise_multiplier, plan.survivors, plan.banks, plan.cardholders, dims, plan.scale_bits,
                plan.field_bits, plan.noise_std_gradient, plan.epsilon(steps, dp.delta))
    server = ServerStep(model, plan, cfg.lr)
    checkpoint = Checkpoint(0, model.state_dict(), [], settings.to_flat())
    checkpoint.privacy = {b.bank: vars(b.privacy) for b in data}
    start = time.perf_counter()
    step = 0
    for rnd in tqdm(range(1, rounds + 1), desc="DP-FedSGD blocks", unit="block"):
        t0 = time.perf_counter()
        server.set_lr(cfg.lr * lr_factor(cfg, rnd, rounds))
        model.train()
        losses = []
        for _ in range(per_round):
            step += 1
            rngs = [(np.random.default_rng(None if noise_seed is None else [noise_seed, d.bank, step, 0]),
                     np.random.default_rng(None if noise_seed is None else [noise_seed, d.bank, step, 1]))
                    for d in data]
            shares, _ = simulate_round(model, list(zip(sets, pools, strict=True)), dp, plan, server, rngs)
            losses += [s.loss for s in shares if math.isfinite(s.loss)]
        model.eval()
        per_bank = {d.bank: local_test(model, d) for d in data}
        record = RoundRecord(rnd, float(np.mean(losses)) if losses else math.nan, per_bank, time.perf_counter() - t0)
        checkpoint.offer(record, model.state_dict())
        checkpoint.save(checkpoint_dir(settings.out_dir, "federated"))
        log_round(record, rounds, "federated")
    wall = time.perf_counter() - start
    version = None
    if settings.publish and checkpoint.history:
        selected, weights = checkpoint.selected
        version = publish_run(
            ModelRegistry(settings.registry_dir),
            weights,
            selected_round=selected,
            mode="federated",
            anomaly_cfg=cfg,
            encoder_cfg=settings.encoder,
            ego_cfg=settings.egograph,
            config={**settings.config_dump(), "mode": "federated"},
            history=checkpoint.history,
            privacy=checkpoint.privacy,
            client_dp={**distributed_card(dp, plan, steps, rounds),
                       "noise_source": "OS entropy" if noise_seed is None else
                       f"seeded ({noise_seed}): reproducible, so NOT a guarantee against whoever knows the seed"},
            feature_ldp=feature_ldp_card(settings.privacy),
        ).tag
    return RunResult("federated", checkpoint.round, len(banks), wall, checkpoint.selected_summary,
                     [r.seconds for r in checkpoint.history], version)

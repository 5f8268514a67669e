"""Cardholder-level DP-SGD inside a bank: Poisson-sampled cardholders, per-cardholder clipping, Gaussian noise.

Why the cardholder and not the bank: with five banks, noise sized for a bank's whole update destroys the
model (docs/benchmarks.md); a bank holds thousands of cardholders, and DP with many units costs far less.

One step (:func:`private_gradient`):

1. every training cardholder of the bank is in the step with probability ``q`` (Poisson sampling);
2. a sampled cardholder contributes ``pairs_per_step`` of its own transitions, and its loss is their mean
   next-event NLL; its gradient is computed **per cardholder** with ``torch.func`` (one batched forward,
   ``vjp`` of the per-cardholder loss vector, ``vmap`` over one-hot cotangents: exact per-cardholder
   gradients of one batched pass; ``vmap`` over cardholders' forwards is impossible because each
   cardholder's graphs have their own shapes);
3. each cardholder's whole gradient (all trainable parameters together) is clipped to ``C`` in L2;
4. the bank adds ``N(0, (z·C)²)`` to every coordinate of the sum and divides by the expected number of
   cardholders ``q·N`` (a public constant for the step).

The merchant table is frozen (no gradient) under DP: noise on all of its rows would drown the update, and
noise on only the rows a step touched would name them. The readout must be ``next-event``: its loss for a
cardholder reads only that cardholder's history and next event (the contrastive and thesis readouts draw
negatives from other cardholders' data, which per-cardholder clipping would not bound).

Noise is added **inside each bank** (local DP-SGD): every update a bank sends is (ε, δ)-DP for each of its
training cardholders by itself, against the server as well as the banks. Distributed noise (each bank a
share, full noise only in the SecAgg+ sum) is :mod:`.distributed_dp` (``noise="distributed"``), which takes
one private step per round instead.

Accountant (:func:`plan_noise`, :func:`cardholder_epsilon`): ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``
self-composed over every step of every round, add/remove one cardholder (all its transactions), dp-accounting
RDP; a cardholder is in one bank only, so the banks' steps do not compose for it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, vjp, vmap
from torch_geometric.data import Batch
from torch_geometric.utils import scatter

from fedfraud.training.anomaly.config import CardholderDPConfig
from fedfraud.training.anomaly.data import PairSet
from fedfraud.training.anomaly.heads import event_targets
from fedfraud.training.anomaly.model import AnomalyModel

__all__ = [
    "ACCOUNTANT",
    "CardholderDP",
    "CardholderPool",
    "DPStepResult",
    "ORDERS",
    "cardholder_dp_card",
    "cardholder_epsilon",
    "clip_and_sum",
    "dp_event",
    "per_cardholder_gradients",
    "plan_noise",
    "private_gradient",
    "steps_per_round",
]

#: What the card names as the accountant.
ACCOUNTANT = (
    "dp_accounting RDP (RdpAccountant), PoissonSampledDpEvent(q, GaussianDpEvent(z)) self-composed over every "
    "local step of every round, add/remove one cardholder"
)


def steps_per_round(local_epochs: int, samples_per_epoch: int, batch_size: int) -> int:
    """Local DP-SGD steps of one bank in one round: public settings only, so every bank and the server agree."""
    return local_epochs * math.ceil(samples_per_epoch / batch_size)


#: Integer Rényi orders: dp-accounting computes the Poisson-subsampled Gaussian exactly at integers (its series for
#: fractional orders below 2 fails to converge at these z and drops them with a warning); at many steps and ε ≥ 1
#: the best order lies above 2.
ORDERS: tuple[float, ...] = (*map(float, range(2, 65)), 80.0, 96.0, 128.0, 192.0, 256.0, 512.0)


def dp_event(noise_multiplier: float, steps: int, sampling_rate: float) -> Any:
    """The DpEvent of a cardholder over the run: ``steps`` Poisson-sampled Gaussian steps."""
    import dp_accounting

    one = dp_accounting.GaussianDpEvent(noise_multiplier)
    if sampling_rate < 1.0:
        one = dp_accounting.PoissonSampledDpEvent(sampling_rate, one)
    return dp_accounting.SelfComposedDpEvent(one, steps)


def cardholder_epsilon(noise_multiplier: float, steps: int, delta: float, sampling_rate: float) -> float:
    """ε per cardholder at ``delta`` after ``steps`` Poisson-sampled Gaussian steps (∞ without noise)."""
    from dp_accounting.rdp import RdpAccountant

    if not (0.0 < delta < 1.0 and 0.0 < sampling_rate <= 1.0 and steps >= 0):
        raise ValueError(f"bad accounting input: delta={delta}, q={sampling_rate}, steps={steps}")
    if steps == 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    accountant = RdpAccountant(ORDERS)
    accountant.compose(dp_event(noise_multiplier, steps, sampling_rate))
    return float(accountant.get_epsilon(delta))


@functools.lru_cache(maxsize=64)
def _calibrated(target: float, steps: int, delta: float, q: float) -> float:
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    if not (target > 0 and math.isfinite(target)):
        raise ValueError(f"target epsilon must be positive and finite, got {target}")
    z = float(
        dp_accounting.calibrate_dp_mechanism(
            lambda: RdpAccountant(ORDERS),
            lambda s: dp_event(s, steps, q),
            target,
            delta,
            bracket_interval=dp_accounting.LowerEndpointAndGuess(0.05, 1.0),
            tol=1e-4,
        )
    )
    while cardholder_epsilon(z, steps, delta, q) > target:  # Brent stops within tol, on either side
        z += 1e-4
    return z


def plan_noise(cfg: CardholderDPConfig, steps: int) -> float:
    """The noise multiplier z for ``steps`` DP-SGD steps: calibrated to ``cfg.target_epsilon`` at ``cfg.delta``
    when it is > 0, else ``cfg.noise_multiplier``.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if cfg.target_epsilon > 0:
        return _calibrated(cfg.target_epsilon, steps, cfg.delta, cfg.sampling_rate)
    return cfg.noise_multiplier


@dataclass(frozen=True)
class CardholderDP:
    """What a bank's local training needs: the config and the noise multiplier its accountant planned."""

    cfg: CardholderDPConfig
    noise_multiplier: float

    def __post_init__(self) -> None:
        if self.noise_multiplier < 0 or not math.isfinite(self.noise_multiplier):
            raise ValueError(f"noise multiplier must be finite and >= 0, got {self.noise_multiplier}")
        if self.cfg.noise != "local":
            raise ValueError("noise=distributed is DP-FedSGD under SecAgg+ (training/anomaly/distributed_dp.py): one "
                             "private step per round, not local DP-SGD; run it with run_distributed or the SecAgg+ app")


@dataclass(frozen=True)
class CardholderPool:
    """The training transitions of every cardholder across ``sources``: (source index, rows) per cardholder."""

    owners: list[tuple[int, np.ndarray]]

    def __post_init__(self) -> None:
        if not self.owners:
            raise ValueError("no training cardholder")

    @classmethod
    def of(cls, pair_sets: Sequence[PairSet]) -> CardholderPool:
        """Group each source's pairs by their cardholder pseudonym (needs ``PairSet.cardholders``)."""
        owners: list[tuple[int, np.ndarray]] = []
        for s, pairs in enumerate(pair_sets):
            if pairs.cardholders is None:
                raise ValueError("cardholder-level DP needs the cardholder of every training pair")
            keys, inverse = np.unique(pairs.cardholders.astype(str), return_inverse=True)
            order = np.argsort(inverse, kind="stable")
            for rows in np.split(order, np.cumsum(np.bincount(inverse, minlength=len(keys)))[:-1]):
                owners.append((s, rows))
        return cls(owners)

    def __len__(self) -> int:
        return len(self.owners)

    def sample(self, q: float, per_step: int, rng: np.random.Generator) -> list[tuple[int, np.ndarray]]:
        """Poisson sampling: each cardholder in with probability ``q``, with ``per_step`` of its own rows."""
        chosen = np.flatnonzero(rng.random(len(self.owners)) < q)
        out = []
        for c in chosen:
            s, rows = self.owners[int(c)]
            out.append((s, rows if len(rows) <= per_step else rng.choice(rows, per_step, replace=False)))
        return out


class _PerCardholderLoss(nn.Module):
    """Mean next-event NLL of each cardholder's transitions in a batch: a loss vector, one entry per cardholder."""

    def __init__(self, model: AnomalyModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: Batch, targets: Mapping[str, Tensor], owner: Tensor, holders: int) -> Tensor:
        out = self.model.embed(batch)
        if out.aux_loss.requires_grad:
            raise ValueError("cardholder-level DP needs a pooling without a batch-level auxiliary loss")
        nll = torch.stack(list(self.model.head.nll(out.q, dict(targets)).values())).sum(0)  # type: ignore[operator]
        return scatter(nll, owner, 0, dim_size=holders, reduce="mean")


def per_cardholder_gradients(
    model: AnomalyModel, sets: Sequence[PairSet], contributions: Sequence[tuple[int, np.ndarray]]
) -> tuple[dict[str, Tensor], Tensor]:
    """(gradient of each trainable parameter, ``[cardholders, *shape]``; each cardholder's loss) via torch.func."""
    device = next(model.parameters()).device
    wrapper = _PerCardholderLoss(model)
    params = {k: p.detach() for k, p in wrapper.named_parameters() if p.requires_grad}
    graphs = [sets[s].previous[int(i)] for s, rows in contributions for i in rows]
    priors = np.concatenate([sets[s].priors[rows] for s, rows in contributions])
    events = np.concatenate([sets[s].events[rows] for s, rows in contributions])
    owner = torch.repeat_interleave(
        torch.arange(len(contributions)), torch.as_tensor([len(r) for _, r in contributions])
    ).to(device)
    targets = {h: torch.from_numpy(t).to(device) for h, t in event_targets(priors, events).items()}
    batch = Batch.from_data_list(graphs).to(device)
    n = len(contributions)

    def losses(p: dict[str, Tensor]) -> Tensor:
        return functional_call(wrapper, p, (batch, targets, owner, n), strict=False)  # type: ignore[no-any-return]

    loss, pullback = vjp(losses, params)
    (grads,) = vmap(pullback)(torch.eye(n, device=device, dtype=loss.dtype))
    return {k.removeprefix("model."): g for k, g in grads.items()}, loss.detach()


def clip_and_sum(grads: Mapping[str, Tensor], clipping_norm: float) -> tuple[dict[str, Tensor], Tensor]:
    """Σ_i clip(g_i, C) and each cardholder's L2 norm before clipping.

    ``grads`` holds ``[cardholders, *shape]`` per parameter; a cardholder's norm is over all parameters together,
    so its whole contribution to the step is bounded by ``C``.
    """
    flat = [g.reshape(g.shape[0], -1) for g in grads.values()]
    norms = torch.sqrt(torch.stack([(f * f).sum(1) for f in flat]).sum(0))
    scale = torch.clamp(clipping_norm / (norms + 1e-12), max=1.0)
    return {name: torch.einsum("i,i...->...", scale.to(g.dtype), g) for name, g in grads.items()}, norms


@dataclass(frozen=True)
class DPStepResult:
    """The noised mean gradient of one step and what it is made of (for logs and tests)."""

    gradient: dict[str, Tensor]
    cardholders: int
    clipped: int
    loss: float


def private_gradient(
    model: AnomalyModel,
    sets: Sequence[PairSet],
    pool: CardholderPool,
    dp: CardholderDP,
    rng: np.random.Generator,
) -> DPStepResult:
    """One DP-SGD step's gradient: sample, per-cardholder gradients in chunks, clip, one noise draw, / (q·N)."""
    cfg = dp.cfg
    contributions = pool.sample(cfg.sampling_rate, cfg.pairs_per_step, rng)
    params = {k: p for k, p in model.named_parameters() if p.requires_grad}
    total = {k: torch.zeros_like(p) for k, p in params.items()}
    clipped, loss_sum = 0, 0.0
    for a in range(0, len(contributions), cfg.cardholders_per_pass):
        grads, losses = per_cardholder_gradients(model, sets, contributions[a : a + cfg.cardholders_per_pass])
        summed, norms = clip_and_sum(grads, cfg.clipping_norm)
        for k in total:
            total[k] += summed[k]
        clipped += int((norms > cfg.clipping_norm).sum())
        loss_sum += float(losses.sum())
    generator = torch.Generator().manual_seed(int(rng.integers(2**62)))
    expected = cfg.sampling_rate * len(pool)
    gradient = {
        k: (t + dp.noise_multiplier * cfg.clipping_norm * torch.randn(t.shape, generator=generator).to(t)) / expected
        for k, t in total.items()
    }
    n = len(contributions)
    return DPStepResult(gradient, n, clipped, loss_sum / n if n else math.nan)


def cardholder_dp_card(cfg: CardholderDPConfig, noise_multiplier: float, steps: int, rounds: int) -> dict[str, Any]:
    """The model card's ``client_dp`` entry of a run under cardholder-level DP-SGD."""
    epsilon = cardholder_epsilon(noise_multiplier, steps, cfg.delta, cfg.sampling_rate)
    return {
        "dp": "on",
        "unit_of_privacy": "one cardholder: all of its transactions in its bank (add/remove); a person with "
        "cards at two banks is two cardholders",
        "epsilon": epsilon,
        "delta": cfg.delta,
        "noise_multiplier": noise_multiplier,
        "clipping_norm": cfg.clipping_norm,
        "sampling_rate": cfg.sampling_rate,
        "pairs_per_step": cfg.pairs_per_step,
        "steps": steps,
        "rounds": rounds,
        "accountant": ACCOUNTANT,
        "mechanism": "DP-SGD inside each bank (local noise): Poisson-sampled cardholders, each cardholder's "
        "gradient over its transitions in the step clipped to L2 <= clipping_norm, N(0, (z*C)^2) added by the "
        "bank to the sum; the merchant table is frozen; every update a bank sends is already noised",
        "protects": "each training cardholder, in every update a bank sends (against the server too) and in "
        "every released model (post-processing)",
        "not_covered": "validation and test cardholders' data, which enter only scalar metrics (validation "
        "loss selects the published round; test metrics), sent in clear; per-bank counts (cardholders, "
        "examples); the feature mechanism's per-report ε is separate (feature_ldp)",
    }

"""DSFL (Mao & Wang 2023, "Federated learning based on data divergence and differential privacy in financial risk
control"): contribution-weighted aggregation, and per-dimension Laplace noise allocated by contribution inside each
bank.

What is implemented, and what is reconstructed where the paper's text (OCR) is illegible or loose
(docs/fraud.md, "DSFL"):

* *In the bank* (:func:`privatize`, run by the ClientApp on the update ``new − received``): clip the update to
  L1 ≤ C₁; score every coordinate by its contribution ``u_j = |g_j|`` (Eq. 16); pick ``m`` coordinates with the
  exponential mechanism, ``m`` draws without replacement, each ``∝ exp(ε₁·u_j / (2·m·Δu))`` (Eq. 17, with the
  OCR's "2nΔu" read as the per-draw split of ε₁, Δu = C₁), drawn at once by the Gumbel-top-k trick; add
  Laplace noise of scale ``C₁/ε₂`` to those and ``C₁/ε₃`` to the others (Eq. 18, Δq = C₁). The paper states ε₂ and
  ε₃ per coordinate; with an L1 clip of the whole update the release is max(ε₂, ε₃)-DP as a whole (plus ε₁),
  which is what the accountant charges.
* *On the server* (:class:`DSFLAggregate`): each bank's "error" (Eqs. 11–13, AdaBoost's weight
  ``α = ½ ln((1 − err)/err)``) is reconstructed as its update's disagreement with the coordinate-wise median of
  all updates, ``err = (1 − cos(u, median))/2``; banks with ``α ≤ 0`` are dropped, the ``keep_banks`` best are
  kept, and the model moves by the α-weighted mean of their updates. This reads only the banks' noised updates:
  post-processing, no privacy cost.

**Accounting** (:func:`dsfl_epsilon`): one round of one bank's report, for two neighbouring inputs whose clipped
updates differ by ``v``: the Laplace part has Rényi divergence ``Σ_j f_α(|v_j|/b_j)`` (independent coordinates),
``f_α`` the 1-D Laplace RDP (Mironov 2017), convex with ``f_α(0) = 0`` hence superadditive, so it is at most
``f_α(‖v‖₁/b_min)``; the selection is m draws of an (ε₁/m)-DP exponential mechanism, ``ε₁²/(2m)``-zCDP
(Bun & Steinke 2016), also at most ε₁. Rounds compose; dp-accounting's ``compute_epsilon`` converts, the same
conversion and orders as the project's accountant; the card also states the pure-DP sum (δ = 0) and takes the
smaller. Two units: ``bank`` (the report against the zero-update report, ‖v‖₁ ≤ C₁: the analogue of
``federated.dp``'s add/remove-one-bank, for comparisons at equal ε) and ``cardholder`` (any change to one bank's
data, so to any one cardholder's: ‖v‖₁ ≤ 2C₁; Δu stays C₁ as |g_j| ∈ [0, C₁]). The noise is added in the bank,
so both hold against the server too.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import FedAvg

from fedfraud.training.federated.accountant import ACCOUNTANT, rdp_epsilon
from fedfraud.training.federated.config import DSFLConfig

__all__ = [
    "DSFLAggregate",
    "Unit",
    "calibrate",
    "contribution_errors",
    "contribution_weights",
    "dsfl_card",
    "dsfl_epsilon",
    "flat_update",
    "laplace_rdp",
    "noise_scales",
    "privatize",
    "select_top",
    "selected_count",
    "unflatten",
    "weigh_replies",
]

logger = logging.getLogger(__name__)

#: ``bank``: the report against the zero-update report (‖v‖₁ ≤ C₁); ``cardholder``: any change to one bank's data.
Unit = Literal["bank", "cardholder"]
#: Floor of a bank's error, so that α = ½ ln((1 − err)/err) stays finite (α ≤ 3.45).
ERROR_FLOOR = 1e-3


def selected_count(n: int, fraction: float) -> int:
    """m: how many of ``n`` coordinates get the ε₂ noise (at least one)."""
    return max(1, min(n, round(fraction * n)))


def noise_scales(cfg: DSFLConfig) -> tuple[float, float]:
    """Laplace scales (selected, other coordinates): C₁/ε₂ and C₁/ε₃ (Eq. 18)."""
    return cfg.l1_clip / cfg.epsilon_top, cfg.l1_clip / cfg.epsilon_rest


def _clip_l1(update: np.ndarray, bound: float) -> np.ndarray:
    norm = float(np.abs(update).sum())
    return update * (bound / norm) if norm > bound else update


def select_top(update: np.ndarray, cfg: DSFLConfig, rng: np.random.Generator) -> np.ndarray:
    """Boolean mask of the m coordinates picked by the exponential mechanism on ``|update|`` (clipped update).

    Gumbel-top-k: the m largest of ``ε₁·|g_j|/(2·m·C₁) + Gumbel`` are distributed exactly as m sequential draws
    without replacement, each the exponential mechanism with budget ε₁/m (score sensitivity C₁).
    """
    n = update.size
    m = selected_count(n, cfg.top_fraction)
    mask = np.zeros(n, dtype=bool)
    if m == n:
        mask[:] = True
        return mask
    keys = cfg.epsilon_select * np.abs(update) / (2.0 * m * cfg.l1_clip) + rng.gumbel(size=n)
    mask[np.argpartition(-keys, m - 1)[:m]] = True
    return mask


def privatize(update: np.ndarray, cfg: DSFLConfig, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(noised update, selection mask) of one bank's flat float64 update: L1 clip, selection, Laplace per dimension."""
    clipped = _clip_l1(np.asarray(update, dtype=np.float64), cfg.l1_clip)
    mask = select_top(clipped, cfg, rng)
    b_top, b_rest = noise_scales(cfg)
    scale = np.where(mask, b_top, b_rest)
    return clipped + rng.laplace(0.0, 1.0, size=clipped.size) * scale, mask


def contribution_errors(updates: np.ndarray) -> np.ndarray:
    """Each bank's error in [0, 1]: (1 − cos(its update, coordinate-wise median of all updates)) / 2.

    Reconstruction of Eq. 11's error for models without a shared error measure: the median is the consensus one
    outlier cannot drag, so an update pointing away from the other banks scores near 1.
    """
    updates = np.asarray(updates, dtype=np.float64)
    median = np.median(updates, axis=0)
    norms = np.linalg.norm(updates, axis=1) * np.linalg.norm(median)
    cos = np.divide(updates @ median, norms, out=np.zeros(len(updates)), where=norms > 0)
    return (1.0 - np.clip(cos, -1.0, 1.0)) / 2.0


def contribution_weights(errors: np.ndarray, keep: int = 0) -> np.ndarray:
    """Normalised weights α_t = ½ ln((1 − err)/err) (Eq. 13); banks with α ≤ 0, or beyond the ``keep`` best, get 0.

    All zero when no bank does better than chance (err ≥ ½): the round is not released.
    """
    err = np.clip(np.asarray(errors, dtype=np.float64), ERROR_FLOOR, 1.0 - ERROR_FLOOR)
    alpha = 0.5 * np.log((1.0 - err) / err)
    alpha[alpha <= 0] = 0.0
    if keep and np.count_nonzero(alpha) > keep:
        alpha[np.argsort(-alpha, kind="stable")[keep:]] = 0.0
    total = alpha.sum()
    return alpha / total if total > 0 else alpha


def laplace_rdp(ratio: float, order: float) -> float:
    """RDP at ``order`` of the 1-D Laplace mechanism whose shift is ``ratio`` scales (Mironov 2017, Table II)."""
    a = order
    if ratio == 0:
        return 0.0
    terms = np.array([math.log(a / (2 * a - 1)) + (a - 1) * ratio, math.log((a - 1) / (2 * a - 1)) - a * ratio])
    return float(np.logaddexp(*terms) / (a - 1))


def _per_round(cfg: DSFLConfig, coordinates: int, unit: Unit) -> tuple[float, float, float]:
    """(Laplace shift in scales, ε₁ of the selection or 0, draws m) of one round of one bank."""
    m = selected_count(coordinates, cfg.top_fraction)
    spread = 2.0 if unit == "cardholder" else 1.0  # replace: ‖g − g'‖₁ ≤ 2C₁; vs the zero update ≤ C₁
    if m == coordinates:
        return spread * cfg.epsilon_top, 0.0, float(m)
    return spread * max(cfg.epsilon_top, cfg.epsilon_rest), cfg.epsilon_select, float(m)


def dsfl_epsilon(cfg: DSFLConfig, rounds: int, coordinates: int, delta: float, unit: Unit = "bank") -> float:
    """ε at ``delta`` of ``rounds`` DSFL reports of one bank: RDP composition, or the pure-DP sum if smaller."""
    if rounds < 0 or coordinates < 1:
        raise ValueError(f"rounds must be >= 0 and coordinates >= 1, got {rounds}, {coordinates}")
    if rounds == 0:
        return 0.0
    if not cfg.noise:
        return math.inf
    shift, eps1, m = _per_round(cfg, coordinates, unit)

    def rdp(order: float) -> float:
        select = min(eps1, order * eps1**2 / (2.0 * m))
        return rounds * (laplace_rdp(shift, order) + select)

    return min(rdp_epsilon(rdp, delta), rounds * (shift + eps1))


def calibrate(cfg: DSFLConfig, rounds: int, coordinates: int) -> DSFLConfig:
    """``cfg`` with ε₁, ε₂, ε₃ scaled by one factor so that ``rounds`` reports spend ``target_epsilon`` in
    ``cfg.target_unit`` (per bank or per cardholder) at ``cfg.delta``; ``cfg`` itself when no target is set.
    """
    if cfg.target_epsilon <= 0 or not cfg.noise:
        return cfg

    def scaled(f: float) -> DSFLConfig:
        return cfg.model_copy(update={"epsilon_select": cfg.epsilon_select * f, "epsilon_top": cfg.epsilon_top * f,
                                      "epsilon_rest": cfg.epsilon_rest * f})

    def spent(f: float) -> float:
        return dsfl_epsilon(scaled(f), rounds, coordinates, cfg.delta, cfg.target_unit)

    lo, hi = 0.0, 1.0
    while spent(hi) < cfg.target_epsilon:
        lo, hi = hi, hi * 2.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if spent(mid) <= cfg.target_epsilon else (lo, mid)
    if lo == 0.0:
        raise ValueError(f"dsfl target epsilon {cfg.target_epsilon} cannot be met over {rounds} rounds")
    return scaled(lo)


def dsfl_card(cfg: DSFLConfig, rounds: int, coordinates: int, banks: int) -> dict[str, Any]:
    """The model card's ``client_dp`` entry of a DSFL run of ``rounds`` rounds (every round a bank sent a noised
    report in, released or not): what ε holds for whom, and what it leaves out.
    """
    if not cfg.noise:
        return {"dp": "off", "epsilon": "none (dsfl.noise is off: contribution weighting only)",
                "why": "DSFL run without its Laplace noise"}
    b_top, b_rest = noise_scales(cfg)
    return {
        "dp": "on",
        "noise": "dsfl",
        "mechanism": "DSFL (Mao & Wang 2023) inside each bank: L1 clip of the round's update, exponential-mechanism "
        "selection of the top coordinates by |update|, Laplace noise per coordinate (selected: l1_clip/epsilon_top, "
        "others: l1_clip/epsilon_rest); the server's contribution weighting reads only the noised updates",
        "unit_of_privacy": "one cardholder (any change to one bank's data, so to all of one cardholder's records)",
        "epsilon": dsfl_epsilon(cfg, rounds, coordinates, cfg.delta, "cardholder"),
        "delta": cfg.delta,
        "epsilon_bank": dsfl_epsilon(cfg, rounds, coordinates, cfg.delta, "bank"),
        "epsilon_bank_meaning": "one bank's report against the report of a zero update (federated.dp's "
        "add/remove-one-bank analogue), for comparisons at equal epsilon",
        "epsilon_pure_cardholder": rounds * sum(_per_round(cfg, coordinates, "cardholder")[:2]),
        "protects": "every report a bank sends (and so every released model) against the server, the other banks "
        "and the registry: the noise is added before the update leaves the bank",
        "epsilon_select": cfg.epsilon_select,
        "epsilon_top": cfg.epsilon_top,
        "epsilon_rest": cfg.epsilon_rest,
        "top_fraction": cfg.top_fraction,
        "selected_coordinates": selected_count(coordinates, cfg.top_fraction),
        "coordinates": coordinates,
        "l1_clip": cfg.l1_clip,
        "laplace_scale": {"selected": b_top, "other": b_rest},
        "rounds": rounds,
        "banks": banks,
        "sampling": "no amplification claimed: every round is charged in full",
        "accountant": f"{ACCOUNTANT}; here Laplace RDP (Mironov 2017) + exponential-mechanism zCDP per round, "
        "dp_accounting compute_epsilon, or the pure-DP sum if smaller",
        "not_covered": "scalar metrics (losses, counts, test metrics) leave the banks without noise; non-float "
        "tensors are sent as trained; a round sent again after a crash and resume is charged once; the noise comes "
        "from numpy's PCG64, not a cryptographic source",
    }


def flat_update(arrays: Mapping[str, np.ndarray], received: Mapping[str, np.ndarray]) -> np.ndarray:
    """The float tensors' update (new − received), flattened in key order, float64."""
    parts = [np.asarray(arrays[k], dtype=np.float64).ravel() - np.asarray(received[k], dtype=np.float64).ravel()
             for k in received if np.issubdtype(np.asarray(received[k]).dtype, np.floating)]
    return np.concatenate(parts) if parts else np.zeros(0)


def unflatten(flat: np.ndarray, received: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``received + flat`` tensor by tensor (float tensors in key order; the others as received)."""
    out, at = {}, 0
    for key, base in received.items():
        base = np.asarray(base)
        if np.issubdtype(base.dtype, np.floating):
            out[key] = (base + flat[at: at + base.size].reshape(base.shape)).astype(base.dtype)
            at += base.size
        else:
            out[key] = base
    return out


class DSFLAggregate(FedAvg):
    """The server's DSFL step, as :class:`~.strategy.AnomalyFedProx`'s ``robust`` rule: contribution weights on
    the banks' (noised) updates against the global model of the round (``received``, set by configure_train).
    """

    def __init__(self, cfg: DSFLConfig, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cfg = cfg
        self.received: ArrayRecord | None = None

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid = [r for r in replies if not r.has_error()]
        if not valid or self.received is None:
            logger.warning("round=%d dsfl: no usable replies or no global model; round not released", server_round)
            return None, None
        base = {k: v.numpy() for k, v in self.received.items()}
        merged, weights = weigh_replies(base, valid, self.cfg.keep_banks, server_round)
        if merged is None:
            return None, None
        banks = [int(r.content["metrics"].get("partition-id", i)) for i, r in enumerate(valid)]  # type: ignore[arg-type]
        metrics = MetricRecord({"dsfl-kept": int(np.count_nonzero(weights)),
                                **{f"dsfl-weight-{b}": float(w) for b, w in zip(banks, weights, strict=True)}})
        return merged, metrics


def weigh_replies(base: Mapping[str, np.ndarray], replies: Sequence[Message], keep: int = 0, server_round: int = 0
                  ) -> tuple[ArrayRecord | None, np.ndarray]:
    """DSFL's server step on the banks' train replies (their ``arrays`` against ``base``, the round's global
    model): (the model moved by the contribution-weighted mean of their updates, or None when no bank
    contributes; the weights, in reply order). Shared by :class:`DSFLAggregate` and the neural fraud strategies.
    """
    updates = np.stack([flat_update({k: v.numpy() for k, v in r.content["arrays"].items()}, base) for r in replies])
    weights = contribution_weights(contribution_errors(updates), keep)
    banks = [int(r.content["metrics"].get("partition-id", i)) for i, r in enumerate(replies)]  # type: ignore[arg-type]
    logger.info("round=%d dsfl weights %s", server_round,
                " ".join(f"bank{b}={w:.3f}" for b, w in zip(banks, weights, strict=True)))
    if not weights.any():
        logger.warning("round=%d dsfl: no bank contributes (every error >= 1/2); round not released", server_round)
        return None, weights
    merged = unflatten(weights @ updates, base)
    return ArrayRecord({k: Array(v) for k, v in merged.items()}), weights

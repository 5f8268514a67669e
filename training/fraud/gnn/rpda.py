"""FedRPDA's two strategies as plain functions (``papers/fedrpda-risk-aware-graph-fl.txt``, §3).

Our copy of the paper is an OCR of the Chinese original: the abstract, the two algorithms and equations (6)–(18)
are legible; equations (1)–(5), the risk intensity and its temporal-decay mapping, are not. What is reconstructed
(and marked so) follows the abstract's words and Algorithm 2's use of the result in eq. (6).

**Typical-risk dynamic aggregation** (Algorithm 1 line 9, Algorithm 2 lines 1–3, eq. 6).

* *Structural risk intensity* of a bank's graph (reconstructed eqs. 1–4): for each labelled training fraud node
  v, ``r(v)`` is the share of frauds among its labelled training neighbours (both edge directions, both
  relations); ``H_k`` is the mean of ``r(v)`` over the bank's training frauds (0 without any). A bank whose
  frauds sit among frauds holds *typical*, structurally concentrated fraud.
* *Dynamic weight mapping with temporal decay* (reconstructed eq. 5): in round t the bank's weight is
  ``γ_k(t) = n_k · (1 + α · exp(−(t − 1)/τ) · H_k)``, ``n_k`` its training nodes: early rounds lean towards the
  banks with typical risk, later rounds decay to FedAvg's weights.
* eq. (6): ``w = Σ_k γ_k w_k / Σ_k γ_k``. Switched off, ``γ_k = n_k``: FedAvg exactly.

**Diversified-risk average aggregation** (Algorithm 1 lines 3–8, 14; Algorithm 2 line 4; eqs. 7, 9–18).

* eqs. (9)–(12): the batch mean and variance of the fraud embeddings, folded into running statistics with
  momentum m (``μ = (1 − m)·μ + m·μ_b``); the batch part keeps its gradient.
* eq. (13): augmented fraud embeddings ``h̃ = μ + σ ⊙ ε``, ε ~ N(0, I) (variance perturbation).
* eq. (14): the batch's embeddings plus the augmented frauds.
* eqs. (15)–(17): ``D_v^c = ‖h(v) − p^c‖``, ``s_v = softmax_c(−D_v)[fraud]``, ``L_P = BCE(s_v, y_v)`` against the
  global prototypes ``p^c``; none in round 1 (``L_P = 0``).
* eq. (18): ``L = L_CE + λ·L_P``.
* eq. (7): after local training, the bank's class prototypes are the mean embedding of its training nodes of each
  class; the server averages them over banks, weighted by each bank's class count (Algorithm 2 line 4).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "FraudStats",
    "Prototypes",
    "aggregation_weights",
    "augment_frauds",
    "average_prototypes",
    "local_prototypes",
    "prototype_loss",
    "risk_intensity",
]


def risk_intensity(edge_index: np.ndarray, label: np.ndarray, labelled: np.ndarray) -> float:
    """``H_k``: mean over labelled fraud nodes of the fraud share of their labelled neighbours (0 without frauds).

    Args:
        edge_index: ``[2, E]`` (source, target); read in both directions.
        label: ``[n]`` 1 fraud / 0 legit (NaN allowed where not ``labelled``).
        labelled: ``[n]`` bool, the nodes whose label the bank may use (its training nodes).
    """
    labelled = np.asarray(labelled, dtype=bool)
    fraud = labelled & (np.nan_to_num(np.asarray(label, dtype=np.float64)) == 1)
    if not fraud.any():
        return 0.0
    e = np.asarray(edge_index, dtype=np.int64)
    a = np.concatenate([e[0], e[1]])
    b = np.concatenate([e[1], e[0]])  # a's neighbour b
    keep = labelled[b]
    n = len(labelled)
    neighbours = np.bincount(a[keep], minlength=n).astype(np.float64)
    fraud_neighbours = np.bincount(a[keep & fraud[b]], minlength=n).astype(np.float64)
    r = np.divide(fraud_neighbours, neighbours, out=np.zeros(n), where=neighbours > 0)
    return float(r[fraud].mean())


def aggregation_weights(examples: Sequence[float], risks: Sequence[float], server_round: int, alpha: float,
                        tau: float, risk_aware: bool) -> np.ndarray:
    """``γ_k(t)`` per bank (unnormalized); ``examples`` when ``risk_aware`` is off (FedAvg)."""
    n = np.asarray(examples, dtype=np.float64)
    if not risk_aware:
        return n
    h = np.asarray(risks, dtype=np.float64)
    if h.shape != n.shape:
        raise ValueError("one risk intensity per bank")
    return n * (1.0 + alpha * math.exp(-(server_round - 1) / tau) * h)


@dataclass
class FraudStats:
    """Running mean and variance of a bank's fraud embeddings (eqs. 11–12), kept by the bank across rounds."""

    mean: torch.Tensor | None = None
    var: torch.Tensor | None = None

    def update(self, h_fraud: torch.Tensor, momentum: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Fold one batch in; returns (μ, σ²) with the batch part differentiable, and stores them detached."""
        mu_b = h_fraud.mean(0)
        var_b = h_fraud.var(0, unbiased=False) if len(h_fraud) > 1 else torch.zeros_like(mu_b)
        if self.mean is None or self.var is None:
            mu, var = mu_b, var_b
        else:
            mu = (1 - momentum) * self.mean + momentum * mu_b
            var = (1 - momentum) * self.var + momentum * var_b
        self.mean, self.var = mu.detach(), var.detach()
        return mu, var


def augment_frauds(mean: torch.Tensor, var: torch.Tensor, count: int, generator: torch.Generator | None = None
                   ) -> torch.Tensor:
    """``count`` augmented fraud embeddings ``μ + σ ⊙ ε`` (eq. 13)."""
    eps = torch.randn((count, mean.shape[0]), generator=generator, dtype=mean.dtype)
    return mean + torch.sqrt(var + 1e-12) * eps


@dataclass(frozen=True)
class Prototypes:
    """Class prototypes ``[2, d]`` (row 0 legit, row 1 fraud) and the node counts behind each row."""

    vectors: np.ndarray
    counts: np.ndarray

    def __post_init__(self) -> None:
        if self.vectors.ndim != 2 or self.vectors.shape[0] != 2 or self.counts.shape != (2,):
            raise ValueError("prototypes are [2, d] with 2 counts")


def local_prototypes(h: torch.Tensor, y: torch.Tensor) -> Prototypes:
    """Eq. (7) on one bank: the mean embedding of its legit and of its fraud training nodes."""
    out = np.zeros((2, h.shape[1]))
    counts = np.zeros(2)
    for c in (0, 1):
        rows = h[y == c]
        counts[c] = len(rows)
        if len(rows):
            out[c] = rows.mean(0).detach().cpu().numpy()
    return Prototypes(out, counts)


def average_prototypes(parts: Sequence[Prototypes]) -> Prototypes | None:
    """The global prototypes: each class row averaged over banks, weighted by the banks' counts of that class."""
    if not parts:
        return None
    counts = np.sum([p.counts for p in parts], axis=0)
    if np.any(counts == 0):
        return None
    vec = np.sum([p.vectors * p.counts[:, None] for p in parts], axis=0) / counts[:, None]
    return Prototypes(vec, counts)


def prototype_loss(h: torch.Tensor, y: torch.Tensor, prototypes: torch.Tensor) -> torch.Tensor:
    """``L_P`` (eqs. 15–17): BCE of ``softmax(−‖h − p^c‖)[fraud]`` against the label, mean over the rows."""
    dist = torch.cdist(h, prototypes.to(h.dtype))
    s = torch.softmax(-dist, dim=1)[:, 1].clamp(1e-6, 1 - 1e-6)
    return torch.nn.functional.binary_cross_entropy(s, y.to(h.dtype))

"""The FED-SPFD network and its losses (``papers/fed-spfd-credit-card-fraud.txt``, §3.1–3.3).

* :class:`ColumnBlock`: a column set's input transform, the GNN variants' own (:mod:`..gnn.model`): categories
  → hashed one-hot, the hour → sin/cos, every other column signed-log, standardized (NaN → 0 plus a missing
  indicator). The shared block's scaler is summed over the banks' training rows; a private block's is the bank's.
* :class:`SpfdNet`: shared encoder f_enc,s (an MFFN, the paper's choice) with the warm start's decoder, a private
  autoencoder f_enc,p / f_dec,p, and the classifier f_cls over ``[z_s, z_p]`` (z_p = 0 for a bank with no private
  column, the mean of the N(0, I) the private embeddings are pulled to). One logit: the fraud log-odds.
* the losses: :func:`alignment_loss` (L_alg), :func:`gaussian_kl` (L_p-n, eq. 19), :func:`reconstruction_loss`
  (L_rec), and :class:`EmbeddingSums`, the sufficient statistics a bank sends for the global mean and covariance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedfraud.training.fraud.gnn.model import HOUR_FEATURE, InputLayout, ScalerSums, transformed_rows
from fedfraud.training.fraud.spfd.config import SpfdConfig

__all__ = [
    "FEDERATED_PREFIXES",
    "ColumnBlock",
    "EmbeddingSums",
    "SpfdNet",
    "SpfdOutput",
    "alignment_loss",
    "gaussian_kl",
    "reconstruction_loss",
]

#: State-dict prefixes the server averages (the shared encoder, its warm-start decoder, the shared scaler and the
#: classifier); everything else (the private autoencoder and its scaler) stays at the bank.
FEDERATED_PREFIXES: tuple[str, ...] = ("shared.", "encoder.", "decoder.", "classifier.")


class ColumnBlock(nn.Module):
    """The input transform of one column set; ``inputs(X)`` of rows holding exactly ``names``."""

    def __init__(self, names: Sequence[str], buckets: int) -> None:
        super().__init__()
        self.names = tuple(names)
        self.layout = InputLayout.of(self.names, self.names)
        self.buckets = buckets
        n_num = len(self.layout.numeric)
        self.register_buffer("mean", torch.zeros(n_num))
        self.register_buffer("std", torch.ones(n_num))
        self.width = (n_num + (2 if self.layout.hour is not None else 0) + len(self.layout.categories) * buckets
                      + n_num) if self.names else 0

    def set_scaler(self, sums: ScalerSums) -> None:
        mean, std = sums.mean_std()
        self.mean.copy_(torch.as_tensor(mean, dtype=torch.float32))
        self.std.copy_(torch.as_tensor(std, dtype=torch.float32))

    def scaler_sums(self, X: np.ndarray) -> ScalerSums:
        """Sums of the transformed numeric columns of rows ``X`` (what a scaler is made of)."""
        return ScalerSums.of(self.layout.numeric_values(X))

    def inputs(self, X: np.ndarray) -> np.ndarray:
        """``[n, width]`` float64: the transformed columns, then the missing indicators of the numeric ones."""
        X = np.asarray(X, dtype=np.float64)
        if not self.names:
            return np.zeros((len(X), 0))
        base, missing = transformed_rows(self, X)  # type: ignore[arg-type]  # duck-typed: layout, mean, std, buckets
        return np.concatenate([base, missing], axis=1)

    def owners(self) -> list[str]:
        """The feature each input column belongs to (a reason sums its columns)."""
        lay = self.layout
        if not self.names:
            return []
        out = [self.names[c] for c in lay.numeric]
        out += [HOUR_FEATURE] * 2 if lay.hour is not None else []
        out += [self.names[c] for c in lay.categories for _ in range(self.buckets)]
        return out + [self.names[c] for c in lay.numeric]


def _mlp(n_in: int, hidden: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, n_out))


@dataclass(frozen=True)
class SpfdOutput:
    """One forward pass: fraud log-odds ``[n]``, z_s ``[n, h_s]``, z_p ``[n, h_p]``, the private reconstruction."""

    logit: torch.Tensor
    z_s: torch.Tensor
    z_p: torch.Tensor
    x_p_hat: torch.Tensor | None


class SpfdNet(nn.Module):
    """Shared encoder (+ warm-start decoder), private autoencoder, classifier over ``[z_s, z_p]``.

    Args:
        shared: the shared columns, in row order.
        private: this bank's private columns (may be empty: no private autoencoder).
        cfg: widths.
    """

    def __init__(self, shared: Sequence[str], private: Sequence[str], cfg: SpfdConfig) -> None:
        super().__init__()
        self.shared = ColumnBlock(shared, cfg.category_buckets)
        self.private = ColumnBlock(private, cfg.category_buckets)
        self.private_dim = cfg.private_dim
        self.encoder = _mlp(self.shared.width, cfg.hidden, cfg.embed_dim)
        self.decoder = _mlp(cfg.embed_dim, cfg.hidden, self.shared.width)
        self.private_encoder = _mlp(self.private.width, cfg.hidden, cfg.private_dim) if self.private.width else None
        self.private_decoder = _mlp(cfg.private_dim, cfg.hidden, self.private.width) if self.private.width else None
        self.classifier = _mlp(cfg.embed_dim + cfg.private_dim, cfg.hidden, 1)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(shared={len(self.shared.names)} columns, private="
                f"{len(self.private.names)} columns, h_s={self.encoder[-1].out_features}, h_p={self.private_dim})")

    def inputs(self, X_shared: np.ndarray, X_private: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 model inputs of raw shared and private columns."""
        return (torch.as_tensor(self.shared.inputs(X_shared), dtype=torch.float32),
                torch.as_tensor(self.private.inputs(X_private), dtype=torch.float32))

    def forward(self, x_s: torch.Tensor, x_p: torch.Tensor, use_private: bool = True) -> SpfdOutput:
        z_s = self.encoder(x_s)
        if self.private_encoder is not None and self.private_decoder is not None and use_private:
            z_p = self.private_encoder(x_p)
            x_p_hat = self.private_decoder(z_p)
        else:
            z_p, x_p_hat = torch.zeros(len(x_s), self.private_dim), None
        logit = self.classifier(torch.cat([z_s, z_p], dim=1)).squeeze(1)
        return SpfdOutput(logit, z_s, z_p, x_p_hat)


def _cov(z: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample mean and covariance (n − 1) of rows ``z``, plus ``eps·I``."""
    mu = z.mean(0)
    c = z - mu
    return mu, c.T @ c / max(len(z) - 1, 1) + eps * torch.eye(z.shape[1], dtype=z.dtype)


def alignment_loss(z: torch.Tensor, mean_g: torch.Tensor, cov_g: torch.Tensor, eps: float) -> torch.Tensor:
    """L_alg: KL(N(μ_g, Σ_g) ‖ N(μ_i, Σ_i)) of the batch's shared embeddings against the global statistics,

    ½ (log det Σ_i − log det Σ_g + tr(Σ_i⁻¹ Σ_g) + (μ_i − μ_g)ᵀ Σ_i⁻¹ (μ_i − μ_g) − h_s); 0 iff they are equal.
    """
    mu, cov = _cov(z, eps)
    cov_g = cov_g.to(z.dtype) + eps * torch.eye(z.shape[1], dtype=z.dtype)
    d = (mu - mean_g.to(z.dtype)).unsqueeze(1)
    solve_g = torch.linalg.solve(cov, cov_g)
    maha = (d.T @ torch.linalg.solve(cov, d)).squeeze()
    return 0.5 * (torch.logdet(cov) - torch.logdet(cov_g) + torch.trace(solve_g) + maha - z.shape[1])


def gaussian_kl(z: torch.Tensor, eps: float) -> torch.Tensor:
    """L_p-n (eq. 19): KL(N(μ_p, S) ‖ N(0, I)) = ½ (tr S + μ_pᵀ μ_p − h_p − ln det S), S the sample covariance."""
    mu, cov = _cov(z, eps)
    return 0.5 * (torch.trace(cov) + mu @ mu - z.shape[1] - torch.logdet(cov))


def reconstruction_loss(x_hat: torch.Tensor, x: torch.Tensor, z: torch.Tensor, sparsity: float) -> torch.Tensor:
    """L_rec: the private reconstruction's squared error per row plus ``sparsity`` × ‖z_p‖² per row (means)."""
    return ((x_hat - x) ** 2).sum(1).mean() + sparsity * (z**2).sum(1).mean()


@dataclass(frozen=True)
class EmbeddingSums:
    """A bank's sufficient statistics of its shared embeddings: row count, Σ z and Σ z zᵀ (what it sends)."""

    count: float
    total: np.ndarray
    outer: np.ndarray

    @classmethod
    def of(cls, z: np.ndarray) -> EmbeddingSums:
        z = np.asarray(z, dtype=np.float64)
        return cls(float(len(z)), z.sum(0), z.T @ z)

    def __add__(self, other: EmbeddingSums) -> EmbeddingSums:
        return EmbeddingSums(self.count + other.count, self.total + other.total, self.outer + other.outer)

    def mean_cov(self) -> tuple[np.ndarray, np.ndarray]:
        """The pooled mean and covariance of every bank's embeddings (the server's global statistics)."""
        n = max(self.count, 1.0)
        mean = self.total / n
        return mean, self.outer / n - np.outer(mean, mean)

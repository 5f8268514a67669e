"""What a bank does in FED-SPFD: load its table, send its scaler sums, warm-start, train, send embedding sums.

A simulated bank (SuperNode ``partition-id`` k) reads ``bank_<b>.table.npz`` (:meth:`FraudFeatures.save`) and
``bank_<b>.private.json`` (its private columns) from the folder the message names; a deployed SuperNode reads
``<data-dir>/fraud-spfd-table.npz`` and ``fraud-spfd-private.json``. What leaves a bank: per-column sums of its
transformed shared training columns (once); the shared encoder, its warm-start decoder and the classifier every
round (not the classifier under FedPer); under alignment, the count, sum and sum of outer products of its
training rows' shared embeddings every round; validation score histograms. Its private columns, private
autoencoder and private scaler never leave it: at the end the bank writes its whole model to its own folder
(:func:`bank_model_file`), from which it publishes its serving artifact.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedfraud.training.fraud.features import FraudFeatures
from fedfraud.training.fraud.metrics import score_histograms
from fedfraud.training.fraud.spfd.config import SpfdConfig
from fedfraud.training.fraud.spfd.model import (
    FEDERATED_PREFIXES,
    EmbeddingSums,
    SpfdNet,
    alignment_loss,
    gaussian_kl,
    reconstruction_loss,
)

__all__ = [
    "SCALER_ARRAYS",
    "BankData",
    "SpfdJob",
    "bank_model_file",
    "build_net",
    "federated_arrays",
    "load_bank",
    "local_arrays",
    "local_train",
    "save_bank",
    "set_arrays",
    "warm_train",
]

logger = logging.getLogger(__name__)

INDEX_FILE = "index.json"
NODE_TABLE_FILE = "fraud-spfd-table.npz"
NODE_PRIVATE_FILE = "fraud-spfd-private.json"


@dataclass(frozen=True)
class SpfdJob:
    """One federated training: FED-SPFD or a baseline on the same network.

    ``align``: the shared-embedding alignment loss; ``private``: the private autoencoder (and its columns);
    ``local_head``: the classifier stays at each bank (FedPer). FED-SPFD is (True, True, False), FedAvg
    (False, False, False), FedPer (False, False, True).
    """

    name: str
    align: bool
    private: bool
    local_head: bool = False
    seed: int = 0
    overrides: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"bad job name {self.name!r}")
        unknown = [k for k, _ in self.overrides if k not in SpfdConfig.model_fields]
        if unknown:
            raise ValueError(f"unknown spfd settings {unknown}")

    def config(self, base: SpfdConfig) -> SpfdConfig:
        return base.model_copy(update=dict(self.overrides))

    def federated(self, key: str) -> bool:
        """Whether the state-dict entry ``key`` is averaged by the server in this job."""
        if self.local_head and key.startswith("classifier."):
            return False
        return key.startswith(FEDERATED_PREFIXES)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> SpfdJob:
        raw = json.loads(text)
        return cls(raw["name"], bool(raw["align"]), bool(raw["private"]), bool(raw["local_head"]), int(raw["seed"]),
                   tuple((str(k), float(v)) for k, v in raw["overrides"]))


@dataclass(frozen=True)
class BankData:
    """A bank's table split into its shared and private columns."""

    table: FraudFeatures
    private: tuple[str, ...]

    def columns(self, names: tuple[str, ...]) -> np.ndarray:
        idx = [self.table.names.index(n) for n in names]
        return self.table.X[:, idx].astype(np.float64)

    def mask(self, split: str) -> np.ndarray:
        return np.asarray(self.table.split == split)


def save_bank(folder: Path, bank: int, table: FraudFeatures, private: tuple[str, ...]) -> None:
    """Write a simulated bank's data (its table and its private column names) into ``folder``."""
    table.save(str(Path(folder) / f"bank_{bank}.table.npz"))
    (Path(folder) / f"bank_{bank}.private.json").write_text(json.dumps(list(private)), encoding="utf-8")


def bank_model_file(folder: Path | str, bank: int | None, job: str) -> Path:
    """Where a bank writes its trained model of ``job`` (its own folder; ``bank`` None: a deployed SuperNode)."""
    stem = "fraud-spfd" if bank is None else f"bank_{bank}"
    return Path(folder) / f"{stem}.{job.replace('#', '-')}.model.npz"


@lru_cache(maxsize=8)
def load_bank(folder: str, partition_id: int, deployed: bool = False) -> tuple[int | None, BankData]:
    """``(bank, data)`` of this SuperNode: the simulation's partition, or a deployed node's own folder."""
    if deployed:
        table = FraudFeatures.load(str(Path(folder) / NODE_TABLE_FILE))
        private = json.loads((Path(folder) / NODE_PRIVATE_FILE).read_text(encoding="utf-8"))
        return None, BankData(table, tuple(private))
    bank = json.loads((Path(folder) / INDEX_FILE).read_text(encoding="utf-8"))["banks"][partition_id]
    table = FraudFeatures.load(str(Path(folder) / f"bank_{bank}.table.npz"))
    private = json.loads((Path(folder) / f"bank_{bank}.private.json").read_text(encoding="utf-8"))
    return int(bank), BankData(table, tuple(private))


def build_net(shared: tuple[str, ...], private: tuple[str, ...], cfg: SpfdConfig, seed: int) -> SpfdNet:
    """A freshly initialized network (the same shared weights for the same seed in every bank)."""
    torch.manual_seed(seed)
    return SpfdNet(shared, private, cfg)


#: The shared scaler's buffers: set by the server from the banks' sums, never trained by a bank (DSFL returns them
#: as received).
SCALER_ARRAYS = ("shared.mean", "shared.std")


def federated_arrays(net: SpfdNet, job: SpfdJob) -> dict[str, np.ndarray]:
    """The state-dict entries the server averages (what crosses the wire)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in net.state_dict().items() if job.federated(k)}


def local_arrays(net: SpfdNet, job: SpfdJob) -> dict[str, np.ndarray]:
    """The entries that stay at the bank (private autoencoder and scaler; the head under FedPer)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in net.state_dict().items() if not job.federated(k)}


def set_arrays(net: SpfdNet, arrays: dict[str, np.ndarray]) -> None:
    """Overwrite the named entries (the others keep their values)."""
    net.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in arrays.items()}, strict=False)


def bank_inputs(net: SpfdNet, data: BankData, rows: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The model inputs of the bank's rows (all, or the ``rows`` mask)."""
    xs, xp = data.columns(net.shared.names), data.columns(net.private.names)
    if rows is not None:
        xs, xp = xs[rows], xp[rows]
    return net.inputs(xs, xp)


def warm_train(net: SpfdNet, data: BankData, cfg: SpfdConfig, seed: int) -> float:
    """Algorithm 1, line 1: the shared encoder and its decoder on reconstructing the shared inputs (training rows).

    Returns the mean reconstruction loss.
    """
    x_s, _ = bank_inputs(net, data, data.mask("train"))
    params = [*net.encoder.parameters(), *net.decoder.parameters()]
    optimizer = torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(seed)
    total, steps = 0.0, 0
    net.train()
    for _ in range(cfg.local_epochs):
        for idx in torch.randperm(len(x_s), generator=gen).split(cfg.batch_size):
            loss = ((net.decoder(net.encoder(x_s[idx])) - x_s[idx]) ** 2).sum(1).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, steps = total + loss.item(), steps + 1
    net.eval()
    return total / max(steps, 1)


@dataclass(frozen=True)
class LocalResult:
    """One local round: the training rows, the mean of each loss term, the shared embeddings' sums."""

    examples: int
    losses: dict[str, float]
    sums: EmbeddingSums


def local_train(net: SpfdNet, data: BankData, cfg: SpfdConfig, job: SpfdJob,
                global_stats: tuple[np.ndarray, np.ndarray] | None, seed: int) -> LocalResult:
    """Algorithm 1, lines 4–11 on one bank: minibatch Adam on L_CE + λ_alg L_alg + λ_p-n L_p-n + λ_rec L_rec.

    L_alg only under ``job.align`` and once the server has global statistics; L_p-n and L_rec only under
    ``job.private`` on a bank with private columns. Every parameter is updated (the paper's line 11).
    """
    train = data.mask("train")
    x_s, x_p = bank_inputs(net, data, train)
    y = torch.as_tensor(np.nan_to_num(data.table.label[train]).astype(np.float32))
    pos = float(y.sum())
    weight = torch.tensor(min((len(y) - pos) / pos, cfg.max_pos_weight) if pos else 1.0)
    use_private = job.private and net.private_encoder is not None
    stats = None if global_stats is None or not job.align else (
        torch.as_tensor(global_stats[0], dtype=torch.float32), torch.as_tensor(global_stats[1], dtype=torch.float32))
    optimizer = torch.optim.Adam(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(seed)
    sums = {"ce": 0.0, "alg": 0.0, "pn": 0.0, "rec": 0.0}
    steps = 0
    net.train()
    for _ in range(cfg.local_epochs):
        for idx in torch.randperm(len(y), generator=gen).split(cfg.batch_size):
            out = net(x_s[idx], x_p[idx], use_private)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(out.logit, y[idx], pos_weight=weight)
            sums["ce"] += loss.item()
            covariance_ok = len(idx) > 1
            if stats is not None and covariance_ok and cfg.lambda_alg > 0:
                alg = alignment_loss(out.z_s, stats[0], stats[1], cfg.cov_eps)
                sums["alg"] += alg.item()
                loss = loss + cfg.lambda_alg * alg
            if use_private and out.x_p_hat is not None:
                rec = reconstruction_loss(out.x_p_hat, x_p[idx], out.z_p, cfg.sparsity)
                sums["rec"] += rec.item()
                loss = loss + cfg.lambda_rec * rec
                if covariance_ok:
                    pn = gaussian_kl(out.z_p, cfg.cov_eps)
                    sums["pn"] += pn.item()
                    loss = loss + cfg.lambda_pn * pn
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
    net.eval()
    with torch.no_grad():
        z = net.encoder(x_s).double().numpy()
    return LocalResult(int(len(y)), {k: v / max(steps, 1) for k, v in sums.items()}, EmbeddingSums.of(z))


def embedding_sums(net: SpfdNet, data: BankData) -> EmbeddingSums:
    """Sums of the shared embeddings of the bank's training rows under the current encoder."""
    x_s, _ = bank_inputs(net, data, data.mask("train"))
    with torch.no_grad():
        return EmbeddingSums.of(net.encoder(x_s).double().numpy())


def score_rows(net: SpfdNet, data: BankData, job: SpfdJob, rows: np.ndarray | None = None) -> np.ndarray:
    """Fraud probability (float64) of the bank's rows (all, or the ``rows`` mask)."""
    x_s, x_p = bank_inputs(net, data, rows)
    with torch.no_grad():
        return torch.sigmoid(net(x_s, x_p, job.private).logit).double().numpy()


def validation_histograms(net: SpfdNet, data: BankData, job: SpfdJob, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Positive and negative score histograms of the bank's validation rows (only counts leave the bank)."""
    valid = data.mask("valid")
    return score_histograms(data.table.label[valid], score_rows(net, data, job, valid), bins)


def config_of(record: Any) -> SpfdConfig:
    """The run's :class:`SpfdConfig`, sent by the server as JSON in the message config."""
    return SpfdConfig.model_validate_json(str(record["spfd-config"]))

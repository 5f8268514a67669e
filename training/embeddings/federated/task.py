"""Settings, model and data of one G-HIN2Vec node: what a bank trains on, built inside the bank.

A bank replays its own rows (``bank_<k>/transactions.parquet``) into heterogeneous ego graphs of its *training*
cardholders (:func:`fedfraud.feature_store.layout.split_of`) and keeps them in this process. What leaves the bank
is the model's ``state_dict`` and scalar metrics (loss, triplet accuracies, counts).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedfraud.feature_store.config import EgoGraphConfig, EncoderConfig, PrivacyConfig
from fedfraud.feature_store.layout import read_bank, split_of
from fedfraud.feature_store.privacy import PrivateFeaturizer
from fedfraud.training.embeddings.config import Hin2VecConfig
from fedfraud.training.embeddings.embed import sample_graphs
from fedfraud.training.embeddings.graph import HinGraph, collate
from fedfraud.training.embeddings.model import Hin2Vec, sample_triplets

__all__ = ["BankGraphs", "Settings", "bank_graphs", "build_model", "evaluate_graphs", "train_graphs"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settings:
    """Everything a node needs, as one JSON-able flat record (it rides Flower's ``ConfigRecord``)."""

    data_dir: str
    hin2vec: Hin2VecConfig
    encoder: EncoderConfig
    privacy: PrivacyConfig
    egograph: EgoGraphConfig

    def to_flat(self) -> dict[str, Any]:
        return {"data-dir": self.data_dir, "hin2vec": self.hin2vec.model_dump_json(),
                "encoder": self.encoder.model_dump_json(), "privacy": self.privacy.model_dump_json(),
                "egograph": self.egograph.model_dump_json()}

    @classmethod
    def from_flat(cls, flat: dict[str, Any]) -> Settings:
        return cls(str(flat["data-dir"]), Hin2VecConfig.model_validate_json(str(flat["hin2vec"])),
                   EncoderConfig.model_validate_json(str(flat["encoder"])),
                   PrivacyConfig.model_validate_json(str(flat["privacy"])),
                   EgoGraphConfig.model_validate_json(str(flat["egograph"])))


@dataclass(frozen=True)
class BankGraphs:
    """A bank's training graphs and held-out (test-split) graphs for the unsupervised metrics."""

    train: list[HinGraph]
    test: list[HinGraph]


def build_model(settings: Settings) -> Hin2Vec:
    """The initial model, seeded: every bank and the server start from the same weights."""
    torch.manual_seed(settings.hin2vec.seed)
    return Hin2Vec(settings.hin2vec, settings.encoder.dim)


@functools.lru_cache(maxsize=8)
def _cached(flat_json: str, bank: int) -> BankGraphs:
    settings = Settings.from_flat(json.loads(flat_json))
    h = settings.hin2vec
    frame = read_bank(Path(settings.data_dir), bank)
    featurizer = PrivateFeaturizer.for_bank(settings.encoder, settings.privacy, bank)
    rng = np.random.default_rng([h.seed, bank])
    start = time.perf_counter()
    train, _ = sample_graphs(frame, featurizer, settings.egograph, h.merchant_buckets, h.cell_deg,
                             h.cardholder_summary, h.snapshots_per_cardholder, rng, split_of, "train")
    test, _ = sample_graphs(frame, featurizer, settings.egograph, h.merchant_buckets, h.cell_deg,
                            h.cardholder_summary, 1, rng, split_of, "test")
    if len(train) > h.max_graphs:
        train = [train[i] for i in sorted(rng.choice(len(train), h.max_graphs, replace=False).tolist())]
    logger.info("hin2vec_bank bank=%d train_graphs=%d test_graphs=%d seconds=%.1f", bank, len(train), len(test),
                time.perf_counter() - start)
    return BankGraphs(train, test)


def bank_graphs(settings: Settings, bank: int) -> BankGraphs:
    """The bank's graphs, built once per process (a simulated SuperNode is called every round)."""
    return _cached(json.dumps(settings.to_flat(), sort_keys=True), bank)


def train_graphs(model: Hin2Vec, graphs: list[HinGraph], cfg: Hin2VecConfig, seed: int,
                 device: torch.device | None = None) -> dict[str, float]:
    """``local_epochs`` passes of Adam on the double-triplet loss; mean loss and triplet accuracies."""
    device = device or torch.device("cpu")
    model.to(device).train()
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    rng = np.random.default_rng(seed)
    losses: list[float] = []
    accs: list[float] = []
    for _ in range(cfg.local_epochs):
        order = rng.permutation(len(graphs))
        for a in range(0, len(order), cfg.batch_size):
            batch = collate([graphs[i] for i in order[a:a + cfg.batch_size]])
            sample = sample_triplets(batch, cfg, rng)
            loss, stats = model.loss(batch.to(device), sample)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            accs.append((stats["node_acc"] + stats["path_acc"]) / 2)
    return {"loss": float(np.mean(losses)) if losses else float("nan"),
            "triplet_acc": float(np.mean(accs)) if accs else float("nan"), "steps": float(len(losses))}


@torch.no_grad()
def evaluate_graphs(model: Hin2Vec, graphs: list[HinGraph], cfg: Hin2VecConfig, seed: int,
                    device: torch.device | None = None) -> dict[str, float]:
    """Mean double-triplet loss and triplet accuracies on graphs (eval mode, fixed walks from ``seed``)."""
    device = device or torch.device("cpu")
    model.to(device).eval()
    rng = np.random.default_rng(seed)
    out: dict[str, list[float]] = {"loss": [], "node_acc": [], "path_acc": []}
    for a in range(0, len(graphs), 256):
        batch = collate(graphs[a:a + 256])
        loss, stats = model.loss(batch.to(device), sample_triplets(batch, cfg, rng))
        out["loss"].append(float(loss))
        out["node_acc"].append(stats["node_acc"])
        out["path_acc"].append(stats["path_acc"])
    return {k: float(np.mean(v)) if v else float("nan") for k, v in out.items()}

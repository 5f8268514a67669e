"""``fedfraud bench attacks --hin2vec-only``: does a G-HIN2Vec embedding anonymise a cardholder?

The thesis presents the embeddings as an anonymisation mechanism: embeddings, not transactions, leave the bank.
Two attacks by a server that holds the embeddings (and the published model), each against its chance level:

1. **Linkage across periods.** The timeline is cut at its midpoint. Every cardholder active in both halves gets
   one embedding of the ego graph built from the first half only and one from the second half only (a fresh
   state: no shared transaction). The attacker links each second-half embedding to its nearest first-half
   embedding (cosine); success is top-1 accuracy, chance 1/N. The same attack on an *untrained* encoder (same
   architecture, seeded random weights) says how much of the linkage is the inputs rather than the training.
2. **Membership.** Members are the training-split cardholders (their graphs trained the model), non-members the
   test-split cardholders. Scores: the model's double-triplet loss on the cardholder's final graph (low = member;
   an attacker who also holds the graph, so stronger than one holding embeddings only), and the embedding's norm
   (embeddings only). ROC-AUC against 0.5.

Intervals: 95 % bootstrap over cardholders (:mod:`fedfraud.bench.harness`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from fedfraud.bench.harness import table
from fedfraud.training.bootstrap import Interval, bootstrap_by_group, bootstrap_statistics

__all__ = ["Hin2VecAttacks", "linkage_top1", "run_hin2vec_attacks"]

logger = logging.getLogger(__name__)


def linkage_top1(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Per row of ``second``: 1 when its nearest row of ``first`` by cosine is the same row index, else 0."""
    a = first / np.maximum(np.linalg.norm(first, axis=1, keepdims=True), 1e-12)
    b = second / np.maximum(np.linalg.norm(second, axis=1, keepdims=True), 1e-12)
    return (np.argmax(b @ a.T, axis=1) == np.arange(len(b))).astype(np.float64)


@dataclass
class Hin2VecAttacks:
    """Linkage and membership results with their chance levels."""

    label: str
    linked: int = 0
    linkage: dict[str, Interval] = field(default_factory=dict)
    members: int = 0
    non_members: int = 0
    membership: dict[str, Interval] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def to_markdown(self) -> str:
        n = max(self.linked, 1)
        lines = [f"### Attacks on G-HIN2Vec embeddings: {self.label} (`fedfraud bench attacks --hin2vec-only`)", "",
                 f"Model {self.info.get('model')}; {self.info.get('seconds', 0):.0f} s.", "",
                 *table(["attack", "success [95% CI]", "chance"], [
                     *((f"linkage, period 1 → period 2, top-1 ({name}; {self.linked} cardholders)", iv, f"{1 / n:.4f}")
                       for name, iv in self.linkage.items()),
                     *((f"membership ROC-AUC ({name}; {self.members} members, {self.non_members} non-members)", iv,
                        "0.500") for name, iv in self.membership.items())], "lrr")]
        return "\n".join(lines) + "\n"


def _graphs_by_holder(frame: pd.DataFrame, bank: int, cfg: Any, h2v: Any) -> tuple[list[Any], list[str]]:
    from fedfraud.feature_store.privacy import PrivateFeaturizer
    from fedfraud.training.embeddings.embed import sample_graphs

    featurizer = PrivateFeaturizer.for_bank(cfg.encoder, cfg.privacy, bank)
    h = h2v.cfg
    return sample_graphs(frame, featurizer, cfg.egograph, h.merchant_buckets, h.cell_deg, h.cardholder_summary, 1,
                         np.random.default_rng(0), final_only=True)


def _graph_losses(model: Any, graphs: list[Any], draws: int, seed: int) -> np.ndarray:
    """Per graph: the double-triplet loss averaged over ``draws`` walk samples (eval mode)."""
    from fedfraud.training.embeddings.graph import collate
    from fedfraud.training.embeddings.model import sample_triplets

    cfg = model.cfg
    rng = np.random.default_rng(seed)
    out = np.zeros(len(graphs))
    model.eval()
    with torch.no_grad():
        for a in range(0, len(graphs), 256):
            batch = collate(graphs[a:a + 256])
            total = np.zeros(batch.num_graphs)
            for _ in range(draws):
                s = sample_triplets(batch, cfg, rng)
                g, f = model.dissimilarities(batch, s)
                per = (torch.relu(g[0::2] ** 2 - g[1::2] ** 2 + cfg.alpha_node)
                       + torch.relu(f[0::2] ** 2 - f[1::2] ** 2 + cfg.alpha_graph)).numpy()
                gid = s.graph[0::2]
                total += np.bincount(gid, weights=per, minlength=batch.num_graphs) / np.bincount(
                    gid, minlength=batch.num_graphs)
            out[a:a + batch.num_graphs] = total / draws
    return out


def run_hin2vec_attacks(source: Path, work: Path, config: Any = None, label: str = "", resamples: int = 500,
                        draws: int = 8) -> Hin2VecAttacks:
    """Both attacks on the dataset of ``source`` (CSV, ingested under ``work``, or a dataset dir) with the
    ``hin2vec`` model of ``work/registry`` (trained federated there first if absent).
    """
    from fedfraud.bench.detection import ingested
    from fedfraud.config import FedfraudConfig
    from fedfraud.feature_store.layout import list_banks, read_bank, split_of
    from fedfraud.training.embeddings.embed import embed_cardholders
    from fedfraud.training.embeddings.model import Hin2Vec
    from fedfraud.training.embeddings.publish import load_hin2vec
    from fedfraud.training.embeddings.trainer import train_embeddings
    from fedfraud.training.registry import ModelRegistry

    cfg: FedfraudConfig = config or FedfraudConfig()
    start = time.perf_counter()
    work = Path(work)
    data = Path(source) if Path(source).is_dir() else ingested(Path(source), work)
    registry = work / "registry"
    if ModelRegistry(registry).latest("hin2vec") is None:
        train_embeddings(data, registry, cfg.hin2vec, cfg.encoder, cfg.privacy, cfg.egograph)
    h2v = load_hin2vec(registry)
    torch.manual_seed(h2v.cfg.seed + 1)
    untrained = Hin2Vec(h2v.cfg, h2v.encoder_dim).eval()
    out = Hin2VecAttacks(label or Path(source).name, info={"model": h2v.tag})

    first: dict[str, Any] = {}
    second: dict[str, Any] = {}
    final: dict[str, Any] = {}
    for b in list_banks(data):
        frame = read_bank(data, b)
        ts = pd.to_datetime(frame["timestamp"], utc=True)
        cut = ts.min() + (ts.max() - ts.min()) / 2
        for part, store in ((frame[ts < cut], first), (frame[ts >= cut], second), (frame, final)):
            graphs, ids = _graphs_by_holder(part, b, cfg, h2v)
            store.update({f"{b}:{i}": g for g, i in zip(graphs, ids, strict=True)})
    both = sorted(set(first) & set(second))
    out.linked = len(both)
    for name, model in (("trained", h2v.model), ("untrained encoder", untrained)):
        e1 = embed_cardholders(model, [first[k] for k in both])
        e2 = embed_cardholders(model, [second[k] for k in both])
        hits = linkage_top1(e1, e2)
        out.linkage[name] = bootstrap_statistics({"hit": hits}, np.asarray(both), {"top1": np.mean},
                                                 resamples=resamples)["hit"]["top1"]
    keys = sorted(final)
    split = np.array([split_of(k.split(":", 1)[1]) for k in keys])
    keep = split != "val"
    keys = [k for k, m in zip(keys, keep, strict=True) if m]
    member = split[keep] == "train"
    out.members, out.non_members = int(member.sum()), int((~member).sum())
    graphs = [final[k] for k in keys]
    loss = _graph_losses(h2v.model, graphs, draws, seed=11)
    norm = np.linalg.norm(embed_cardholders(h2v.model, graphs), axis=1)
    got = bootstrap_by_group(member, {"−loss (model + graph)": -loss, "embedding norm (embeddings only)": norm},
                             np.asarray(keys), resamples=resamples)
    out.membership = {k: v["roc_auc"] for k, v in got.items()}
    out.info["seconds"] = time.perf_counter() - start
    logger.info("hin2vec_attacks linked=%d linkage=%s membership=%s", out.linked, out.linkage, out.membership)
    return out

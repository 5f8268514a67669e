"""Embeddings of cardholders: one function for batch features and the incremental (per-transaction) path.

:func:`embed_cardholders` turns :class:`~fedfraud.training.embeddings.graph.HinState` objects (or their graphs)
into h_G rows. Batch feature computation (:func:`causal_embeddings`) replays every cardholder's transactions
through :meth:`HinState.apply` (the same update a live stream applies) and, for each transaction, embeds the ego
graph *before* it, many graphs per call; the incremental path keeps one state per cardholder and calls the same
function on the state before each new transaction. ``test_hin2vec`` proves the two give equal rows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from fedfraud.feature_store.cardholder import prepare_batch
from fedfraud.feature_store.config import EgoGraphConfig
from fedfraud.feature_store.privacy import PrivateFeaturizer
from fedfraud.feature_store.schema import event_order
from fedfraud.training.embeddings.graph import HinGraph, HinState, collate
from fedfraud.training.embeddings.model import Hin2Vec

__all__ = ["causal_embeddings", "embed_cardholders", "embedding_dim_of", "embedding_names", "sample_graphs"]

logger = logging.getLogger(__name__)


def embedding_names(dim: int) -> tuple[str, ...]:
    """Column names of the embedding in a fraud-feature row."""
    return tuple(f"hin2vec_{i}" for i in range(dim))


def embedding_dim_of(names: Sequence[str]) -> int:
    """How many embedding columns a feature list holds (0: none); they are always ``embedding_names(dim)``."""
    present = set(names)
    return sum(1 for n in embedding_names(len(names)) if n in present)


def embed_cardholders(model: Hin2Vec, states: Sequence[HinState | HinGraph | None], chunk: int = 512) -> np.ndarray:
    """h_G of each state's ego graph now, float32 ``[n, dim]``; NaN rows for states without a merchant yet.

    The one embedding function: batch features pass thousands of graphs, the incremental path one per new
    transaction. Graphs are embedded in chunks of ``chunk`` (eval mode, no dropout; each graph's row depends only
    on that graph).
    """
    cfg = model.cfg
    out = np.full((len(states), cfg.dim), np.nan, dtype=np.float32)
    graphs: list[HinGraph] = []
    rows: list[int] = []
    for i, s in enumerate(states):
        g = s.graph(cfg.merchant_buckets, cfg.cell_deg, cfg.cardholder_summary) if isinstance(s, HinState) else s
        if g is not None:
            graphs.append(g)
            rows.append(i)
    device = next(model.parameters()).device
    for a in range(0, len(graphs), chunk):
        batch = collate(graphs[a:a + chunk]).to(device)
        out[rows[a:a + chunk]] = model.embed(batch).cpu().numpy()
    return out


def causal_embeddings(frame: pd.DataFrame, featurizer: PrivateFeaturizer, model: Hin2Vec,
                      ego_cfg: EgoGraphConfig, chunk: int = 2048, progress: bool = False) -> np.ndarray:
    """Per row of ``frame`` (its order), the embedding of its cardholder's ego graph *before* the row.

    A cardholder's first transaction (no merchant yet) gets NaN, which XGBoost routes by its default direction.
    Graphs are taken during the replay and embedded ``chunk`` at a time, so memory stays bounded.
    """
    cfg = model.cfg
    n = len(frame)
    out = np.full((n, cfg.dim), np.nan, dtype=np.float32)
    if not n:
        return out
    order = event_order(frame)
    position = np.arange(n) if order is None else np.asarray(order)
    batch = prepare_batch(frame, featurizer)
    states: dict[str, HinState] = {}
    pending: list[HinGraph] = []
    where: list[int] = []

    def flush() -> None:
        if pending:
            out[where] = embed_cardholders(model, pending, chunk)
            pending.clear()
            where.clear()

    for i in tqdm(range(n), disable=not progress, desc="hin2vec", mininterval=2.0):
        holder = batch.cardholder[i]
        state = states.get(holder)
        if state is None:
            state = states[holder] = HinState(ego_cfg)
        g = state.graph(cfg.merchant_buckets, cfg.cell_deg, cfg.cardholder_summary)
        if g is not None:
            pending.append(g)
            where.append(int(position[i]))
            if len(pending) >= chunk:
                flush()
        state.apply(batch, i)
    flush()
    logger.debug("hin2vec_embeddings rows=%d cardholders=%d", n, len(states))
    return out


def sample_graphs(frame: pd.DataFrame, featurizer: PrivateFeaturizer, ego_cfg: EgoGraphConfig, buckets: int,
                  cell_deg: float, summary: bool, per_cardholder: int, rng: np.random.Generator,
                  split_of: Callable[[str], Literal["train", "val", "test"]] | None = None,
                  split: str = "train", final_only: bool = False) -> tuple[list[HinGraph], list[str]]:
    """Training graphs: ``per_cardholder`` snapshots of each cardholder of ``split`` at random moments of its
    history (or its final graph with ``final_only``), replayed with :meth:`HinState.apply`; also each graph's
    raw cardholder id (bank-internal: for splits and attacks, never a model input).
    """
    order = event_order(frame)
    data = frame if order is None else frame.iloc[order]
    raw = data["cardholder_id"].astype(str).to_numpy()
    keep = np.ones(len(data), dtype=bool) if split_of is None else np.fromiter(
        (split_of(c) == split for c in raw), dtype=bool, count=len(raw))
    if not keep.any():
        return [], []
    sub = data[keep]
    batch = prepare_batch(sub, featurizer)
    holders = sub["cardholder_id"].astype(str).to_numpy()  # prepare_batch keeps sub's (event) order
    by_holder: dict[str, list[int]] = {}
    for i, h in enumerate(holders.tolist()):
        by_holder.setdefault(h, []).append(i)
    graphs: list[HinGraph] = []
    ids: list[str] = []
    for h in sorted(by_holder):
        rows = by_holder[h]
        if final_only:
            marks = {len(rows) - 1}
        else:
            marks = set(rng.choice(len(rows), size=min(per_cardholder, len(rows)), replace=False).tolist())
        state = HinState(ego_cfg)
        for j, i in enumerate(rows):
            state.apply(batch, i)
            if j in marks:
                g = state.graph(buckets, cell_deg, summary)
                if g is not None:
                    graphs.append(g)
                    ids.append(h)
    return graphs, ids

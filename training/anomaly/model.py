"""Anomaly model of thesis §4.4: GNN + hierarchical pooling encoder and the transition discriminator.

Encoder (one graph G_t → q_t):

1. ``X = L' + M[merchant]`` (noised location plus the learned merchant table);
2. ``H0 = X + Σ_j tanh(X_j + T'_ij)`` (:class:`TemporalMessage`);
3. ``L`` times: ``H ← dropout(ReLU(GCN(H, A)))``, then pooling keeps ⌈ratio·n⌉
   nodes (or clusters) and coarsens ``A``. GCN layers run on the symmetrised
   adjacency (a transition j→k relates both merchants); direction and time are
   already in ``H0``;
4. readout: ``q_t = Σ_l [mean_l ‖ max_l]`` over the pooled graph of every level
   (the hierarchical readout of the SAGPool/ASAP papers). With ratio 0.5 the
   last level of a ≤32-node graph is a single node, so the last term is the
   thesis's single-cluster embedding; the earlier terms keep a direct path
   from shallow levels, which trains far more reliably. ``dim(q) = 2·hidden``.
5. event readouts: ``q ← [q ‖ ReLU(W_h · history summary)]``, the cardholder's running statistics
   (:func:`fedfraud.feature_store.events.history_summary`) beside the graph's embedding.

``anomaly.ablate`` removes one of those parts to measure what it adds (``fedfraud bench anomaly-ablation``):
``no-graph`` keeps step 5 only, ``no-history`` drops step 5, ``freeze-merchants`` keeps ``M`` at its
initialisation (no gradient), ``no-location-time`` feeds zeros for ``L'`` and ``T'``.

Inference (eval, no autograd) runs steps 3–4 on padded dense tensors where every
layer has a dense form (TopK does): same embeddings, a constant number of batched
torch ops instead of PyG's per-call structure work (:mod:`fedfraud.training.anomaly.dense`).

Discriminator: ``f(q_{t-1}, q_t) = σ(W2 ReLU(W1 [q_{t-1} ‖ q_t ‖ q_t − q_{t-1}]))``,
two dense layers, trained with BCE, target 1 for a real transition and 0 for
a perturbed one. **Anomaly score = 1 − f** (high = unusual).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.data import Batch, Data
from torch_geometric.nn import GCNConv, global_max_pool, global_mean_pool
from torch_geometric.utils import scatter, to_undirected

from fedfraud.feature_store.config import EncoderConfig
from fedfraud.feature_store.encoders import MerchantEmbedding
from fedfraud.feature_store.egograph import FeatureSource, GraphView
from fedfraud.feature_store.events import SUMMARY_SIZE
from fedfraud.training.anomaly.config import AnomalyConfig, parse_heads
from fedfraud.training.anomaly.dense import DenseGraphs, dense_gcn, dense_readout, pad_graphs, supports_dense_gcn
from fedfraud.training.anomaly.heads import ContrastiveHead, NextEventHead, event_targets, nll_to_score
from fedfraud.training.anomaly.pool import GraphPooling, resolve_pooling
from fedfraud.training.anomaly.temporal import TemporalMessage

__all__ = [
    "AnomalyModel",
    "Discriminator",
    "EncoderOutput",
    "GraphEncoder",
    "GraphBatch",
    "collate_graphs",
    "collate_views",
    "embed_graphs",
    "pick_device",
    "score_embeddings",
    "score_event_embeddings",
    "score_pairs",
]


@dataclass(frozen=True)
class EncoderOutput:
    """Graph embeddings of a batch and the pooling operators' auxiliary loss."""

    q: Tensor
    aux_loss: Tensor

    def __post_init__(self) -> None:
        if self.q.dim() != 2:
            raise ValueError(f"EncoderOutput.q must be [graphs, dim], got {tuple(self.q.shape)}")
        if not torch.isfinite(self.q).all():
            raise ValueError("EncoderOutput.q has non-finite values")


class GraphEncoder(nn.Module):
    """G_t → q_t: merchant table, temporal input layer, L × (GCN → pooling), hierarchical readout."""

    #: Largest batch the dense path takes: it pays for padding every graph to the largest one, and on one CPU
    #: thread it stopped winning between 64 and 128 graphs per call (`fedfraud bench encoder`, docs/benchmarks.md).
    DENSE_MAX_GRAPHS = 64

    def __init__(self, cfg: AnomalyConfig, encoder_cfg: EncoderConfig, max_nodes: int) -> None:
        super().__init__()
        self.ablate = cfg.ablate
        self.merchant = MerchantEmbedding.from_config(encoder_cfg)
        if self.ablate == "freeze-merchants":  # stays at its N(0, 0.1) draw: every bucket a fixed random identity
            self.merchant.weight.requires_grad_(False)
        self.temporal = TemporalMessage()
        self.dropout = nn.Dropout(cfg.dropout)
        self.convs = nn.ModuleList()
        self.pools = nn.ModuleList()
        size, width = max_nodes, encoder_cfg.dim
        # no-graph builds no GCN or pooling; the merchant table stays (unused, no gradient) for the optimizer's sake
        for _ in range(0 if self.ablate == "no-graph" else cfg.layers):
            self.convs.append(GCNConv(width, cfg.hidden))
            self.pools.append(resolve_pooling(cfg.pooling, cfg.hidden, cfg.ratio, size))
            width = cfg.hidden
            size = max(1, math.ceil(size * cfg.ratio))
        self.newest = cfg.readout == "thesis-newest"
        # event readouts: the graph-level event history (feature_store/events.py: history_summary) joins the readout
        with_history = cfg.uses_events and self.ablate != "no-history"
        self.history = nn.Linear(SUMMARY_SIZE, cfg.hidden) if with_history else None
        graph_dim = 0 if self.ablate == "no-graph" else 2 * cfg.hidden
        self.out_dim = graph_dim + (cfg.hidden if self.newest or self.history is not None else 0)
        #: inference takes the dense path where it applies (:meth:`dense_applies`); False forces the sparse one
        self.allow_dense = True
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier (Glorot) weights, zero biases, N(0, 0.1) merchant table."""
        self.merchant.reset_parameters()
        for conv in self.convs:
            conv.reset_parameters()
            nn.init.xavier_uniform_(conv.lin.weight)
        pool: GraphPooling
        for pool in self.pools:
            pool.reset_parameters()
        if self.history is not None:
            nn.init.xavier_uniform_(self.history.weight)
            nn.init.zeros_(self.history.bias)

    def dense_applies(self) -> bool:
        """The dense path gives this encoder's embeddings: eval mode, no autograd, every layer has a dense form."""
        return (
            self.allow_dense
            and not self.training
            and not torch.is_grad_enabled()
            and all(supports_dense_gcn(conv) for conv in self.convs)
            and all(pool.supports_dense() for pool in self.pools)
        )

    def forward(self, batch: Batch | Data | GraphBatch) -> EncoderOutput:
        graphs = int(batch.num_graphs) if hasattr(batch, "num_graphs") else 1
        if self.ablate == "no-graph":
            q = self._history_embedding(batch, graphs)
            return EncoderOutput(q, q.new_zeros(()))
        location, times = batch.x, batch.edge_attr
        if self.ablate == "no-location-time":
            location, times = torch.zeros_like(location), torch.zeros_like(times)
        # sparse gradient: a step touches a few hundred of the table's rows (see engine.train_model)
        x = location + F.embedding(batch.merchant, self.merchant.weight, sparse=True)
        x = self.temporal(x, batch.edge_index, times)
        vector = getattr(batch, "batch", None)
        if vector is None:
            vector = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        if 0 < graphs <= self.DENSE_MAX_GRAPHS and x.shape[0] and self.dense_applies():
            q, newest = self._dense_levels(x, batch.edge_index, vector, graphs)
            aux = x.new_zeros(())
        else:
            q, newest, aux = self._sparse_levels(x, batch.edge_index, vector, graphs)
        if newest is not None:
            q = torch.cat([q, newest], dim=1)
        if self.history is not None:
            q = torch.cat([q, self._history_embedding(batch, graphs)], dim=1)
        return EncoderOutput(q, aux)

    def _history_embedding(self, batch: Batch | Data | GraphBatch, graphs: int) -> Tensor:
        """ReLU(W_h · history summary) per graph: the event readouts' view of the cardholder's running statistics."""
        if self.history is None:
            raise ValueError("this encoder has no history layer (thesis readout or ablate=no-history)")
        return torch.relu(self.history(batch.history.reshape(graphs, -1)))

    def _sparse_levels(
        self, x: Tensor, edge_index: Tensor, vector: Tensor, graphs: int
    ) -> tuple[Tensor, Tensor | None, Tensor]:
        """PyG path (training, and poolings without a dense form): readout sum, newest node, aux loss."""
        edge_index, edge_weight = to_undirected(
            edge_index, torch.ones(edge_index.shape[1], device=x.device), num_nodes=x.shape[0]
        )
        q = x.new_zeros(graphs, 2 * self.convs[0].out_channels)
        aux = x.new_zeros(())
        newest: Tensor | None = None
        for conv, pool in zip(self.convs, self.pools, strict=True):
            x = self.dropout(torch.relu(conv(x, edge_index, edge_weight)))
            if self.newest and newest is None:  # nodes are appended in event order: the last is the newest
                last = scatter(torch.arange(x.shape[0], device=x.device), vector, 0, dim_size=graphs, reduce="max")
                newest = x[last]
            out = pool(x, edge_index, edge_weight, vector)
            x, edge_index, edge_weight, vector = out.x, out.edge_index, out.edge_weight, out.batch
            aux = aux + out.aux_loss
            q = q + torch.cat([global_mean_pool(x, vector, graphs), global_max_pool(x, vector, graphs)], dim=1)
        return q, newest, aux

    def _dense_levels(self, x: Tensor, edge_index: Tensor, vector: Tensor, graphs: int) -> tuple[Tensor, Tensor | None]:
        """Inference path on padded graphs (:mod:`fedfraud.training.anomaly.dense`): same readout sum, newest node."""
        # the first Θ before padding: fewer rows, and padded rows stay 0 (GCNConv's lin has no bias)
        g = pad_graphs(self.convs[0].lin(x), edge_index, vector, graphs)
        q = x.new_zeros(graphs, 2 * self.convs[0].out_channels)
        newest: Tensor | None = None
        pool: GraphPooling
        for depth, (conv, pool) in enumerate(zip(self.convs, self.pools, strict=True)):
            h = torch.relu(dense_gcn(conv, g.adj, g.x if depth == 0 else conv.lin(g.x)))  # eval: no dropout
            if self.newest and newest is None:
                newest = h[torch.arange(graphs, device=h.device), g.mask.sum(dim=1) - 1]
            g = DenseGraphs(*pool.dense(h, g.adj, g.mask))
            q = q + dense_readout(g.x, g.mask)
        return q, newest


class Discriminator(nn.Module):
    """f(q_{t-1}, q_t) → logit of "a real transition"; two dense layers."""

    def __init__(self, q_dim: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(3 * q_dim, hidden)
        self.fc2 = nn.Linear(hidden, 1)
        self.dropout = nn.Dropout(dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for fc in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(fc.weight)
            nn.init.zeros_(fc.bias)

    def forward(self, q_prev: Tensor, q_cur: Tensor) -> Tensor:
        if q_prev.shape != q_cur.shape:
            raise ValueError(f"q_prev {tuple(q_prev.shape)} and q_cur {tuple(q_cur.shape)} differ")
        h = torch.cat([q_prev, q_cur, q_cur - q_prev], dim=-1)
        return self.fc2(self.dropout(torch.relu(self.fc1(h)))).squeeze(-1)


class AnomalyModel(nn.Module):
    """Encoder + readout head; the whole state_dict is what the federation averages.

    The head depends on ``cfg.readout``: :class:`Discriminator` for the thesis
    readouts, :class:`~fedfraud.training.anomaly.heads.NextEventHead` or
    :class:`~fedfraud.training.anomaly.heads.ContrastiveHead` for the event readouts.
    """

    def __init__(self, cfg: AnomalyConfig, encoder_cfg: EncoderConfig, max_nodes: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder_cfg = encoder_cfg
        self.max_nodes = max_nodes
        self.encoder = GraphEncoder(cfg, encoder_cfg, max_nodes)
        q_dim = self.encoder.out_dim
        if cfg.readout == "next-event":
            self.head: nn.Module = NextEventHead(q_dim, cfg.disc_hidden, parse_heads(cfg.heads), cfg.dropout)
        elif cfg.readout == "contrastive":
            self.head = ContrastiveHead(q_dim, cfg.disc_hidden, cfg.dropout)
        else:
            self.discriminator = Discriminator(q_dim, cfg.disc_hidden, cfg.dropout)

    @property
    def uses_events(self) -> bool:
        """Scores (q_{t-1}, newest event) instead of (q_{t-1}, q_t)."""
        return self.cfg.uses_events

    def event_scores(self, q_prev: Tensor, prior: np.ndarray, event: np.ndarray) -> Tensor:
        """Anomaly score in [0, 1] of each newest event given q_{t-1} (event readouts only); high = unusual."""
        if self.cfg.readout == "next-event":
            targets = {
                h: torch.from_numpy(t).to(q_prev.device) for h, t in event_targets(prior, event).items()
            }
            upper = frozenset(h.strip() for h in self.cfg.upper_tail.split(",") if h.strip())
            return nll_to_score(self.head.surprise(q_prev, targets, upper))  # type: ignore[operator]
        if self.cfg.readout == "contrastive":
            return torch.sigmoid(-self.head(q_prev, ContrastiveHead.features(prior, event, q_prev.device)))
        raise ValueError(f"readout {self.cfg.readout!r} scores graph pairs, not events")

    def embed(self, batch: Batch | Data | GraphBatch) -> EncoderOutput:
        """Q for every graph of a batch."""
        return self.encoder(batch)

    def logits(self, q_prev: Tensor, q_cur: Tensor) -> Tensor:
        """Logit of f(q_{t-1}, q_t); f = sigmoid(logit) (thesis readouts)."""
        return self.discriminator(q_prev, q_cur)

    @staticmethod
    def anomaly_score(logits: Tensor) -> Tensor:
        """1 − f(q_{t-1}, q_t) in [0, 1]; high = unusual."""
        return torch.sigmoid(-logits)

    def __repr__(self) -> str:
        cfg = self.cfg
        ablate = "" if cfg.ablate == "none" else f", ablate={cfg.ablate}"
        return (
            f"{self.__class__.__name__}(pooling={cfg.pooling}, layers={cfg.layers}, readout={cfg.readout}, "
            f"q_dim={self.encoder.out_dim}{ablate})"
        )


def pick_device(name: str = "auto") -> torch.device:
    """``auto``: CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode inside, the caller's mode after; no work when already in eval (serving's case: a
    ``train()`` walk over every submodule cost ~0.6 ms per call on the hot path).
    """
    if not model.training:
        yield
        return
    model.eval()
    try:
        yield
    finally:
        model.train()


@dataclass
class GraphBatch:
    """The ego graphs of a batch, concatenated: exactly the attributes :class:`GraphEncoder` reads.

    ``Batch.from_data_list`` is generic (any attribute, any increment rule) and
    cost ~0.2 ms per micro-batch plus ~20 µs per graph on the scoring path;
    ego-graph snapshots all have the same five attributes, so this concatenates
    them directly (``test_collate_graphs_matches_pyg_batch`` checks it builds
    the same inputs and the same embeddings as PyG's batch).
    """

    x: Tensor
    edge_index: Tensor
    edge_attr: Tensor
    merchant: Tensor
    history: Tensor
    batch: Tensor
    num_graphs: int

    def to(self, device: torch.device | str) -> GraphBatch:
        if self.x.device == torch.device(device):
            return self
        return GraphBatch(self.x.to(device), self.edge_index.to(device), self.edge_attr.to(device),
                          self.merchant.to(device), self.history.to(device), self.batch.to(device), self.num_graphs)


def collate_graphs(graphs: Sequence[Data]) -> GraphBatch:
    """One :class:`GraphBatch` of ego-graph snapshots (``x``, ``edge_index``, ``edge_attr``, ``merchant``,
    ``history``).
    """
    sizes = [int(g.num_nodes) for g in graphs]
    edge_index = torch.cat([g.edge_index for g in graphs], dim=1)
    if len(graphs) > 1:  # one shift for all graphs: a per-graph add cost ~1 torch op per graph
        offsets = torch.as_tensor(np.cumsum([0, *sizes[:-1]]), dtype=torch.long)
        edge_index = edge_index + torch.repeat_interleave(
            offsets, torch.as_tensor([g.edge_index.shape[1] for g in graphs], dtype=torch.long)
        )
    return GraphBatch(
        x=torch.cat([g.x for g in graphs]),
        edge_index=edge_index,
        edge_attr=torch.cat([g.edge_attr for g in graphs]),
        merchant=torch.cat([g.merchant for g in graphs]),
        history=torch.cat([g.history for g in graphs]),
        batch=torch.repeat_interleave(torch.arange(len(graphs)), torch.as_tensor(sizes, dtype=torch.long)),
        num_graphs=len(graphs),
    )


def collate_views(views: Sequence[GraphView], source: FeatureSource, history: Tensor) -> GraphBatch:
    """The :class:`GraphBatch` of ``collate_graphs([v's to_data ...])``, with one L′ and one T′ lookup for all the
    views' nodes and edges instead of one per graph, and no ``Data`` in between (the scoring path builds one or two
    graphs per transaction). ``history`` is the views' summaries, ``[len(views), SUMMARY_SIZE]``.
    """
    from itertools import chain

    nodes = [len(v.node_key) for v in views]
    edges = [len(v.edge_key) for v in views]
    n, e, d = sum(nodes), sum(edges), source.encoder_cfg.dim
    eps = np.asarray([v.epsilon for v in views], dtype=np.float64)
    if n:
        x = source.location(np.fromiter(chain.from_iterable(v.node_lat for v in views), np.float64, n),
                            np.fromiter(chain.from_iterable(v.node_lon for v in views), np.float64, n),
                            np.fromiter(chain.from_iterable(v.node_key for v in views), np.uint64, n),
                            np.repeat(eps, nodes))
        merchant = (np.fromiter(chain.from_iterable(v.node_merchant for v in views), np.uint64, n)
                    % np.uint64(source.encoder_cfg.merchant_buckets)).astype(np.int64)
    else:
        x, merchant = np.zeros((0, d), dtype=np.float32), np.zeros(0, dtype=np.int64)
    if e:
        edge_attr = source.time(np.fromiter(chain.from_iterable(v.edge_ts_us for v in views), np.int64, e) // 1_000_000,
                                np.fromiter(chain.from_iterable(v.edge_key for v in views), np.uint64, e),
                                np.repeat(eps, edges))
        shift = np.repeat(np.cumsum([0, *nodes[:-1]]), edges)
        edge_index = np.stack([np.fromiter(chain.from_iterable(v.edge_src for v in views), np.int64, e) + shift,
                               np.fromiter(chain.from_iterable(v.edge_dst for v in views), np.int64, e) + shift])
    else:
        edge_attr, edge_index = np.zeros((0, d), dtype=np.float32), np.zeros((2, 0), dtype=np.int64)
    return GraphBatch(
        x=torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)),
        edge_index=torch.from_numpy(edge_index),
        edge_attr=torch.from_numpy(np.ascontiguousarray(edge_attr, dtype=np.float32)),
        merchant=torch.from_numpy(merchant),
        history=history,
        batch=torch.from_numpy(np.repeat(np.arange(len(views), dtype=np.int64), nodes)),
        num_graphs=len(views),
    )


@torch.no_grad()
def embed_graphs(model: AnomalyModel, graphs: Sequence[Data] | GraphBatch, batch_size: int = 256) -> Tensor:
    """Q for each graph, ``[len(graphs), q_dim]`` on the model's device; eval mode, batched (a
    :class:`GraphBatch` is one batch, whatever its size).
    """
    device = next(model.parameters()).device
    if isinstance(graphs, GraphBatch):  # already collated (collate_views)
        with eval_mode(model):
            return model.embed(graphs.to(device)).q
    with eval_mode(model):
        out = [
            model.embed(collate_graphs(graphs[i : i + batch_size]).to(device)).q
            for i in range(0, len(graphs), batch_size)
        ]
    if not out:
        return torch.zeros(0, model.encoder.out_dim, device=device)
    return torch.cat(out)


@torch.no_grad()
def score_embeddings(model: AnomalyModel, q_prev: Tensor, q_cur: Tensor) -> np.ndarray:
    """Anomaly score 1 − f(q_{t-1}, q_t) per row, float64 numpy."""
    with eval_mode(model):
        return model.anomaly_score(model.logits(q_prev, q_cur)).double().cpu().numpy()


@torch.no_grad()
def score_event_embeddings(model: AnomalyModel, q_prev: Tensor, prior: np.ndarray, event: np.ndarray) -> np.ndarray:
    """Anomaly score of each newest event given q_{t-1} (event readouts), float64 numpy."""
    with eval_mode(model):
        return model.event_scores(q_prev, prior, event).double().cpu().numpy()


def score_pairs(
    model: AnomalyModel,
    previous: Sequence[Data],
    current: Sequence[Data],
    batch_size: int = 256,
    prior: np.ndarray | None = None,
    event: np.ndarray | None = None,
) -> np.ndarray:
    """Anomaly scores of aligned transitions; a graph object shared by two pairs is embedded once.

    Event readouts score (G_{t-1}, newest event) and need ``prior`` / ``event``
    (``[n, ·]``, :mod:`fedfraud.feature_store.events`); they never embed G_t.
    """
    if model.uses_events:
        if prior is None or event is None or len(prior) != len(previous) or len(event) != len(previous):
            raise ValueError("an event readout needs one prior history and one raw event per transition")
        graphs = list(previous)
    else:
        graphs = [*previous, *current]
    unique: dict[int, int] = {}
    distinct: list[Data] = []
    for g in graphs:
        if id(g) not in unique:
            unique[id(g)] = len(distinct)
            distinct.append(g)
    q = embed_graphs(model, distinct, batch_size)
    prev_idx = torch.tensor([unique[id(g)] for g in previous], dtype=torch.long, device=q.device)
    if model.uses_events:
        return score_event_embeddings(model, q[prev_idx], prior, event)  # type: ignore[arg-type]
    cur_idx = torch.tensor([unique[id(g)] for g in current], dtype=torch.long, device=q.device)
    return score_embeddings(model, q[prev_idx], q[cur_idx])

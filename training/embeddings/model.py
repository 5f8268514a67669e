"""G-HIN2Vec (thesis §3.4): a hetero GNN encoder of the ego graph trained with the double-triplet loss.

The thesis learns h_G = σ(W_G x_G) from a one-hot graph indicator: a lookup table with one row per cardholder,
i.e. a cardholder identifier inside the model, and no embedding for a graph it did not train on. Here h_G comes
from an inductive hetero GNN over the graph's private node features (two ``HeteroConv`` layers of ``SAGEConv``,
readout: the ego node's state and the mean merchant state), the thesis's own "future work" (§3.7). Everything
else follows §3.4.2:

* **positive context** π⁺: a random walk of ``l`` triplets ⟨v, e, v'⟩ following a metapath p⁺ of :data:`METAPATHS`
  (uniform neighbour choice, Eq. 3.2; the teleportation term of Eq. 3.15 is not used);
* **negative context** π⁻ (Algorithm 1, MetapathSeqNoising): π⁺ with ⌈λl⌉ middle triplets replaced by random
  triplets of another metapath p⁻ (nodes of the graph of the right types, not necessarily connected);
* **triplet operation** (Eq. 3.13): τ = ((1−β)/2 h_v) ⊙ (β h_e) ⊙ ((1−β)/2 h_v'), h_v = σ(W_v x_v),
  h_e = σ(W_e e); the target triplet t (one of the replaced positions) and the context (all but t) are projected;
* **learned dissimilarities** (Eq. 3.14): g_nn, f_nn = softmax(W [h_π, W_p h_G] + b)₀;
* **double-triplet loss** (Eq. 3.12): [g⁺² − g⁻² + α1]₊ + [f⁺² − f⁻² + α2]₊ (:func:`double_triplet_loss`).

The embedding a downstream model reads is h_G (:meth:`Hin2Vec.embed`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch_geometric.nn import HeteroConv, SAGEConv, global_mean_pool

from fedfraud.feature_store.events import CATEGORY_SLOTS, SUMMARY_SIZE
from fedfraud.training.embeddings.config import Hin2VecConfig
from fedfraud.training.embeddings.graph import EDGE_TYPES, HinBatch

__all__ = ["METAPATHS", "Hin2Vec", "TripletSample", "double_triplet_loss", "sample_triplets"]

_REL = {rel: i for i, (_, rel, _) in enumerate(EDGE_TYPES)}
_SRC = {rel: s for s, rel, _ in EDGE_TYPES}
_DST = {rel: d for _, rel, d in EDGE_TYPES}
#: Metapaths as cyclic relation schemas (start and end node types match, Def. 27).
METAPATHS: tuple[tuple[str, ...], ...] = (
    ("next",),  # M -next-> M: the dynamic transitions
    ("is_a", "has"),  # M -> category -> M
    ("in", "contains"),  # M -> location -> M
    ("visits", "is_a", "has", "visited_by"),  # C -> M -> category -> M -> C
)


def double_triplet_loss(node_pos: torch.Tensor, node_neg: torch.Tensor, path_pos: torch.Tensor,
                        path_neg: torch.Tensor, alpha_node: float, alpha_graph: float) -> torch.Tensor:
    """Eq. 3.12, mean over instances: ``[g⁺² − g⁻² + α1]₊ + [f⁺² − f⁻² + α2]₊`` from the four dissimilarities."""
    node = torch.relu(node_pos.square() - node_neg.square() + alpha_node)
    path = torch.relu(path_pos.square() - path_neg.square() + alpha_graph)
    return (node + path).mean()


@dataclass(frozen=True)
class TripletSample:
    """Positive and negative metapath instances of a batch, as global node indices per triplet position.

    ``src``/``dst``: ``[n, l]`` node indices into their type's rows, ``src_type``/``dst_type``: ``[n, l]`` node
    type ids, ``rel``: ``[n, l]`` relation ids; rows ``2j`` / ``2j+1`` are instance j's positive / negative.
    ``graph``: ``[n]`` graph of each row, ``path``: ``[n]`` its metapath, ``target``: ``[n]`` position t.
    """

    src: np.ndarray
    dst: np.ndarray
    src_type: np.ndarray
    dst_type: np.ndarray
    rel: np.ndarray
    graph: np.ndarray
    path: np.ndarray
    target: np.ndarray

    def __post_init__(self) -> None:
        n, length = self.src.shape
        if n % 2 or any(a.shape != (n, length) for a in (self.dst, self.src_type, self.dst_type, self.rel)):
            raise ValueError("TripletSample needs [2k, l] arrays")
        if any(a.shape != (n,) for a in (self.graph, self.path, self.target)):
            raise ValueError("TripletSample needs one graph, path and target per row")


_TYPE_ID = {"cardholder": 0, "merchant": 1, "category": 2, "location": 3}


def _neighbours(batch: HinBatch) -> dict[str, list[list[int]]]:
    """Per relation, each source node's destinations (global indices)."""
    sizes = {"cardholder": batch.num_graphs, "merchant": len(batch.merchant_bucket), "category": len(batch.category),
             "location": len(batch.location)}
    out: dict[str, list[list[int]]] = {}
    for (s, rel, _), ei in zip(EDGE_TYPES, batch.edge_index.values(), strict=True):
        adj: list[list[int]] = [[] for _ in range(sizes[s])]
        for a, b in ei.t().tolist():
            adj[a].append(b)
        out[rel] = adj
    return out


def _nodes_of(batch: HinBatch, kind: str, graph: int) -> range:
    off = batch.offsets[kind]
    total = {"cardholder": batch.num_graphs, "merchant": len(batch.merchant_bucket),
             "category": len(batch.category), "location": len(batch.location)}[kind]
    end = off[graph + 1] if graph + 1 < len(off) else total
    return range(int(off[graph]), int(end))


def sample_triplets(batch: HinBatch, cfg: Hin2VecConfig, rng: np.random.Generator) -> TripletSample:
    """π⁺ per graph and ``negatives`` noised π⁻ each (Algorithm 2's inner loop), as a :class:`TripletSample`."""
    length = cfg.walk_length
    noisy = max(1, min(length - 1, math.ceil(cfg.noise * length)))
    keep_head = math.ceil((length - noisy) / 2)
    adj = _neighbours(batch)
    trip: list[list[tuple[int, int, int]]] = []
    graph: list[int] = []
    path: list[int] = []
    target: list[int] = []
    for g in range(batch.num_graphs):
        walk, p_pos = _walk(batch, adj, g, length, rng)
        for _ in range(cfg.negatives):
            others = [q for q in range(len(METAPATHS)) if q != p_pos]
            p_neg = others[int(rng.integers(len(others)))]
            schema = METAPATHS[p_neg]
            neg = list(walk)
            for k in range(keep_head, keep_head + noisy):
                rel = schema[k % len(schema)]
                src_nodes, dst_nodes = _nodes_of(batch, _SRC[rel], g), _nodes_of(batch, _DST[rel], g)
                neg[k] = (int(src_nodes[int(rng.integers(len(src_nodes)))]), _REL[rel],
                          int(dst_nodes[int(rng.integers(len(dst_nodes)))]))
            t = keep_head + int(rng.integers(noisy))  # a replaced position: the node triplet's negative is noise
            trip += [walk, neg]
            graph += [g, g]
            path += [p_pos, p_neg]
            target += [t, t]
    arr = np.asarray(trip, dtype=np.int64)  # [n, l, 3]
    rels = arr[:, :, 1]
    src_type = np.vectorize(lambda r: _TYPE_ID[EDGE_TYPES[r][0]])(rels)
    dst_type = np.vectorize(lambda r: _TYPE_ID[EDGE_TYPES[r][2]])(rels)
    return TripletSample(arr[:, :, 0], arr[:, :, 2], src_type.astype(np.int64), dst_type.astype(np.int64), rels,
                         np.asarray(graph), np.asarray(path), np.asarray(target))


def _walk(batch: HinBatch, adj: dict[str, list[list[int]]], g: int, length: int,
          rng: np.random.Generator) -> tuple[list[tuple[int, int, int]], int]:
    """A random metapath instance of graph ``g``: metapaths in random order, three starts each (Eq. 3.2)."""
    for p in rng.permutation(len(METAPATHS)).tolist():
        schema = METAPATHS[p]
        starts = _nodes_of(batch, _SRC[schema[0]], g)
        for _ in range(3):
            v = int(starts[int(rng.integers(len(starts)))])
            steps: list[tuple[int, int, int]] = []
            for k in range(length):
                rel = schema[k % len(schema)]
                nxt = adj[rel][v]
                if not nxt:
                    break
                w = nxt[int(rng.integers(len(nxt)))]
                steps.append((v, _REL[rel], w))
                v = w
            if len(steps) == length:
                return steps, p
    raise RuntimeError("no metapath instance in a graph")  # the category metapath always closes


class Hin2Vec(nn.Module):
    """The hetero GNN encoder (h_G) and the triplet heads of the double-triplet loss.

    Inputs per node type (all private): merchant bucket row + W·[L', log visits]; category slot row;
    location W·L'; the ego node's W·history summary. ``loc_dim`` is the size of L' (the encoder's d).
    """

    def __init__(self, cfg: Hin2VecConfig, loc_dim: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.loc_dim = loc_dim
        h, c = cfg.hidden, cfg.context
        self.merchant_table = nn.Embedding(cfg.merchant_buckets, h)
        self.merchant_in = nn.Linear(loc_dim + 1, h)
        self.category_table = nn.Embedding(CATEGORY_SLOTS, h)
        self.location_in = nn.Linear(loc_dim, h)
        self.cardholder_in = nn.Linear(SUMMARY_SIZE, h)
        self.convs = nn.ModuleList(
            HeteroConv({et: SAGEConv((h, h), h) for et in EDGE_TYPES}, aggr="sum") for _ in range(cfg.layers)
        )
        self.readout = nn.Linear(2 * h, cfg.dim)
        self.dropout = nn.Dropout(cfg.dropout)
        self.relation = nn.Embedding(len(EDGE_TYPES), h)
        self.target_proj = nn.Linear(h, c)
        self.context_proj = nn.Linear((cfg.walk_length - 1) * h, c)
        self.graph_proj = nn.ModuleList(nn.Linear(cfg.dim, c) for _ in METAPATHS)
        self.g_nn = nn.Linear(2 * c, 2)
        self.f_nn = nn.Linear(2 * c, 2)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier weights, N(0, 0.1) tables, zero biases (deterministic under ``torch.manual_seed``)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, 0.1)
        for conv in self.convs:
            conv.reset_parameters()  # type: ignore[operator]  # ModuleList items are typed Module

    def __repr__(self) -> str:
        c = self.cfg
        return f"{self.__class__.__name__}(dim={c.dim}, hidden={c.hidden}, layers={c.layers}, loc_dim={self.loc_dim})"

    def inputs(self, b: HinBatch) -> dict[str, torch.Tensor]:
        """Each node type's input state x (hidden size)."""
        return {
            "cardholder": self.cardholder_in(b.cardholder),
            "merchant": self.merchant_table(b.merchant_bucket)
            + self.merchant_in(torch.cat([b.merchant_loc, b.merchant_visits[:, None]], dim=1)),
            "category": self.category_table(b.category),
            "location": self.location_in(b.location),
        }

    def encode(self, b: HinBatch, x: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """h_G ``[num_graphs, dim]``: message passing over every relation, then the ego + mean-merchant readout."""
        x = self.inputs(b) if x is None else x
        for conv in self.convs:
            out = conv(x, b.edge_index)
            x = {k: self.dropout(torch.relu(v)) for k, v in out.items()}
        merchants = global_mean_pool(x["merchant"], b.batch["merchant"], size=b.num_graphs)
        return self.readout(torch.cat([x["cardholder"], merchants], dim=1))

    @torch.no_grad()
    def embed(self, b: HinBatch) -> torch.Tensor:
        """h_G in eval mode (no dropout): the task-agnostic embedding."""
        was = self.training
        self.eval()
        try:
            return self.encode(b)
        finally:
            self.train(was)

    def dissimilarities(self, b: HinBatch, s: TripletSample) -> tuple[torch.Tensor, torch.Tensor]:
        """(g_nn, f_nn) per row of ``s`` (Eq. 3.14): node-triplet and metapath dissimilarity to its graph."""
        x = self.inputs(b)
        h_graph = self.encode(b, x)
        device = h_graph.device
        hidden = torch.cat([torch.sigmoid(x[k]) for k in ("cardholder", "merchant", "category", "location")])
        base = torch.tensor(np.cumsum([0, b.num_graphs, len(b.merchant_bucket), len(b.category)]), device=device)
        src = torch.as_tensor(s.src, device=device) + base[torch.as_tensor(s.src_type, device=device)]
        dst = torch.as_tensor(s.dst, device=device) + base[torch.as_tensor(s.dst_type, device=device)]
        rel = torch.sigmoid(self.relation(torch.as_tensor(s.rel, device=device)))
        beta = self.cfg.beta
        side = (1.0 - beta) / 2.0
        tau = (side * hidden[src]) * (beta * rel) * (side * hidden[dst])  # [n, l, h]
        n, length, _ = tau.shape
        t = torch.as_tensor(s.target, device=device)
        target = tau[torch.arange(n, device=device), t]
        keep = torch.ones(n, length, dtype=torch.bool, device=device)
        keep[torch.arange(n, device=device), t] = False
        context = tau[keep].reshape(n, (length - 1) * tau.shape[2])
        graphs = h_graph[torch.as_tensor(s.graph, device=device)]
        proj = torch.stack([w(graphs) for w in self.graph_proj], dim=1)  # [n, P, c]
        hg = proj[torch.arange(n, device=device), torch.as_tensor(s.path, device=device)]
        g = torch.softmax(self.g_nn(torch.cat([self.target_proj(target), hg], dim=1)), dim=1)[:, 0]
        f = torch.softmax(self.f_nn(torch.cat([self.context_proj(context), hg], dim=1)), dim=1)[:, 0]
        return g, f

    def loss(self, b: HinBatch, s: TripletSample) -> tuple[torch.Tensor, dict[str, float]]:
        """The double-triplet loss of a batch and its triplet accuracies (share of negatives farther than π⁺)."""
        g, f = self.dissimilarities(b, s)
        g_pos, g_neg, f_pos, f_neg = g[0::2], g[1::2], f[0::2], f[1::2]
        loss = double_triplet_loss(g_pos, g_neg, f_pos, f_neg, self.cfg.alpha_node, self.cfg.alpha_graph)
        stats = {"node_acc": float((g_neg > g_pos).float().mean()), "path_acc": float((f_neg > f_pos).float().mean())}
        return loss, stats

"""The heterogeneous ego graph of a cardholder (thesis §3.3, Fig. 3.2), built on the project's dynamic ego graph.

The merchant-to-merchant structure is :class:`fedfraud.feature_store.egograph.EgoGraphState` itself (same
update, same bounds, same forgetting); :class:`HinState` only remembers, per merchant node, the category and
the noised location L' of the transaction that created the node, so the heterogeneous view can be built
from the state at any moment. Nodes and edges:

* one ``cardholder`` node (the ego): its history summary (:func:`~fedfraud.feature_store.events.history_summary`,
  no id, no coordinates) or zeros with ``cardholder_summary: false``;
* ``merchant`` nodes: merchant hash bucket, L', log visit count;
* ``category`` nodes: the category slot (:func:`~fedfraud.feature_store.events.category_slot`) of each merchant;
* ``location`` nodes: grid cells of ``cell_deg`` degrees of the merchants (features: L' of the first merchant in
  the cell; the raw coordinates only decide which merchants share a cell and never enter the model);
* static edges cardholder–merchant (visits), merchant–category, merchant–location, both directions;
  dynamic edges merchant→merchant (the ego graph's transitions within its window).

No cardholder identifier, raw coordinate, amount or timestamp is in a :class:`HinGraph`.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedfraud.feature_store.cardholder import PreparedBatch
from fedfraud.feature_store.config import EgoGraphConfig
from fedfraud.feature_store.egograph import EgoGraphState
from fedfraud.feature_store.events import SUMMARY_SIZE, category_slot, history_summary

__all__ = ["EDGE_TYPES", "NODE_TYPES", "HinBatch", "HinGraph", "HinState", "collate"]

_INFO_MAGIC = b"H2VN"
_INFO_VERSION = 1
_INFO_HEAD = struct.Struct("<4sHII")  # magic, version, nodes, L' size
_CRC = struct.Struct("<I")

NODE_TYPES = ("cardholder", "merchant", "category", "location")
#: (source type, relation, destination type); the index is the relation's id in the triplet model.
EDGE_TYPES: tuple[tuple[str, str, str], ...] = (
    ("cardholder", "visits", "merchant"),
    ("merchant", "visited_by", "cardholder"),
    ("merchant", "next", "merchant"),
    ("merchant", "is_a", "category"),
    ("category", "has", "merchant"),
    ("merchant", "in", "location"),
    ("location", "contains", "merchant"),
)


@dataclass(frozen=True)
class HinGraph:
    """One heterogeneous ego graph, private features only; merchant positions index the ``merchant_*`` arrays."""

    cardholder: np.ndarray  # [SUMMARY_SIZE] float32
    merchant_loc: np.ndarray  # [m, d] float32 (L')
    merchant_bucket: np.ndarray  # [m] int64
    merchant_visits: np.ndarray  # [m] float32, log1p(visits)
    category: np.ndarray  # [k] int64 category slots
    location: np.ndarray  # [c, d] float32 (L' of the cell's first merchant)
    merchant_category: np.ndarray  # [m] int64, position in ``category``
    merchant_location: np.ndarray  # [m] int64, position in ``location``
    next_src: np.ndarray  # [e] int64 merchant positions
    next_dst: np.ndarray  # [e] int64

    def __post_init__(self) -> None:
        m = self.merchant_loc.shape[0]
        if m < 1 or self.cardholder.shape != (SUMMARY_SIZE,):
            raise ValueError("a HinGraph needs at least one merchant and a cardholder row")
        for name in ("merchant_bucket", "merchant_visits", "merchant_category", "merchant_location"):
            if getattr(self, name).shape != (m,):
                raise ValueError(f"HinGraph.{name} must have one entry per merchant")
        if self.next_src.shape != self.next_dst.shape:
            raise ValueError("next edges need as many sources as destinations")
        if self.merchant_category.max() >= len(self.category) or self.merchant_location.max() >= len(self.location):
            raise ValueError("a merchant points at a missing category or location node")

    @property
    def num_merchants(self) -> int:
        return int(self.merchant_loc.shape[0])


class HinState:
    """A cardholder's :class:`EgoGraphState` plus, per merchant node, its category slot and L' (bank-internal).

    ``apply`` is the per-transaction update of both; a caller that already updated the ego graph itself (serving's
    :meth:`fedfraud.feature_store.cardholder.CardholderState.apply`) calls :meth:`observe` instead.
    """

    __slots__ = ("ego", "node_info")

    def __init__(self, cfg: EgoGraphConfig | None = None, ego: EgoGraphState | None = None) -> None:
        if ego is None:
            if cfg is None:
                raise ValueError("give an ego-graph config or an ego-graph state")
            ego = EgoGraphState(cfg)
        self.ego = ego
        self.node_info: dict[int, tuple[int, np.ndarray]] = {}

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.ego!r})"

    def apply(self, batch: PreparedBatch, i: int) -> bool:
        """Fold row ``i`` of ``batch`` into the ego graph and the node table; ``False`` for a redelivery."""
        if not self.ego.update(batch.key[i], batch.merchant_hash[i], batch.lat[i], batch.lon[i], batch.ts_us[i],
                               batch.amount[i], batch.mcc[i]):
            return False
        self.observe(batch, i)
        return True

    def observe(self, batch: PreparedBatch, i: int) -> None:
        """Remember the category and L' of the node row ``i`` created (if it created one); forget evicted nodes."""
        key = int(batch.key[i])
        ego = self.ego
        if ego.node_key and ego.node_key[-1] == key and key not in self.node_info:
            self.node_info[key] = (category_slot(batch.mcc[i]), np.asarray(batch.features.location[i], np.float32))
        if len(self.node_info) > 2 * ego.cfg.max_nodes:
            live = set(ego.node_key)
            self.node_info = {k: v for k, v in self.node_info.items() if k in live}

    def complete(self) -> bool:
        """Every node of the ego graph has its category and L' here (a state built by :meth:`apply` always has;
        serving's may not: an ego graph pushed before its node table was kept embeds as no graph until then).
        """
        info = self.node_info
        return all(k in info for k in self.ego.node_key)

    def info_bytes(self) -> bytes:
        """The node table of the live nodes, for serving's KV store (bank-internal: category slots and L').

        Layout: magic, version, node count, L' size, then keys (uint64), slots (int16), L' rows (float32), CRC32.
        """
        live = [k for k in self.ego.node_key if k in self.node_info]
        d = len(self.node_info[live[0]][1]) if live else 0
        keys = np.asarray(live, dtype=np.uint64)
        slots = np.asarray([self.node_info[k][0] for k in live], dtype=np.int16)
        loc = np.stack([self.node_info[k][1] for k in live]).astype(np.float32) if live else np.zeros(0, np.float32)
        body = _INFO_HEAD.pack(_INFO_MAGIC, _INFO_VERSION, len(live), d) + keys.tobytes() + slots.tobytes() + \
            loc.tobytes()
        return body + _CRC.pack(zlib.crc32(body))

    def load_info(self, blob: bytes) -> None:
        """Merge a node table written by :meth:`info_bytes`; raises ``ValueError`` on a corrupt or foreign blob."""
        if len(blob) < _INFO_HEAD.size + _CRC.size:
            raise ValueError("hin2vec node table: truncated")
        body, (crc,) = blob[:-_CRC.size], _CRC.unpack(blob[-_CRC.size:])
        magic, version, n, d = _INFO_HEAD.unpack_from(body)
        if magic != _INFO_MAGIC or version != _INFO_VERSION:
            raise ValueError(f"hin2vec node table: unknown header {magic!r} v{version}")
        if zlib.crc32(body) != crc or len(body) != _INFO_HEAD.size + n * (8 + 2 + 4 * d):
            raise ValueError("hin2vec node table: bad length or checksum")
        at = _INFO_HEAD.size
        keys = np.frombuffer(body, np.uint64, n, at)
        slots = np.frombuffer(body, np.int16, n, at + 8 * n)
        loc = np.frombuffer(body, np.float32, n * d, at + 10 * n).reshape(n, d)
        for k, c, v in zip(keys.tolist(), slots.tolist(), loc, strict=True):
            self.node_info.setdefault(int(k), (int(c), v.copy()))

    def graph(self, buckets: int, cell_deg: float, summary: bool = True) -> HinGraph | None:
        """The heterogeneous view of the ego graph now; None while it has no merchant."""
        ego = self.ego
        if not ego.num_nodes:
            return None
        info = [self.node_info[k] for k in ego.node_key]
        slots = np.fromiter((c for c, _ in info), dtype=np.int64, count=len(info))
        loc = np.stack([v for _, v in info])
        category, merchant_category = np.unique(slots, return_inverse=True)
        cells: dict[tuple[int, int], int] = {}
        first: list[int] = []
        merchant_location = np.empty(len(info), dtype=np.int64)
        for j, (lat, lon) in enumerate(zip(ego.node_lat, ego.node_lon, strict=True)):
            cell = (math.floor(lat / cell_deg), math.floor(lon / cell_deg))
            if cell not in cells:
                cells[cell] = len(first)
                first.append(j)
            merchant_location[j] = cells[cell]
        pos = {m: j for j, m in enumerate(ego.node_merchant)}
        src = np.fromiter((pos[s] for s in ego.edge_src), dtype=np.int64, count=ego.num_edges)
        dst = np.fromiter((pos[d] for d in ego.edge_dst), dtype=np.int64, count=ego.num_edges)
        holder = history_summary(ego.history)[0] if summary else np.zeros(SUMMARY_SIZE, dtype=np.float32)
        return HinGraph(
            cardholder=holder,
            merchant_loc=loc,
            merchant_bucket=(np.asarray(ego.node_merchant, dtype=np.uint64) % np.uint64(buckets)).astype(np.int64),
            merchant_visits=np.log1p(np.asarray(ego.node_visits, dtype=np.float32)),
            category=category.astype(np.int64),
            location=loc[first],
            merchant_category=merchant_category.astype(np.int64),
            merchant_location=merchant_location,
            next_src=src,
            next_dst=dst,
        )


@dataclass(frozen=True)
class HinBatch:
    """Many :class:`HinGraph` as one disjoint heterogeneous graph: per-type inputs, edges and graph index.

    ``offsets[t]`` is each graph's first node of type ``t`` (numpy; the walk sampler uses local positions).
    """

    num_graphs: int
    cardholder: torch.Tensor
    merchant_loc: torch.Tensor
    merchant_bucket: torch.Tensor
    merchant_visits: torch.Tensor
    category: torch.Tensor
    location: torch.Tensor
    edge_index: dict[tuple[str, str, str], torch.Tensor]
    batch: dict[str, torch.Tensor]
    offsets: dict[str, np.ndarray]

    def to(self, device: torch.device) -> HinBatch:
        return HinBatch(self.num_graphs, self.cardholder.to(device), self.merchant_loc.to(device),
                        self.merchant_bucket.to(device), self.merchant_visits.to(device), self.category.to(device),
                        self.location.to(device), {k: v.to(device) for k, v in self.edge_index.items()},
                        {k: v.to(device) for k, v in self.batch.items()}, self.offsets)


def collate(graphs: Sequence[HinGraph]) -> HinBatch:
    """One disjoint batch of ``graphs`` (their order is the order of the embeddings)."""
    if not graphs:
        raise ValueError("nothing to collate")
    n = len(graphs)
    m = np.array([g.num_merchants for g in graphs])
    k = np.array([len(g.category) for g in graphs])
    c = np.array([len(g.location) for g in graphs])
    off = {"cardholder": np.arange(n), "merchant": np.r_[0, np.cumsum(m)[:-1]],
           "category": np.r_[0, np.cumsum(k)[:-1]], "location": np.r_[0, np.cumsum(c)[:-1]]}
    gm = np.repeat(np.arange(n), m)
    merchant_global = np.arange(int(m.sum()))
    mc = np.concatenate([g.merchant_category for g in graphs]) + np.repeat(off["category"], m)
    ml = np.concatenate([g.merchant_location for g in graphs]) + np.repeat(off["location"], m)
    e = np.array([len(g.next_src) for g in graphs])
    shift = np.repeat(off["merchant"], e)
    ns = np.concatenate([g.next_src for g in graphs]) + shift if e.sum() else np.zeros(0, dtype=np.int64)
    nd = np.concatenate([g.next_dst for g in graphs]) + shift if e.sum() else np.zeros(0, dtype=np.int64)

    def pair(a: np.ndarray, b: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.stack([a, b]).astype(np.int64))

    edges = {
        EDGE_TYPES[0]: pair(gm, merchant_global), EDGE_TYPES[1]: pair(merchant_global, gm),
        EDGE_TYPES[2]: pair(ns, nd),
        EDGE_TYPES[3]: pair(merchant_global, mc), EDGE_TYPES[4]: pair(mc, merchant_global),
        EDGE_TYPES[5]: pair(merchant_global, ml), EDGE_TYPES[6]: pair(ml, merchant_global),
    }
    return HinBatch(
        num_graphs=n,
        cardholder=torch.from_numpy(np.stack([g.cardholder for g in graphs])),
        merchant_loc=torch.from_numpy(np.concatenate([g.merchant_loc for g in graphs])),
        merchant_bucket=torch.from_numpy(np.concatenate([g.merchant_bucket for g in graphs])),
        merchant_visits=torch.from_numpy(np.concatenate([g.merchant_visits for g in graphs])),
        category=torch.from_numpy(np.concatenate([g.category for g in graphs])),
        location=torch.from_numpy(np.concatenate([g.location for g in graphs])),
        edge_index=edges,
        batch={"cardholder": torch.arange(n), "merchant": torch.from_numpy(gm),
               "category": torch.from_numpy(np.repeat(np.arange(n), k)),
               "location": torch.from_numpy(np.repeat(np.arange(n), c))},
        offsets=off,
    )

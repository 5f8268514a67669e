"""Per-cardholder dynamic ego graph G_t (thesis §4.4.1): incremental update and batch build.

One code path. Serving keeps an :class:`EgoGraphState` per cardholder and calls
:meth:`EgoGraphState.update` for each transaction, then :meth:`EgoGraphState.view`
(a micro-batch's views become one model input, with one feature lookup, in
:func:`fedfraud.training.anomaly.model.collate_views`; :meth:`EgoGraphState.to_data`
is the one-graph form). Training calls :func:`build_snapshot_pairs`,
which replays each cardholder's transactions through the very same ``update``;
it only precomputes the private features of the cardholder's transactions in
one vectorised call (they are a pure function of the transaction, see
:mod:`fedfraud.feature_store.privacy`) and assembles each snapshot by indexing them
instead of calling ``to_data``, so the graphs are identical, bit for bit.

Graph definition (documented choices):

* **Nodes** are the merchants the cardholder visited, identified by the
  64-bit merchant hash. A node's features are the merchant bucket and the
  noised location L' of the transaction that *created* the node (Sparkov
  merchant coordinates jitter per transaction; pinning the first one keeps a
  node's features stable as the graph grows, and its noise key fixes its noise).
* **Edges**: a directed edge j→k is added when a transaction at k immediately
  follows (in event time) the cardholder's previous transaction, at j, within
  ``window_hours``. Repeat visits give self-loops j→j (card testing looks like
  that). Parallel edges are kept: each one is a transition and carries T' of
  the k transaction (its timestamp and noise key).
* **Cumulative and bounded**: G_t extends G_{t-1}. At most ``max_nodes`` most
  recently visited merchants are kept (the least recently visited node is
  evicted with its edges), at most ``max_edges`` most recent edges, and nodes
  and edges older than ``horizon_days`` (relative to the newest transaction)
  are forgotten.
* **Late events** (timestamp before the last applied one) update the node but
  add no edge and do not move the clock back.
* **Redelivery**: the last ``dedupe_ring`` noise keys are remembered; applying
  one of them again is a no-op that returns ``False``.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import logging
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, UTC
from typing import Literal, Protocol, cast

import numpy as np
import pandas as pd
import torch
from torch_geometric.data import Data
from tqdm.auto import tqdm

from fedfraud.feature_store.config import EgoGraphConfig, EncoderConfig
from fedfraud.feature_store.encoders import timestamps_us
from fedfraud.feature_store.events import (
    HISTORY_SIZE, RAW_EVENT_SIZE, history_summary, new_history, raw_event, update_history,
)
from fedfraud.feature_store.privacy import PrivateFeaturizer
from fedfraud.feature_store.schema import Transaction

__all__ = [
    "CorruptStateError",
    "EgoGraphState",
    "FeatureSource",
    "GraphView",
    "SnapshotPair",
    "active_cardholders",
    "build_snapshot_pairs",
    "iter_snapshot_pairs",
]

logger = logging.getLogger(__name__)

_US_PER_S = 1_000_000
_US_PER_HOUR = 3600 * _US_PER_S
_US_PER_DAY = 24 * _US_PER_HOUR
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MAGIC = b"FFEG"
#: Version 2 appends the event history (:mod:`fedfraud.feature_store.events`); version 1 blobs load with an empty one.
_VERSION = 2
_HISTORY = struct.Struct(f"<{HISTORY_SIZE}d")
# magic, version, flags, n_nodes, n_edges, n_ring, reserved, last_ts, last_merchant, n_transactions
_HEADER = struct.Struct("<4sBBHHHHqQQ")
_CRC = struct.Struct("<I")
_FLAG_HAS_LAST = 1


class CorruptStateError(ValueError):
    """A serialized :class:`EgoGraphState` is truncated, corrupt or of an unknown version."""


class FeatureSource(Protocol):
    """What :meth:`EgoGraphState.to_data` needs: a :class:`PrivateFeaturizer` or something equivalent."""

    encoder_cfg: EncoderConfig

    def location(self, lat: np.ndarray, lon: np.ndarray, keys: np.ndarray, eps: np.ndarray | float) -> np.ndarray:
        """L' rows."""
        ...

    def time(self, ts: np.ndarray, keys: np.ndarray, eps: np.ndarray | float) -> np.ndarray:
        """T' rows."""
        ...


@dataclass(frozen=True, slots=True)
class GraphView:
    """G_t's nodes and edges with their noise keys at one moment, before any private feature is looked up.

    A copy (the state moves on after the view is taken). Serving takes one per
    snapshot and :func:`fedfraud.training.anomaly.model.collate_views` builds a
    micro-batch's model input from all of them with one L'/T' lookup, where
    :meth:`EgoGraphState.to_data` makes one ``Data`` per graph.
    """

    node_key: list[int]
    node_lat: list[float]
    node_lon: list[float]
    node_merchant: list[int]
    edge_src: list[int]  # node positions
    edge_dst: list[int]
    edge_ts_us: list[int]
    edge_key: list[int]
    epsilon: float

    @property
    def num_nodes(self) -> int:
        return len(self.node_key)


class EgoGraphState:
    """Compact, bank-internal state of one cardholder's ego graph (raw values; never leaves the bank).

    Per node: merchant hash, lat/lon and noise key of the creating transaction,
    first/last visit (µs) and visit count. Per edge: source and destination
    merchant hash, timestamp (µs) and noise key of the arriving transaction.
    Per cardholder: the event ``history`` (:mod:`fedfraud.feature_store.events`), so every
    transaction changes the state even when it adds no node or edge. After an
    :meth:`update`, ``last_event`` is the raw event just applied and ``prior``
    the history before it (transient; not serialized).
    """

    __slots__ = (
        "cfg",
        "node_merchant",
        "node_key",
        "node_lat",
        "node_lon",
        "node_first",
        "node_last",
        "node_visits",
        "edge_src",
        "edge_dst",
        "edge_ts",
        "edge_key",
        "recent",
        "last_ts",
        "last_merchant",
        "n_transactions",
        "history",
        "last_event",
        "prior",
    )
    _TRANSIENT = ("cfg", "last_event", "prior")

    def __init__(self, cfg: EgoGraphConfig) -> None:
        self.cfg = cfg
        self.node_merchant: list[int] = []
        self.node_key: list[int] = []
        self.node_lat: list[float] = []
        self.node_lon: list[float] = []
        self.node_first: list[int] = []
        self.node_last: list[int] = []
        self.node_visits: list[int] = []
        self.edge_src: list[int] = []
        self.edge_dst: list[int] = []
        self.edge_ts: list[int] = []
        self.edge_key: list[int] = []
        self.recent: list[int] = []
        self.last_ts: int | None = None
        self.last_merchant: int = 0
        self.n_transactions: int = 0
        self.history: np.ndarray = new_history()
        self.last_event: np.ndarray | None = None
        self.prior: np.ndarray | None = None

    # ------------------------------------------------------------------ inspection
    @property
    def num_nodes(self) -> int:
        return len(self.node_merchant)

    @property
    def num_edges(self) -> int:
        return len(self.edge_src)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(nodes={self.num_nodes}, edges={self.num_edges}, "
            f"transactions={self.n_transactions})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EgoGraphState):
            return NotImplemented
        same = all(
            getattr(self, s) == getattr(other, s) for s in self.__slots__ if s not in self._TRANSIENT and s != "history"
        )
        return same and np.array_equal(self.history, other.history)

    __hash__ = None  # type: ignore[assignment]  # mutable

    # ------------------------------------------------------------------ update
    def update(
        self, key: int, merchant: int, lat: float, lon: float, ts_us: int, amount: float, mcc: str
    ) -> bool:
        """Apply one transaction; ``False`` (and no change) if its noise key was applied recently.

        Args:
            key: the transaction's noise key (:meth:`PrivateFeaturizer.noise_keys`).
            merchant: 64-bit keyed merchant hash (:meth:`~.privacy.PrivateFeaturizer.merchant_hash`).
            lat: merchant latitude in degrees.
            lon: merchant longitude in degrees.
            ts_us: event time, UTC microseconds since the epoch.
            amount: transaction amount.
            mcc: category / merchant category code.
        """
        key, merchant, ts_us = int(key), int(merchant), int(ts_us)
        if key in self.recent:
            return False
        cfg = self.cfg
        self.recent.append(key)
        if len(self.recent) > cfg.dedupe_ring:
            del self.recent[0]

        self._forget_before(ts_us - int(cfg.horizon_days * _US_PER_DAY))
        event = raw_event(
            self.history, float(amount), str(mcc), ts_us / _US_PER_S, float(lat), float(lon),
            merchant not in self.node_merchant,
        )
        self.prior = self.history.copy()
        update_history(self.history, event)
        self.last_event = event
        try:
            i = self.node_merchant.index(merchant)
        except ValueError:
            self._add_node(merchant, key, float(lat), float(lon), ts_us)
        else:
            if ts_us > self.node_last[i]:
                self.node_last[i] = ts_us
            self.node_visits[i] += 1

        last = self.last_ts
        in_order = last is None or ts_us >= last
        if (
            last is not None
            and in_order
            and ts_us - last <= int(cfg.window_hours * _US_PER_HOUR)
            and self.last_merchant in self.node_merchant
        ):
            self.edge_src.append(self.last_merchant)
            self.edge_dst.append(merchant)
            self.edge_ts.append(ts_us)
            self.edge_key.append(key)
            excess = len(self.edge_src) - cfg.max_edges
            if excess > 0:
                self._drop_oldest_edges(excess)
        if in_order:
            self.last_ts = ts_us
            self.last_merchant = merchant
        self.n_transactions += 1
        return True

    def apply(self, tx: Transaction, featurizer: PrivateFeaturizer) -> bool:
        """Convenience for serving: :meth:`update` from a validated :class:`Transaction`."""
        key = int(featurizer.noise_keys([tx.transaction_id])[0])
        merchant = int(featurizer.merchant_hash([tx.merchant_id])[0])
        delta = tx.timestamp - _EPOCH
        ts_us = (delta.days * 86_400 + delta.seconds) * _US_PER_S + delta.microseconds
        return self.update(key, merchant, tx.lat, tx.lon, ts_us, tx.amount, tx.mcc)

    def _add_node(self, merchant: int, key: int, lat: float, lon: float, ts_us: int) -> None:
        self.node_merchant.append(merchant)
        self.node_key.append(key)
        self.node_lat.append(lat)
        self.node_lon.append(lon)
        self.node_first.append(ts_us)
        self.node_last.append(ts_us)
        self.node_visits.append(1)
        while len(self.node_merchant) > self.cfg.max_nodes:
            # least recently visited among the older nodes (never the one just added)
            older = self.node_last[:-1]
            self._drop_nodes([older.index(min(older))])

    def _drop_nodes(self, indices: list[int]) -> None:
        gone = {self.node_merchant[i] for i in indices}
        for i in sorted(indices, reverse=True):
            for column in (
                self.node_merchant,
                self.node_key,
                self.node_lat,
                self.node_lon,
                self.node_first,
                self.node_last,
                self.node_visits,
            ):
                del column[i]
        keep = [
            e
            for e, (s, d) in enumerate(zip(self.edge_src, self.edge_dst, strict=True))
            if s not in gone and d not in gone
        ]
        if len(keep) != len(self.edge_src):
            for column in (self.edge_src, self.edge_dst, self.edge_ts, self.edge_key):
                column[:] = [column[e] for e in keep]

    def _drop_oldest_edges(self, count: int) -> None:
        for column in (self.edge_src, self.edge_dst, self.edge_ts, self.edge_key):
            del column[:count]

    def _forget_before(self, cutoff_us: int) -> None:
        if self.node_last and min(self.node_last) < cutoff_us:
            self._drop_nodes([i for i, t in enumerate(self.node_last) if t < cutoff_us])
        if self.edge_ts and self.edge_ts[0] < cutoff_us:  # edges are in event-time order
            self._drop_oldest_edges(bisect.bisect_left(self.edge_ts, cutoff_us))

    # ------------------------------------------------------------------ model input
    def to_data(self, featurizer: FeatureSource, epsilon: float, history: torch.Tensor | None = None) -> Data:
        """The graph as PyG ``Data`` with private features only.

        ``x`` [n, d] float32 (L'), ``merchant`` [n] long (bucket), ``edge_index``
        [2, e] long, ``edge_attr`` [e, d] float32 (T'), ``history`` [1, s]
        float32 (:func:`fedfraud.feature_store.events.history_summary`; a caller that
        summarises many histories in one call passes the row). An empty state
        gives a valid 0-node graph. No timestamps, coordinates or ids are included.
        """
        d = featurizer.encoder_cfg.dim
        n, e = self.num_nodes, self.num_edges
        if n:
            x = featurizer.location(
                np.asarray(self.node_lat, dtype=np.float64),
                np.asarray(self.node_lon, dtype=np.float64),
                np.asarray(self.node_key, dtype=np.uint64),
                epsilon,
            )
            buckets = np.asarray(self.node_merchant, dtype=np.uint64) % np.uint64(
                featurizer.encoder_cfg.merchant_buckets
            )
        else:
            x = np.zeros((0, d), dtype=np.float32)
            buckets = np.zeros(0, dtype=np.uint64)
        if e:
            edge_attr = featurizer.time(
                np.asarray(self.edge_ts, dtype=np.int64) // _US_PER_S,
                np.asarray(self.edge_key, dtype=np.uint64),
                epsilon,
            )
        else:
            edge_attr = np.zeros((0, d), dtype=np.float32)
        return _graph(
            torch.from_numpy(x),
            torch.from_numpy(self._edge_index()),
            torch.from_numpy(edge_attr),
            torch.from_numpy(buckets.astype(np.int64)),
            torch.from_numpy(history_summary(self.history)) if history is None else history,
        )

    def view(self, epsilon: float) -> GraphView:
        """This graph's :class:`GraphView` (what :meth:`to_data` reads, copied), for a batched build."""
        pos = {m: i for i, m in enumerate(self.node_merchant)}
        return GraphView(list(self.node_key), list(self.node_lat), list(self.node_lon), list(self.node_merchant),
                         [pos[s] for s in self.edge_src], [pos[t] for t in self.edge_dst], list(self.edge_ts),
                         list(self.edge_key), epsilon)

    def _edge_index(self) -> np.ndarray:
        """``[2, e]`` int64 node positions of the edges' endpoints."""
        if not self.edge_src:
            return np.zeros((2, 0), dtype=np.int64)
        pos = {m: i for i, m in enumerate(self.node_merchant)}
        return np.array([[pos[s] for s in self.edge_src], [pos[t] for t in self.edge_dst]], dtype=np.int64)

    # ------------------------------------------------------------------ persistence
    def to_bytes(self) -> bytes:
        """Versioned little-endian binary with a trailing crc32 (about 3 KB at the default bounds)."""
        n, e, r = self.num_nodes, self.num_edges, len(self.recent)
        pos = {m: i for i, m in enumerate(self.node_merchant)}
        has_last = self.last_ts is not None
        header = _HEADER.pack(
            _MAGIC,
            _VERSION,
            _FLAG_HAS_LAST if has_last else 0,
            n,
            e,
            r,
            0,
            self.last_ts if has_last else 0,
            self.last_merchant,
            self.n_transactions,
        )
        body = _body(n, e, r).pack(
            *self.node_merchant,
            *self.node_key,
            *self.node_lat,
            *self.node_lon,
            *self.node_first,
            *self.node_last,
            *self.node_visits,
            *[pos[s] for s in self.edge_src],
            *[pos[t] for t in self.edge_dst],
            *self.edge_ts,
            *self.edge_key,
            *self.recent,
        )
        history = np.asarray(self.history, dtype="<f8")
        if history.shape != (HISTORY_SIZE,):
            raise ValueError(f"history has shape {history.shape}, not ({HISTORY_SIZE},)")
        payload = header + body + history.tobytes()
        return payload + _CRC.pack(zlib.crc32(payload))

    @staticmethod
    def max_serialized_bytes(cfg: EgoGraphConfig) -> int:
        """Size of :meth:`to_bytes` at the bounds (``max_nodes``, ``max_edges``, full ring)."""
        body = struct.calcsize(_body_format(cfg.max_nodes, cfg.max_edges, cfg.dedupe_ring))
        return _HEADER.size + body + _HISTORY.size + _CRC.size

    @classmethod
    def from_bytes(cls, blob: bytes, cfg: EgoGraphConfig) -> EgoGraphState:
        """Inverse of :meth:`to_bytes`; raises :class:`CorruptStateError` on any damage."""
        blob = bytes(blob)
        if len(blob) < _HEADER.size + _CRC.size:
            raise CorruptStateError(f"ego-graph state truncated: {len(blob)} bytes")
        payload, (crc,) = blob[: -_CRC.size], _CRC.unpack(blob[-_CRC.size :])
        if zlib.crc32(payload) != crc:
            raise CorruptStateError("ego-graph state checksum mismatch")
        magic, version, flags, n, e, r, _, last_ts, last_merchant, n_tx = _HEADER.unpack_from(payload)
        if magic != _MAGIC:
            raise CorruptStateError("not an ego-graph state (bad magic)")
        if version not in (1, _VERSION):
            raise CorruptStateError(f"unsupported ego-graph state version {version}")
        body = _body(n, e, r)
        history_size = _HISTORY.size if version >= 2 else 0
        if len(payload) != _HEADER.size + body.size + history_size:
            raise CorruptStateError("ego-graph state length does not match its header")
        values = body.unpack_from(payload, _HEADER.size)
        state = cls(cfg)
        if history_size:
            state.history = np.frombuffer(payload, "<f8", HISTORY_SIZE, _HEADER.size + body.size).astype(np.float64)
        cuts = _cuts(n, e, r)
        cols = [list(values[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
        (
            state.node_merchant,
            state.node_key,
            state.node_lat,
            state.node_lon,
            state.node_first,
            state.node_last,
            state.node_visits,
            src,
            dst,
            state.edge_ts,
            state.edge_key,
            state.recent,
        ) = cols
        if max(src, default=-1) >= n or max(dst, default=-1) >= n:
            raise CorruptStateError("ego-graph state edge refers to a missing node")
        state.edge_src = [state.node_merchant[i] for i in src]
        state.edge_dst = [state.node_merchant[i] for i in dst]
        state.last_ts = last_ts if flags & _FLAG_HAS_LAST else None
        state.last_merchant = last_merchant
        state.n_transactions = n_tx
        return state


def _graph(
    x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor, merchant: torch.Tensor, history: torch.Tensor
) -> Data:
    """``Data(x=, edge_index=, edge_attr=, merchant=, history=)`` without PyG's per-attribute ``__setattr__`` overhead.

    Filling the global store's mapping directly gives the very object the
    keyword constructor builds (same keys, same order) about 4x faster, which
    matters when the batch build makes one graph per transaction
    (``test_fast_graph_matches_keyword_constructor`` guards this against PyG changes).
    """
    data = Data()
    mapping: dict[str, torch.Tensor | int] = {
        "x": x, "edge_index": edge_index, "edge_attr": edge_attr, "merchant": merchant, "history": history
    }
    if not x.shape[0]:
        mapping["num_nodes"] = 0  # not inferable from an empty x
    data._store._mapping.update(mapping)
    return data


#: Placeholder of a snapshot's ``history`` until the cardholder's summaries are computed together.
_NO_HISTORY = torch.zeros(1, 0)


def _body_format(n: int, e: int, r: int) -> str:
    # nodes: merchant Q, key Q, lat d, lon d, first q, last q, visits I; edges: src H, dst H, ts q, key Q; ring Q
    return f"<{n}Q{n}Q{n}d{n}d{n}q{n}q{n}I{e}H{e}H{e}q{e}Q{r}Q"


@functools.lru_cache(maxsize=4096)
def _body(n: int, e: int, r: int) -> struct.Struct:
    """The compiled body layout of a state with ``n`` nodes, ``e`` edges and ``r`` ring entries."""
    return struct.Struct(_body_format(n, e, r))


@functools.lru_cache(maxsize=4096)
def _cuts(n: int, e: int, r: int) -> tuple[int, ...]:
    """Offsets of the twelve columns in a body's flat values (see :func:`_body_format`)."""
    return tuple(itertools.accumulate((n, n, n, n, n, n, n, e, e, e, e, r), initial=0))


# ---------------------------------------------------------------------- batch build
@dataclass(frozen=True)
class SnapshotPair:
    """One real transition G_{t-1} → G_t of a cardholder, the unit the anomaly model trains on.

    ``cardholder`` is the keyed pseudonym; ``is_fraud`` is the label of the
    transaction that produced G_t (``None`` if unlabelled), used only for evaluation.
    ``event`` is that transaction's raw event and ``prior`` the cardholder's
    history before it (:mod:`fedfraud.feature_store.events`), both bank-internal.
    """

    transaction_id: str
    cardholder: str
    previous: Data
    current: Data
    is_fraud: bool | None
    split: Literal["train", "val", "test"]
    event: np.ndarray
    prior: np.ndarray
    position: int = -1  # row position of the transaction in the frame given to iter_snapshot_pairs

    def __post_init__(self) -> None:
        for name, g in (("previous", self.previous), ("current", self.current)):
            x, edge_index = g.x, g.edge_index
            if x.shape[0] < 1 or g.edge_attr.shape[0] != edge_index.shape[1]:
                raise ValueError(f"SnapshotPair.{name} is not a consistent non-empty graph")
        if self.previous.x.shape[1] != self.current.x.shape[1]:
            raise ValueError("previous and current graphs differ in feature size")
        if self.split not in ("train", "val", "test"):
            raise ValueError(f"split must be 'train', 'val' or 'test', got {self.split!r}")
        if self.event.shape != (RAW_EVENT_SIZE,) or self.prior.shape != (HISTORY_SIZE,):
            raise ValueError("SnapshotPair.event / prior have the wrong shape")


class _SnapshotAssembler:
    """Builds ``to_data`` of one cardholder's state during the batch replay, from precomputed rows.

    Valid because L', T' and the merchant bucket are pure functions of the
    transaction (values, noise key, ε): a node or edge always carries the
    values of the transaction whose key it holds, so indexing the rows that
    ``PrivateFeaturizer.transform`` computed for the cardholder gives the same
    bits as :meth:`EgoGraphState.to_data` (``test_batch_equals_incremental_with_round_trips``).
    Tensors of an unchanged node or edge set are reused by the next snapshot
    rather than rebuilt; consumers that modify graphs clone them first.
    """

    __slots__ = ("_row", "_loc", "_time", "_merchant", "_nodes", "_edges", "_x", "_buckets", "_edge_index", "_attr")

    def __init__(self, keys: list[int], loc: np.ndarray, tim: np.ndarray, merchant: np.ndarray) -> None:
        self._row: dict[int, int] = {}
        for j, k in enumerate(keys):
            self._row.setdefault(k, j)  # a repeated key resolves to its first row
        self._loc, self._time, self._merchant = loc, tim, merchant
        self._nodes: tuple[list[int], list[int]] | None = None
        self._edges: tuple[list[int], list[int], list[int]] | None = None
        self._x = self._buckets = self._edge_index = self._attr = torch.empty(0)

    def data(self, state: EgoGraphState, history: torch.Tensor) -> Data:
        row = self._row
        nodes_changed = self._nodes is None or self._nodes != (state.node_key, state.node_merchant)
        if nodes_changed:
            idx = [row[k] for k in state.node_key]
            self._x = torch.from_numpy(self._loc[idx])
            self._buckets = torch.from_numpy(self._merchant[idx])
            self._nodes = (state.node_key.copy(), state.node_merchant.copy())
        if nodes_changed or self._edges != (state.edge_key, state.edge_src, state.edge_dst):
            self._edge_index = torch.from_numpy(state._edge_index())
            self._attr = torch.from_numpy(self._time[[row[k] for k in state.edge_key]])
            self._edges = (state.edge_key.copy(), state.edge_src.copy(), state.edge_dst.copy())
        return _graph(self._x, self._edge_index, self._attr, self._buckets, history)


def active_cardholders(frame: pd.DataFrame, min_per_month: float) -> np.ndarray:
    """Cardholder ids with at least ``min_per_month`` transactions per 30-day month of their activity span.

    The span is at least one month, so a cardholder seen for a week needs
    ``min_per_month`` transactions in that week.
    """
    ts = pd.Series(timestamps_us(frame["timestamp"]), index=frame.index)
    grouped = ts.groupby(frame["cardholder_id"].to_numpy())
    span_months = np.maximum((grouped.max() - grouped.min()) / (30 * _US_PER_DAY), 1.0)
    rate = grouped.size() / span_months
    return rate.index[rate >= min_per_month].to_numpy()


def iter_snapshot_pairs(
    frame: pd.DataFrame,
    featurizer: PrivateFeaturizer,
    cfg: EgoGraphConfig,
    min_transactions_per_month: float | None = None,
    progress: bool = False,
    split_of: Callable[[str], Literal["train", "val", "test"]] | None = None,
) -> Iterator[SnapshotPair]:
    """Yield (G_{t-1}, G_t) for every transaction of every active cardholder, cardholder by cardholder.

    Each cardholder's rows are replayed in (timestamp, transaction_id) order
    through :meth:`EgoGraphState.update`; a transaction whose G_{t-1} is empty
    (the cardholder's first) or that is a duplicate yields nothing.
    ``split_of`` maps a raw cardholder id to ``train`` / ``val`` / ``test``
    (the caller's split; everything is ``train`` without one).
    """
    minimum = cfg.min_transactions_per_month if min_transactions_per_month is None else min_transactions_per_month
    cols = ["transaction_id", "cardholder_id", "merchant_id", "timestamp", "lat", "lon", "amount", "mcc"]
    active = active_cardholders(frame, minimum) if len(frame) else np.array([], dtype=object)
    data = frame[frame["cardholder_id"].isin(active)]
    if len(data) < len(frame):
        logger.info(
            "filtered_inactive cardholders_kept=%d rows_kept=%d rows_dropped=%d min_per_month=%g",
            len(active),
            len(data),
            len(frame) - len(data),
            minimum,
        )
    if data.empty:
        return
    labels = data["is_fraud"] if "is_fraud" in data else pd.Series(pd.NA, index=data.index)
    positions = pd.Series(np.arange(len(frame)), index=frame.index)[frame["cardholder_id"].isin(active)].to_numpy()
    data = (
        data[cols]
        .assign(_label=labels.astype("boolean"), _position=positions)
        .sort_values(["cardholder_id", "timestamp", "transaction_id"], kind="stable")
    )
    feats = featurizer.transform(data)
    ts_us = timestamps_us(data["timestamp"])
    merchants = featurizer.merchant_hash(data["merchant_id"])
    lat = data["lat"].to_numpy(dtype=np.float64)
    lon = data["lon"].to_numpy(dtype=np.float64)
    tx_ids = data["transaction_id"].to_numpy()
    position = data["_position"].to_numpy().tolist()
    label_arr = data["_label"].to_numpy(dtype=object, na_value=None)
    holders = data["cardholder_id"].to_numpy()
    starts = np.flatnonzero(np.r_[True, holders[1:] != holders[:-1]])
    bounds = np.r_[starts, len(data)]
    # python ints once, not per step
    keys_py = feats.keys.tolist()
    merch_py = merchants.tolist()
    ts_py = ts_us.tolist()
    lat_py, lon_py = lat.tolist(), lon.tolist()
    amount_py = data["amount"].to_numpy(dtype=np.float64).tolist()
    mcc_py = data["mcc"].astype(str).tolist()

    for a, b in tqdm(
        zip(bounds[:-1], bounds[1:], strict=True), total=len(starts), disable=not progress, desc="ego graphs"
    ):
        assembler = _SnapshotAssembler(keys_py[a:b], feats.location[a:b], feats.time[a:b], feats.merchant[a:b])
        split = split_of(str(holders[a])) if split_of is not None else "train"
        pseudonym = feats.cardholder[a]
        state = EgoGraphState(cfg)
        previous: Data | None = None
        graphs: list[Data] = []
        histories: list[np.ndarray] = []
        pending: list[SnapshotPair] = []
        for i in range(a, b):
            if not state.update(keys_py[i], merch_py[i], lat_py[i], lon_py[i], ts_py[i], amount_py[i], mcc_py[i]):
                continue
            current = assembler.data(state, _NO_HISTORY)
            graphs.append(current)
            histories.append(state.history.copy())
            if previous is not None:
                label = label_arr[i]
                pending.append(SnapshotPair(
                    transaction_id=str(tx_ids[i]),
                    cardholder=pseudonym,
                    previous=previous,
                    current=current,
                    is_fraud=None if label is None else bool(label),
                    split=split,
                    # update() returned True, so it set both (they are None only before the first update)
                    event=cast(np.ndarray, state.last_event),
                    prior=cast(np.ndarray, state.prior),
                    position=position[i],
                ))
            previous = current
        # the history summaries of the cardholder's snapshots in one vectorised call, not one per transaction
        if graphs:
            summaries = torch.from_numpy(history_summary(np.asarray(histories)))
            for g, row in zip(graphs, summaries, strict=True):
                g._store._mapping["history"] = row.reshape(1, -1).clone()  # own storage: pickles alone
        yield from pending


def build_snapshot_pairs(
    frame: pd.DataFrame,
    featurizer: PrivateFeaturizer,
    cfg: EgoGraphConfig,
    min_transactions_per_month: float | None = None,
    progress: bool = False,
    split_of: Callable[[str], Literal["train", "val", "test"]] | None = None,
) -> list[SnapshotPair]:
    """All pairs of :func:`iter_snapshot_pairs` as a list."""
    return list(iter_snapshot_pairs(frame, featurizer, cfg, min_transactions_per_month, progress, split_of))

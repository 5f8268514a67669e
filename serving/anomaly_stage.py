"""The anomaly stage: ego-graph update + GNN anomaly score of micro-batches (one instance per scorer replica).

A plain class: the hot path (:mod:`fedfraud.serving.hotpath`) runs it, benchmarks and
tests call it. Per micro-batch, in event-time order::

    read cardholder states (one batched Feast read; score rings and fraud states in one KV read)
    ──> apply each transaction
    ──> G_t per transaction (and G_{t-1} only when the cached q_{t-1} is stale), as views: structure and noise keys
    ──> one model input per run of graphs, with one L′/T′ lookup for all their nodes and edges (collate_views)
    ──> q = embed(graphs) (in runs of at most ``max_nodes`` graph nodes)
    ──> AS = 1 − f(q_{t-1}, q_t) ──> rings and q_t updated in memory
    ──> a :class:`fedfraud.serving.scored.ScoredBatch` for :class:`fedfraud.serving.fraud_stage.FraudStage`
        (with the G-HIN2Vec columns when the fraud model reads them: each fresh row's cardholder graph before it,
        embedded by ``fedfraud.training.embeddings.embed.embed_cardholders``, the function batch features use;
        the node tables they need in the KV table ``hin2vec``, read and written in the same round trips)

The hot path then writes the batch once (:meth:`AnomalyStage.write`): score rings with the fraud stage's rows in
one KV write, then the states in one push.

Sections are timed with :class:`fedfraud.serving.metrics.StageClock` (``fedfraud bench
serving`` prints them as the per-stage profile).

Idempotence (at-least-once delivery means redelivery): a transaction whose
noise key is already in the ego graph's ring of applied keys is *redelivered*;
it does not touch the graph again and gets the anomaly score it got the first
time from the score ring (written before the state push, so this holds after a
crash between the two; a crash before either write leaves nothing to find, and the transaction is scored anew).

Cached q_{t-1}: the store's ``q_t`` is reused when this process wrote it with
the current model at the state's current version
(:class:`fedfraud.serving.anomaly_cache.FreshCache`); otherwise G_{t-1} is embedded
again, so a model swap or another replica's write never mixes embeddings of
two models. A shadowing challenger's q_t is kept the same way, in memory
(``AnomalyStage.shadow_fresh``): with both fresh, a shadowed transaction costs each
model one embedding of G_t, not two graphs each.

The model is anything that meets :class:`GraphScorer`; the default loader hook
:func:`load_anomaly_scorer` returns the training side's
:class:`fedfraud.training.anomaly.scorer.AnomalyScorer` itself (numpy in and out), the
same object ``fedfraud score`` scores with, so there is no serving-side wrapper.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd
import torch

from fedfraud.feature_store.cardholder import CardholderState, PreparedBatch, prepare_batch
from fedfraud.feature_store.egograph import GraphView
from fedfraud.feature_store.events import history_summary
from fedfraud.feature_store.privacy import PrivateFeaturizer
from fedfraud.serving.anomaly_cache import CachedFeatures, FreshCache
from fedfraud.serving.kafka import json_bytes, json_value, now_us
from fedfraud.serving.kvstore import KVStore
from fedfraud.serving.metrics import StageClock
from fedfraud.serving.scored import ScoredBatch
from fedfraud.serving.side_work import guarded
from fedfraud.training.anomaly.model import GraphBatch, collate_views

if TYPE_CHECKING:
    from fedfraud.feature_store.online import Hin2VecRow, OnlineStateClient
    from fedfraud.training.embeddings.graph import HinGraph, HinState
    from fedfraud.training.embeddings.publish import Hin2VecModel
    from fedfraud.training.registry import ModelRegistry

__all__ = ["OFF_TAG", "AnomalyStage", "AnomalyWork", "GraphScorer", "load_anomaly_scorer"]

#: The anomaly model tag of decisions made with the stage switched off (``serving.anomaly_stage: false``).
OFF_TAG = "off"

log = logging.getLogger(__name__)


class GraphScorer(Protocol):
    """What the anomaly stage needs from a model (``fedfraud.training.anomaly.scorer.AnomalyScorer``)."""

    tag: str

    def embed(self, graphs: GraphBatch) -> np.ndarray:
        """Q ``[n, k]`` of the n graphs of a batch (:func:`~fedfraud.training.anomaly.model.collate_views`)."""
        ...

    @property
    def uses_events(self) -> bool:
        """True: call :meth:`score_events` (q_{t-1} + newest event); False: :meth:`score` (q_{t-1}, q_t)."""
        ...

    def score(self, q_prev: np.ndarray, q_cur: np.ndarray) -> np.ndarray:
        """AS = 1 − f(q_{t−1}, q_t) per row (thesis readouts)."""
        ...

    def score_events(self, q_prev: np.ndarray, prior: np.ndarray, event: np.ndarray) -> np.ndarray:
        """AS of each newest event against q_{t−1} (event readouts)."""
        ...


def load_anomaly_scorer(registry: ModelRegistry, version: str = "latest") -> GraphScorer:
    """The default anomaly loader hook (``ScoringArgs.anomaly_loader``): the anomaly model of ``version``.

    It is the training scorer itself, the one batch scoring uses; serving only
    pins torch to one thread, because replicas, not threads, are the parallelism.
    """
    from fedfraud.training.anomaly.scorer import AnomalyScorer

    torch.set_num_threads(1)
    return AnomalyScorer.from_registry(registry, version)


@dataclass
class AnomalyWork:
    """A micro-batch between :meth:`AnomalyStage.begin` and :meth:`AnomalyStage.complete` (graphs to embed)."""

    batch: PreparedBatch
    frame: pd.DataFrame
    produced_us: np.ndarray
    source: str
    model: GraphScorer
    states: dict[str, CardholderState]
    rings: dict[str, list[list[Any]]]
    fraud_blobs: dict[str, bytes | None] = field(default_factory=dict)  # the fraud stage's state, read with the rings
    graphs: list[GraphView] = field(default_factory=list)  # G_{t-1}/G_t snapshots, features not yet looked up
    history: torch.Tensor | None = None  # each graph's history summary, [len(graphs), s]
    batches: list[GraphBatch] = field(default_factory=list)  # the model input of each forward, built once
    prev_graph: list[int] = field(default_factory=list)  # row → graph index of G_{t-1}, -1 none
    prev_cached: dict[int, np.ndarray] = field(default_factory=dict)  # row → cached q_{t-1}
    shadow_prev_cached: dict[int, np.ndarray] = field(default_factory=dict)  # row → the challenger's cached q_{t-1}
    shadow_q: np.ndarray | None = None  # the challenger's Q of ``graphs`` (its q_t are kept once the batch is written)
    cur_graph: list[int] = field(default_factory=list)  # row → graph index of G_t, -1 if not applied
    redelivered: list[bool] = field(default_factory=list)
    last_graph: dict[str, int] = field(default_factory=dict)
    events: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # row → (prior, raw event)
    applied_rows: list[int] = field(default_factory=list)  # rows applied to their state (complete fills these)
    touched: set[str] = field(default_factory=set)  # cardholders whose score ring grew
    changed: list[CardholderState] = field(default_factory=list)  # states to push, with their new q_t
    shadow: GraphScorer | None = None  # the challenger GNN, when one shadows (this batch's, fixed at begin)
    merchant_risk: list[dict[str, Any] | None] | None = None  # per row: its merchant's merchant_risk row
    hin2vec: Hin2VecModel | None = None  # the G-HIN2Vec encoder of this batch (fixed at begin), None: no columns
    hin_states: dict[str, HinState] = field(default_factory=dict)  # cardholder → its ego graph + node table
    hin_before: dict[int, HinGraph] = field(default_factory=dict)  # row → hetero ego graph before the row
    hin_changed: set[str] = field(default_factory=set)  # cardholders whose node table gained a node
    hin_latest: list[Hin2VecRow] = field(default_factory=list)  # the cardholder_hin2vec rows to push

    @property
    def holders(self) -> list[str]:
        return list(self.states)


class AnomalyStage:
    """Ego-graph update + GNN anomaly score of micro-batches (one instance per scorer replica)."""

    def __init__(
        self,
        client: OnlineStateClient,
        featurizer: PrivateFeaturizer,
        kv: KVStore,
        model: GraphScorer,
        bank_id: int,
        cell_deg: float,
        ring: int,
        clock: StageClock | None = None,
        max_nodes: int = 8192,
        risk_buckets: int = 0,
    ) -> None:
        self.client = client
        self.risk_buckets = risk_buckets  # > 0: read each row's merchant_risk row (bucket = hash mod this)
        self.featurizer = featurizer
        self.max_nodes = max_nodes
        self.kv = kv
        self.model = model
        self.bank_id = bank_id
        self.cell_deg = cell_deg
        self.ring = ring
        self.clock = clock or StageClock()
        self.fresh = FreshCache()
        self.shadow_fresh = FreshCache()  # the challenger's q_t, in memory only (no store holds it)
        self.features = CachedFeatures(featurizer)
        self.shadow: GraphScorer | None = None  # the challenger GNN while one shadows (HotPath sets it)
        #: The G-HIN2Vec encoder whose columns the fraud model reads (HotPath sets it; None: none computed, no cost).
        self.hin2vec: Hin2VecModel | None = None
        #: Read each cardholder's ``cardholder_demographics`` row with its state (HotPath sets it when the fraud
        #: model reads demographic columns, issue 39; off: no extra field read).
        self.demographics = False

    def begin(self, frame: pd.DataFrame, produced_us: np.ndarray, source: str = "kafka") -> AnomalyWork:
        """Read states, apply every transaction, collect the graphs to embed (no model call yet)."""
        model, hin2vec = self.model, self.hin2vec  # one version per micro-batch, even if a swap lands meanwhile
        clock = self.clock
        with clock.section("anomaly.prepare"):
            batch = prepare_batch(frame, self.featurizer)
            self.features.seed(batch)
        holders = list(dict.fromkeys(batch.cardholder))
        with clock.section("anomaly.state_read"):
            buckets = [h % self.risk_buckets for h in batch.merchant_hash] if self.risk_buckets else []
            distinct = list(dict.fromkeys(buckets))
            # the merchant-risk rows of the batch's merchants come with the states: no extra round trip
            read, risk = self.client.read_batch(holders, self.bank_id, distinct, demographics=self.demographics)
            states = dict(zip(holders, read, strict=True))
            # the fraud stage's rows (and the hin2vec node tables, when its model reads them) too: one round trip
            tables = ("scores", "fraud", "hin2vec") if hin2vec is not None else ("scores", "fraud")
            blobs, fraud, *info = self.kv.get_tables(tables, holders)
            rings = {h: (json_value(b) if b else []) for h, b in zip(holders, blobs, strict=True)}
        by_bucket = dict(zip(distinct, risk, strict=True))
        with clock.section("anomaly.graphs"):
            work = AnomalyWork(batch, frame, produced_us, source, model, states, rings,
                               dict(zip(holders, fraud, strict=True)), shadow=self.shadow,
                               merchant_risk=[by_bucket[b] for b in buckets] if buckets else None, hin2vec=hin2vec)
            if hin2vec is not None:
                work.hin_states = _hin_states(states, info[0])
            return self._apply(work)

    def _apply(self, work: AnomalyWork) -> AnomalyWork:
        """Fold each transaction into its state and collect G_t (and a stale G_{t-1}) to embed."""
        batch, model, states = work.batch, work.model, work.states
        eps_all = batch.features.epsilon
        histories: list[np.ndarray] = []  # each graph's history, summarised together below

        def snapshot(ego: Any, eps: float) -> None:
            work.graphs.append(ego.view(eps))
            histories.append(ego.history.copy())

        for i, holder in enumerate(batch.cardholder):
            state = states[holder]
            ego = state.ego
            if batch.key[i] in ego.recent:  # redelivery: no graph change, score from the ring
                work.redelivered.append(True)
                work.prev_graph.append(-1)
                work.cur_graph.append(-1)
                continue
            eps = float(eps_all[i])
            prev = -1
            if ego.num_nodes:
                if holder in work.last_graph:
                    prev = work.last_graph[holder]
                elif state.q_t.size and self.fresh.valid(holder, state.version, model.tag) and (
                        work.shadow is None or self._shadow_prev(work, i, holder, state.version)):
                    # the stored q_{t-1} is the champion's; a shadowing challenger's comes from its own cache
                    work.prev_cached[i] = state.q_t
                else:
                    snapshot(ego, eps)
                    prev = len(work.graphs) - 1
            hin = work.hin_states.get(holder)
            if hin is not None:  # the hetero graph before the row, with the same state the GNN reads
                before = _hin_graph(hin, work.hin2vec)
                if before is not None:
                    work.hin_before[i] = before
            applied = state.apply(batch, i, self.cell_deg)
            if applied:
                work.events[i] = (ego.prior, ego.last_event)  # type: ignore[assignment]
                if hin is not None:  # CardholderState.apply updated the ego graph: record the new node's info
                    known = len(hin.node_info)
                    hin.observe(batch, i)
                    if len(hin.node_info) != known:
                        work.hin_changed.add(holder)
            work.redelivered.append(not applied)
            work.prev_graph.append(prev)
            snapshot(ego, eps)
            work.cur_graph.append(len(work.graphs) - 1)
            work.last_graph[holder] = len(work.graphs) - 1
        if histories:  # one vectorised call instead of one per graph
            work.history = torch.from_numpy(history_summary(np.stack(histories)))
        return work

    def _shadow_prev(self, work: AnomalyWork, row: int, holder: str, version: int) -> bool:
        """Whether the challenger's q_{t-1} of ``holder`` at ``version`` is kept (then row ``row`` takes it)."""
        assert work.shadow is not None
        q = self.shadow_fresh.q(holder, version, work.shadow.tag)
        if q is None:
            return False
        work.shadow_prev_cached[row] = q
        return True

    def complete(self, work: AnomalyWork, q: np.ndarray) -> ScoredBatch:
        """Score with the embeddings of ``work.graphs`` and fold them into rings and states, in memory.

        Nothing is written here: :class:`fedfraud.serving.hotpath.HotPath` calls :meth:`write` once, after the
        fraud stage, with the fraud stage's rows.
        """
        batch, model = work.batch, work.model
        if q.shape[0] != len(work.graphs):
            raise ValueError(f"expected {len(work.graphs)} embeddings, got {q.shape[0]}")
        with self.clock.section("anomaly.gnn_score"):
            scores = _gnn_scores(work, q, model)
            self._remember(work, q, scores)
        extra: dict[str, Any] = {}
        if self.demographics:  # the cardholder's stored row per transaction; the fraud stage takes the age at it
            extra["demographics"] = [work.states[h].demographics for h in batch.cardholder]
        if work.hin2vec is not None:
            with self.clock.section("anomaly.hin2vec"):
                extra = {"hin2vec": self._hin2vec_columns(work), "hin2vec_model": work.hin2vec.tag}
        return _scored(work.source, work.frame, batch, scores, work.redelivered, work.produced_us, model.tag,
                       fraud_blobs=work.fraud_blobs, merchant_risk=work.merchant_risk, **extra)

    @staticmethod
    def _hin2vec_columns(work: AnomalyWork) -> np.ndarray:
        """Per row, the embedding of its cardholder's ego graph before it (NaN: none, or a redelivery), and each
        changed cardholder's embedding after the batch (the ``cardholder_hin2vec`` rows), in one model call of
        :func:`~fedfraud.training.embeddings.embed.embed_cardholders`, the function batch features use.
        """
        from fedfraud.training.embeddings.embed import embed_cardholders

        h2v = work.hin2vec
        assert h2v is not None
        rows = sorted(work.hin_before)
        after: list[tuple[CardholderState, HinGraph]] = []
        for state in work.changed:  # the states this batch applied a row to
            graph = _hin_graph(work.hin_states[state.cardholder], h2v)
            if graph is not None:
                after.append((state, graph))
        emb = embed_cardholders(h2v.model, [work.hin_before[i] for i in rows] + [g for _, g in after])
        cols = np.full((len(work.batch), h2v.cfg.dim), np.nan, dtype=np.float32)
        cols[rows] = emb[: len(rows)]
        work.hin_latest = [(s.cardholder, emb[len(rows) + k], h2v.tag, s.version, s.activity.last_seen_us)
                           for k, (s, _) in enumerate(after)]
        return cols

    def _remember(self, work: AnomalyWork, q: np.ndarray, scores: np.ndarray) -> None:
        """Append fresh scores to the rings, fill redelivered rows' scores from them, set each state's q_t."""
        batch, model = work.batch, work.model
        for i, holder in enumerate(batch.cardholder):
            ring = work.rings[holder]
            if work.redelivered[i]:
                for key, score, _tag in ring:
                    if key == batch.key[i]:
                        scores[i] = math.nan if score is None else score
                        break
                continue
            work.applied_rows.append(i)
            ring.append([batch.key[i], None if math.isnan(scores[i]) else float(scores[i]), model.tag])
            del ring[: max(len(ring) - self.ring, 0)]
            work.touched.add(holder)
        for holder, g in work.last_graph.items():
            state = work.states[holder]
            state.q_t = q[g].astype(np.float32)
            work.changed.append(state)

    def write(self, work: AnomalyWork, also: Sequence[tuple[str, Sequence[tuple[str, bytes]]]] = ()) -> None:
        """The batch's state, written once: the score rings with ``also`` (the fraud stage's ``fraud`` rows) in one
        KV round trip, then the states and merchants in one push to the online store.

        Rings first: after a crash between the two writes, a redelivery finds its transaction in the ego state's
        recent keys and re-emits the score its ring kept; a crash before both leaves nothing, and it is scored anew.
        """
        hin = [("hin2vec", [(h, work.hin_states[h].info_bytes()) for h in work.hin_changed])] if work.hin_changed \
            else []  # the node tables that gained a node (none without hin2vec columns)
        with self.clock.section("state.kv_write"):
            self.kv.put_tables([("scores", [(h, json_bytes(work.rings[h])) for h in work.touched]), *also, *hin])
        with self.clock.section("state.push"):
            extra = {"hin2vec": work.hin_latest} if work.hin_latest else {}  # cardholder_hin2vec, same write
            self.client.push(work.changed, self.bank_id, work.batch, work.applied_rows, **extra)
        for state in work.changed:
            self.fresh.put(state.cardholder, state.version, work.model.tag)
        if work.shadow is not None and work.shadow_q is not None:  # the challenger's q_t, once the state is written
            for holder, g in work.last_graph.items():
                self.shadow_fresh.put(holder, work.states[holder].version, work.shadow.tag, work.shadow_q[g])

    def embed(self, work: AnomalyWork) -> np.ndarray:
        """Embeddings of ``work.graphs``: one GNN forward per run of at most ``max_nodes`` graph nodes."""
        if not work.graphs:
            return np.zeros((0, 0), dtype=np.float32)
        with self.clock.section("anomaly.gnn_embed"):
            return self._embed_with(work.model, work)

    def _embed_with(self, model: GraphScorer, work: AnomalyWork) -> np.ndarray:
        """``model``'s Q of ``work.graphs``; the model inputs are built on the first call and kept for the shadow."""
        if not work.batches:
            assert work.history is not None
            start = 0
            for run in _node_chunks(work.graphs, self.max_nodes):
                end = start + len(run)
                work.batches.append(collate_views(run, self.features, work.history[start:end]))
                start = end
        parts = [model.embed(batch) for batch in work.batches]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def score(self, frame: pd.DataFrame, produced_us: np.ndarray, source: str = "kafka"
              ) -> tuple[AnomalyWork, ScoredBatch]:
        """Begin → embed → complete: the anomaly stage of one micro-batch, in this process; its writes are pending
        in ``work`` until :meth:`write`.

        While a challenger shadows, its GNN embeds the same graphs and scores the
        same rows (its AS rides along in the batch; states keep the champion's q).
        """
        work = self.begin(frame, produced_us, source)
        scored = self.complete(work, self.embed(work))
        if work.shadow is not None and work.graphs:
            with self.clock.section("shadow.anomaly"):  # never fails the batch (see guarded)
                shadow = guarded("shadow", lambda: self._shadow_scores(work))
            if shadow is not None:
                shadow[scored.redelivered] = np.nan
                scored.shadow_anomaly_score, scored.shadow_anomaly_model = shadow, work.shadow.tag
        return work, scored

    def skip(self, frame: pd.DataFrame, produced_us: np.ndarray, source: str = "kafka") -> ScoredBatch:
        """The stage switched off (``serving.anomaly_stage: false``): the private inputs the fraud stage reads, with
        a NaN anomaly score on every row; no online-store read or push, no ego graph, no model call.

        Why it exists: ``fedfraud bench serving --peers`` measures the hot path without its graph and GNN on the
        same machinery (Serve replica, consumer loop, KV store, fraud stage). The fraud stage reads its own KV rows
        (``fraud_blobs`` left empty), one round trip as when the stage is on.
        """
        with self.clock.section("anomaly.prepare"):
            batch = prepare_batch(frame, self.featurizer)
        n = len(batch)
        return _scored(source, frame, batch, np.full(n, np.nan, dtype=np.float64), np.zeros(n, dtype=bool),
                       produced_us, OFF_TAG)

    def _shadow_scores(self, work: AnomalyWork) -> np.ndarray:
        assert work.shadow is not None
        q = self._embed_with(work.shadow, work)
        scores = _gnn_scores(work, q, work.shadow, work.shadow_prev_cached)
        work.shadow_q = q.astype(np.float32)
        return scores


def _hin_states(states: dict[str, CardholderState], blobs: Sequence[bytes | None]) -> dict[str, HinState]:
    """Each cardholder's G-HIN2Vec view: its ego graph (the same object the stage updates) and its node table
    from the KV store (a corrupt table is logged and dropped: that cardholder embeds as no graph until its nodes
    are renewed, never a failed batch).
    """
    from fedfraud.training.embeddings.graph import HinState

    out: dict[str, HinState] = {}
    for (holder, state), blob in zip(states.items(), blobs, strict=True):
        hin = out[holder] = HinState(ego=state.ego)
        if blob:
            try:
                hin.load_info(blob)
            except ValueError as exc:
                log.warning("corrupt_hin2vec_nodes cardholder=%s reason=%s; dropped", holder, exc)
    return out


def _hin_graph(hin: HinState, h2v: Hin2VecModel | None) -> HinGraph | None:
    """The hetero ego graph of ``hin`` now; None without a merchant, or while a node lacks its category and L'
    (an ego graph older than its node table embeds as no graph: NaN columns, as on a first transaction).
    """
    assert h2v is not None
    if not hin.complete():
        return None
    cfg = h2v.cfg
    return hin.graph(cfg.merchant_buckets, cfg.cell_deg, cfg.cardholder_summary)


def _gnn_scores(work: AnomalyWork, q: np.ndarray, model: GraphScorer,
                cached: dict[int, np.ndarray] | None = None) -> np.ndarray:
    """AS of every row of ``work`` with a G_{t-1} and a G_t, from the embeddings ``q`` of ``work.graphs`` and
    ``model``'s cached q_{t-1} (``cached``; the champion's ``work.prev_cached`` by default).
    """
    cached = work.prev_cached if cached is None else cached
    scores = np.full(len(work.batch), np.nan, dtype=np.float64)
    rows = [i for i in range(len(scores))
            if work.cur_graph[i] >= 0 and (work.prev_graph[i] >= 0 or i in work.prev_cached)]
    if not rows:
        return scores
    q_prev = np.stack([q[work.prev_graph[i]] if work.prev_graph[i] >= 0 else cached[i] for i in rows])
    if model.uses_events:
        prior = np.stack([work.events[i][0] for i in rows])
        event = np.stack([work.events[i][1] for i in rows])
        scores[rows] = model.score_events(q_prev.astype(np.float32), prior, event)
    else:
        q_cur = q[[work.cur_graph[i] for i in rows]]
        scores[rows] = model.score(q_prev.astype(np.float32), q_cur.astype(np.float32))
    return scores


def _node_chunks(graphs: list[GraphView], budget: int) -> list[list[GraphView]]:
    """Consecutive runs of ``graphs`` of at most ``budget`` nodes each (≥ 1 graph per run): bounds the memory
    of one GNN forward on a large micro-batch.
    """
    chunks: list[list[GraphView]] = []
    size = budget + 1
    for g in graphs:
        n = max(1, int(g.num_nodes))
        if size + n > budget:
            chunks.append([])
            size = 0
        chunks[-1].append(g)
        size += n
    return chunks


def _scored(source: str, frame: pd.DataFrame, batch: PreparedBatch, scores: np.ndarray, redelivered: Any,
            produced_us: Any, model_tag: str, **extra: Any) -> ScoredBatch:
    """The stage's output for one prepared micro-batch: the private inputs the fraud stage reads, and the scores."""
    return ScoredBatch(
        source=source,
        transaction_id=frame["transaction_id"].astype(str).tolist(),
        cardholder=batch.cardholder,
        ts_us=batch.ts_us,
        amount=batch.amount,
        mcc=batch.mcc,
        merchant=batch.features.merchant,
        merchant_hash=np.asarray(batch.merchant_hash, dtype=np.uint64),
        location=batch.features.location,
        time=batch.features.time,
        anomaly_score=scores,
        redelivered=np.asarray(redelivered, dtype=bool),
        produced_us=np.asarray(produced_us, dtype=np.int64),
        anomaly_model=model_tag,
        scored_us=now_us(),
        **extra,
    )

"""The two scoring stages as plain classes: Ray Serve deployments wrap them, benchmarks and tests call them.

:class:`AnomalyStage` (per micro-batch, in event-time order)::

    read cardholder states (one batched Feast read) ──> apply each transaction
    ──> G_t per transaction (and G_{t-1} only when the cached q_{t-1} is stale)
    ──> q = embed(graphs) (the deployment batches this by node count)
    ──> AS = 1 − f(q_{t-1}, q_t) ──> score ring, push states (one batched write)

:class:`FraudStage`: fraud-feature state per cardholder + AS ──> XGBoost ──>
``anomaly-scores`` and ``fraud-decisions`` (score, decision, top reasons, both
model versions), sent together and flushed once per micro-batch. The scorer
replica, the busiest process, thus does no Kafka I/O and waits for no acks.

Both stages time their sections with :class:`fedfraud.serving.metrics.StageClock`
(``fedfraud bench serving`` prints them as the per-stage profile).

Idempotence (at-least-once delivery means redelivery): a transaction whose
noise key is already in the ego graph's ring of applied keys is *redelivered*;
it does not touch the graph again and gets the anomaly score it got the first
time from the score ring (written before the state push, so this holds after a
crash between the two). The fraud stage keeps the last decisions per
cardholder and re-emits a redelivered transaction's decision identically
(``redelivered: true``) instead of updating the fraud features twice.
Decisions are therefore *re-emitted, never suppressed*: a consumer sees every
transaction decided at least once, with identical content.

Cached q_{t-1}: the store's ``q_t`` is reused when this process wrote it with
the current model at the state's current version (:class:`_FreshCache`);
otherwise G_{t-1} is embedded again, so a model swap or another replica's
write never mixes embeddings of two models.
"""

from __future__ import annotations

import logging
import math
import struct
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd
import torch

from fedfraud.feature_store.cardholder import CardholderState, PreparedBatch, prepare_batch
from fedfraud.feature_store.events import history_summary
from fedfraud.feature_store.privacy import PrivateFeaturizer
from fedfraud.serving.kafka import confirm_sent, json_bytes, json_value, now_us
from fedfraud.serving.kvstore import KVStore
from fedfraud.serving.metrics import StageClock

if TYPE_CHECKING:
    from torch_geometric.data import Data

    from fedfraud.feature_store.online import OnlineStateClient
    from fedfraud.serving.kafka_producer import Producer
    from fedfraud.training.fraud.model import FraudModel
    from fedfraud.training.registry import ModelRegistry
    from fedfraud.training.retrain.drift import DriftMonitor

__all__ = [
    "AnomalyStage",
    "AnomalyWork",
    "FraudStage",
    "GraphScorer",
    "SIDE_ERRORS",
    "ScoredBatch",
    "fraud_config_for",
    "load_anomaly_scorer",
    "load_fraud_model",
    "pack_fraud_state",
    "unpack_fraud_state",
]

log = logging.getLogger(__name__)


class GraphScorer(Protocol):
    """What the anomaly stage needs from a model (``fedfraud.training.anomaly.scorer.AnomalyScorer``)."""

    tag: str

    def embed(self, graphs: Sequence[Data]) -> np.ndarray:
        """Q ``[n, k]`` of n graphs."""
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


class _ScorerAdapter:
    """Adapts the GNN colleague's scorer (tensors in/out) to :class:`GraphScorer` (numpy)."""

    def __init__(self, scorer: Any, tag: str) -> None:
        self.inner = scorer
        self.tag = tag

    def embed(self, graphs: Sequence[Data]) -> np.ndarray:
        import torch

        with torch.inference_mode():
            q = self.inner.embed(list(graphs))
        q = getattr(q, "q", q)
        return q.detach().cpu().numpy() if hasattr(q, "detach") else np.asarray(q)

    @property
    def uses_events(self) -> bool:
        return bool(getattr(self.inner, "uses_events", False))

    def score(self, q_prev: np.ndarray, q_cur: np.ndarray) -> np.ndarray:
        import torch

        with torch.inference_mode():
            out = self.inner.score(torch.from_numpy(q_prev), torch.from_numpy(q_cur))
        out = out.detach().cpu().numpy() if hasattr(out, "detach") else np.asarray(out)
        return out.astype(np.float64).reshape(-1)

    def score_events(self, q_prev: np.ndarray, prior: np.ndarray, event: np.ndarray) -> np.ndarray:
        import torch

        with torch.inference_mode():
            out = self.inner.score_events(torch.from_numpy(q_prev), prior, event)
        return np.asarray(out, dtype=np.float64).reshape(-1)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.tag})"


def load_anomaly_scorer(registry: ModelRegistry, version: str = "latest") -> GraphScorer:
    """The anomaly model of ``version`` from the registry, ready for inference (1 torch thread)."""
    import torch

    from fedfraud.training.anomaly.scorer import AnomalyScorer

    torch.set_num_threads(1)
    scorer = AnomalyScorer.from_registry(registry, version)
    return _ScorerAdapter(scorer, scorer.tag)


def load_fraud_model(registry: ModelRegistry, version: str = "latest") -> tuple[FraudModel, str]:
    """The fraud model of ``version`` and its registry tag."""
    from fedfraud.training.fraud.model import FraudModel

    found = registry.get("fraud", version)
    return FraudModel.from_registry(registry, str(found.version)), found.tag


# ---------------------------------------------------------------------- anomaly stage
@dataclass
class ScoredBatch:
    """What the anomaly stage hands the fraud stage: private per-transaction inputs + AS, in event-time order."""

    source: str
    transaction_id: list[str]
    cardholder: list[str]
    ts_us: list[int]
    amount: list[float]
    mcc: list[str]
    merchant: np.ndarray
    location: np.ndarray
    time: np.ndarray
    anomaly_score: np.ndarray
    redelivered: np.ndarray
    produced_us: np.ndarray
    anomaly_model: str
    scored_us: int = 0
    content: list[str] = field(default_factory=list)  # canonical-row hashes (serving.kafka.content_hashes); optional
    shadow_anomaly_score: np.ndarray | None = None  # the challenger GNN's AS while one shadows (NaN where none)
    shadow_anomaly_model: str = ""

    def __post_init__(self) -> None:
        n = len(self.transaction_id)
        for name in ("cardholder", "ts_us", "amount", "mcc", "merchant", "location", "time", "anomaly_score",
                     "redelivered", "produced_us"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"ScoredBatch.{name} has {len(getattr(self, name))} rows, expected {n}")

    def __len__(self) -> int:
        return len(self.transaction_id)


class _CachedFeatures:
    """A :class:`fedfraud.feature_store.egograph.FeatureSource` that remembers L'/T' rows by noise key.

    A node carries the noise key of the transaction that created it and an edge
    the key of the transaction that arrived, and L'/T' are pure functions of
    (values, key, ε), so each row is computed once (vectorised, in
    ``prepare_batch``) instead of once per graph snapshot it appears in. Misses
    (rows from before this process started) fall back to the featurizer.
    """

    def __init__(self, featurizer: PrivateFeaturizer, capacity: int = 100_000) -> None:
        self.encoder_cfg = featurizer.encoder_cfg
        self._featurizer = featurizer
        self.capacity = capacity
        self._loc: OrderedDict[tuple[int, float], np.ndarray] = OrderedDict()
        self._time: OrderedDict[tuple[int, float], np.ndarray] = OrderedDict()

    def seed(self, batch: PreparedBatch) -> None:
        """Remember the rows ``prepare_batch`` already computed."""
        f = batch.features
        for i, key in enumerate(batch.key):
            k = (key, float(f.epsilon[i]))
            self._loc[k] = f.location[i]
            self._time[k] = f.time[i]
        for table in (self._loc, self._time):
            while len(table) > self.capacity:
                table.popitem(last=False)

    def _rows(self, table: OrderedDict[tuple[int, float], np.ndarray], keys: np.ndarray, eps: np.ndarray | float,
              compute: Any) -> np.ndarray:
        if isinstance(eps, float):  # to_data's case: one budget per graph
            e = eps
        else:
            e = float(np.asarray(eps).reshape(-1)[0]) if np.ndim(eps) else float(eps)
            if np.ndim(eps) and not np.all(np.asarray(eps) == e):
                return compute(None)
        get = table.get
        hits = [get((k, e)) for k in keys.tolist()]  # tolist() already gives python ints
        miss = [i for i, h in enumerate(hits) if h is None]
        if miss:
            fresh = compute(np.asarray(miss, dtype=np.int64))
            for j, i in enumerate(miss):
                hits[i] = table[(int(keys[i]), e)] = fresh[j]
        return np.stack(hits) if hits else np.zeros((0, self.encoder_cfg.dim), dtype=np.float32)

    def location(self, lat: np.ndarray, lon: np.ndarray, keys: np.ndarray, eps: np.ndarray | float) -> np.ndarray:
        def compute(idx: np.ndarray | None) -> np.ndarray:
            sel = slice(None) if idx is None else idx
            e = eps if np.ndim(eps) == 0 else np.asarray(eps)[sel]
            return self._featurizer.location(lat[sel], lon[sel], keys[sel], e)

        return self._rows(self._loc, keys, eps, compute)

    def time(self, ts: np.ndarray, keys: np.ndarray, eps: np.ndarray | float) -> np.ndarray:
        def compute(idx: np.ndarray | None) -> np.ndarray:
            sel = slice(None) if idx is None else idx
            e = eps if np.ndim(eps) == 0 else np.asarray(eps)[sel]
            return self._featurizer.time(ts[sel], keys[sel], e)

        return self._rows(self._time, keys, eps, compute)


class _FreshCache:
    """cardholder → (state version, model tag) of the q_t this process wrote; bounded LRU."""

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self._d: OrderedDict[str, tuple[int, str]] = OrderedDict()

    def valid(self, holder: str, version: int, tag: str) -> bool:
        return self._d.get(holder) == (version, tag)

    def put(self, holder: str, version: int, tag: str) -> None:
        self._d[holder] = (version, tag)
        self._d.move_to_end(holder)
        if len(self._d) > self.capacity:
            self._d.popitem(last=False)


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
    graphs: list[Data] = field(default_factory=list)
    prev_graph: list[int] = field(default_factory=list)  # row → graph index of G_{t-1}, -1 none
    prev_cached: dict[int, np.ndarray] = field(default_factory=dict)  # row → cached q_{t-1}
    cur_graph: list[int] = field(default_factory=list)  # row → graph index of G_t, -1 if not applied
    redelivered: list[bool] = field(default_factory=list)
    last_graph: dict[str, int] = field(default_factory=dict)
    events: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # row → (prior, raw event)
    shadow: GraphScorer | None = None  # the challenger GNN, when one shadows (this batch's, fixed at begin)

    @property
    def holders(self) -> list[str]:
        return list(self.states)


#: Placeholder of a graph's history summary until :meth:`AnomalyStage._apply` summarises the batch's together.
_NO_SUMMARY = torch.zeros(1, 0)


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
    ) -> None:
        self.client = client
        self.featurizer = featurizer
        self.max_nodes = max_nodes
        self.kv = kv
        self.model = model
        self.bank_id = bank_id
        self.cell_deg = cell_deg
        self.ring = ring
        self.clock = clock or StageClock()
        self.fresh = _FreshCache()
        self.features = _CachedFeatures(featurizer)
        self.shadow: GraphScorer | None = None  # the challenger GNN while one shadows (HotPath sets it)

    def begin(self, frame: pd.DataFrame, produced_us: np.ndarray, source: str = "kafka") -> AnomalyWork:
        """Read states, apply every transaction, collect the graphs to embed (no model call yet)."""
        model = self.model  # one version per micro-batch, even if a swap lands meanwhile
        clock = self.clock
        with clock.section("anomaly.prepare"):
            batch = prepare_batch(frame, self.featurizer)
            self.features.seed(batch)
        holders = list(dict.fromkeys(batch.cardholder))
        with clock.section("anomaly.state_read"):
            states = dict(zip(holders, self.client.read_states(holders), strict=True))
            blobs = self.kv.get_many("scores", holders)
            rings = {h: (json_value(b) if b else []) for h, b in zip(holders, blobs, strict=True)}
        with clock.section("anomaly.graphs"):
            return self._apply(AnomalyWork(batch, frame, produced_us, source, model, states, rings,
                                           shadow=self.shadow))

    def _apply(self, work: AnomalyWork) -> AnomalyWork:
        """Fold each transaction into its state and collect G_t (and a stale G_{t-1}) to embed."""
        batch, model, states = work.batch, work.model, work.states
        source = self.features  # L'/T' rows by noise key (the featurizer on a miss)
        eps_all = batch.features.epsilon
        histories: list[np.ndarray] = []  # each graph's history, summarised together below

        def snapshot(ego: Any, eps: float) -> None:
            work.graphs.append(ego.to_data(source, eps, history=_NO_SUMMARY))
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
                elif work.shadow is None and state.q_t.size and self.fresh.valid(holder, state.version, model.tag):
                    # the stored q_{t-1} is the champion's; a shadowing challenger needs G_{t-1} itself
                    work.prev_cached[i] = state.q_t
                else:
                    snapshot(ego, eps)
                    prev = len(work.graphs) - 1
            applied = state.apply(batch, i, self.cell_deg)
            if applied:
                work.events[i] = (ego.prior, ego.last_event)  # type: ignore[assignment]
            work.redelivered.append(not applied)
            work.prev_graph.append(prev)
            snapshot(ego, eps)
            work.cur_graph.append(len(work.graphs) - 1)
            work.last_graph[holder] = len(work.graphs) - 1
        if histories:  # one vectorised call instead of one per graph
            rows = torch.from_numpy(history_summary(np.stack(histories)))
            for g, row in zip(work.graphs, rows, strict=True):
                g._store._mapping["history"] = row.reshape(1, -1)
        return work

    def complete(self, work: AnomalyWork, q: np.ndarray) -> ScoredBatch:
        """Score with the embeddings of ``work.graphs``, write rings and states (anomaly-scores: the fraud stage)."""
        batch, model = work.batch, work.model
        if q.shape[0] != len(work.graphs):
            raise ValueError(f"expected {len(work.graphs)} embeddings, got {q.shape[0]}")
        with self.clock.section("anomaly.gnn_score"):
            scores = _gnn_scores(work, q, model)
        with self.clock.section("anomaly.state_write"):
            self._write(work, q, scores)
        return ScoredBatch(
            source=work.source,
            transaction_id=work.frame["transaction_id"].astype(str).tolist(),
            cardholder=batch.cardholder,
            ts_us=batch.ts_us,
            amount=batch.amount,
            mcc=batch.mcc,
            merchant=batch.features.merchant,
            location=batch.features.location,
            time=batch.features.time,
            anomaly_score=scores,
            redelivered=np.asarray(work.redelivered, dtype=bool),
            produced_us=np.asarray(work.produced_us, dtype=np.int64),
            anomaly_model=model.tag,
            scored_us=now_us(),
        )

    def _write(self, work: AnomalyWork, q: np.ndarray, scores: np.ndarray) -> None:
        """Score ring first, then states and merchants in one push; fills redelivered rows' scores from the ring."""
        batch, model = work.batch, work.model
        changed: list[CardholderState] = []
        applied_rows: list[int] = []
        touched: set[str] = set()
        for i, holder in enumerate(batch.cardholder):
            ring = work.rings[holder]
            if work.redelivered[i]:
                for key, score, _tag in ring:
                    if key == batch.key[i]:
                        scores[i] = math.nan if score is None else score
                        break
                continue
            applied_rows.append(i)
            ring.append([batch.key[i], None if math.isnan(scores[i]) else float(scores[i]), model.tag])
            del ring[: max(len(ring) - self.ring, 0)]
            touched.add(holder)
        for holder, g in work.last_graph.items():
            state = work.states[holder]
            state.q_t = q[g].astype(np.float32)
            changed.append(state)
        # ring first: after a crash between the two writes, a redelivery still finds its score
        self.kv.put_many("scores", [(h, json_bytes(work.rings[h])) for h in touched])
        self.client.push(changed, self.bank_id, batch, applied_rows)
        for state in changed:
            self.fresh.put(state.cardholder, state.version, model.tag)

    def embed(self, work: AnomalyWork) -> np.ndarray:
        """Embeddings of ``work.graphs``: one GNN forward per run of at most ``max_nodes`` graph nodes."""
        if not work.graphs:
            return np.zeros((0, 0), dtype=np.float32)
        with self.clock.section("anomaly.gnn_embed"):
            parts = [work.model.embed(chunk) for chunk in _node_chunks(work.graphs, self.max_nodes)]
            return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def score(self, frame: pd.DataFrame, produced_us: np.ndarray, source: str = "kafka") -> ScoredBatch:
        """Begin → embed → complete: the whole anomaly stage of one micro-batch, in this process.

        While a challenger shadows, its GNN embeds the same graphs and scores the
        same rows (its AS rides along in the batch; states keep the champion's q).
        """
        work = self.begin(frame, produced_us, source)
        scored = self.complete(work, self.embed(work))
        if work.shadow is not None and work.graphs:
            with self.clock.section("shadow.anomaly"):  # never fails the batch (see _guarded)
                shadow = _guarded("shadow", lambda: self._shadow_scores(work))
            if shadow is not None:
                shadow[scored.redelivered] = np.nan
                scored.shadow_anomaly_score, scored.shadow_anomaly_model = shadow, work.shadow.tag
        return scored

    def _shadow_scores(self, work: AnomalyWork) -> np.ndarray:
        assert work.shadow is not None
        parts = [work.shadow.embed(chunk) for chunk in _node_chunks(work.graphs, self.max_nodes)]
        q_s = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return _gnn_scores(work, q_s, work.shadow)


#: Errors of the optional per-batch work (shadow scoring, drift), by kind; exported on /metrics.
SIDE_ERRORS: dict[str, int] = {"shadow": 0, "drift": 0}


def _guarded(kind: str, work: Any) -> Any:
    """Run optional per-batch work; on an error log it, count it and return None (the champion's path goes on)."""
    try:
        return work()
    except Exception:  # noqa: BLE001 - a challenger or a monitor must never stop the champion
        SIDE_ERRORS[kind] += 1
        log.exception("%s work failed for this micro-batch (%d so far); decisions are unaffected", kind,
                      SIDE_ERRORS[kind])
        return None


def _gnn_scores(work: AnomalyWork, q: np.ndarray, model: GraphScorer) -> np.ndarray:
    """AS of every row of ``work`` with a G_{t-1} and a G_t, from the embeddings ``q`` of ``work.graphs``."""
    scores = np.full(len(work.batch), np.nan, dtype=np.float64)
    rows = [i for i in range(len(scores))
            if work.cur_graph[i] >= 0 and (work.prev_graph[i] >= 0 or i in work.prev_cached)]
    if not rows:
        return scores
    q_prev = np.stack([q[work.prev_graph[i]] if work.prev_graph[i] >= 0 else work.prev_cached[i] for i in rows])
    if model.uses_events:
        prior = np.stack([work.events[i][0] for i in rows])
        event = np.stack([work.events[i][1] for i in rows])
        scores[rows] = model.score_events(q_prev.astype(np.float32), prior, event)
    else:
        q_cur = q[[work.cur_graph[i] for i in rows]]
        scores[rows] = model.score(q_prev.astype(np.float32), q_cur.astype(np.float32))
    return scores


def _node_chunks(graphs: list[Data], budget: int) -> list[list[Data]]:
    """Consecutive runs of ``graphs`` of at most ``budget`` nodes each (≥ 1 graph per run): bounds the memory
    of one GNN forward on a large micro-batch.
    """
    chunks: list[list[Data]] = []
    size = budget + 1
    for g in graphs:
        n = max(1, int(g.num_nodes))
        if size + n > budget:
            chunks.append([])
            size = 0
        chunks[-1].append(g)
        size += n
    return chunks


# ---------------------------------------------------------------------- fraud stage
_LEN = struct.Struct("<I")


def pack_fraud_state(state_bytes: bytes, ring: list[dict[str, Any]]) -> bytes:
    """One KV value per cardholder: its fraud-feature state and its ring of recent decisions."""
    return _LEN.pack(len(state_bytes)) + state_bytes + json_bytes(ring)


def unpack_fraud_state(blob: bytes) -> tuple[bytes, list[dict[str, Any]]]:
    (n,) = _LEN.unpack_from(blob)
    return blob[_LEN.size : _LEN.size + n], json_value(blob[_LEN.size + n :])


class FraudStage:
    """Fraud features + XGBoost decision per transaction (one instance per fraud replica).

    With a producer it also emits the batch's ``anomaly-scores`` (``scores_topic``)
    next to the decisions (``topic``) and flushes both once: the gateway commits
    after :meth:`decide` returns, so both topics are covered by at-least-once.
    """

    def __init__(
        self,
        kv: KVStore,
        model: FraudModel,
        model_tag: str,
        fraud_cfg: Any,
        dim: int,
        ring: int,
        top_k: int = 3,
        producer: Producer | None = None,
        topic: str | None = None,
        scores_topic: str | None = None,
        clock: StageClock | None = None,
    ) -> None:
        self.kv = kv
        self.model = model
        self.model_tag = model_tag
        self.fraud_cfg = fraud_cfg
        self.dim = dim
        self.ring = ring
        self.top_k = top_k
        self.producer = producer
        self.topic = topic
        self.scores_topic = scores_topic
        self.clock = clock or StageClock()
        self.check_layout(model)
        self.shadow: tuple[FraudModel, str] | None = None  # the challenger fraud model while one shadows
        self.shadow_topic: str | None = None
        self.shadow_scored = 0  # transactions the challenger scored (for /metrics)
        self.shadow_agreed = 0  # ... of which its decision equalled the champion's
        self.drift: DriftMonitor | None = None  # PSI of inputs and score vs the champion's training reference

    def check_layout(self, model: FraudModel) -> None:
        """Raise unless ``model`` reads the feature row this stage builds."""
        from fedfraud.training.fraud.features import feature_names

        names = feature_names(self.fraud_cfg)
        if tuple(model.input_names) != tuple(names):
            raise ValueError(
                f"fraud model expects features {list(model.input_names)}, the serving config gives {list(names)}"
            )

    def swap(self, model: FraudModel, tag: str) -> None:
        """Use ``model`` from the next micro-batch on (callers swap between batches)."""
        self.check_layout(model)
        self.model, self.model_tag = model, tag

    def set_shadow(self, shadow: tuple[FraudModel, str] | None) -> None:
        """Score every fresh transaction with this challenger too (None stops shadowing); it never decides."""
        if shadow is not None:
            self.check_layout(shadow[0])
        self.shadow = shadow
        self.shadow_scored = self.shadow_agreed = 0  # the counters are per challenger

    def decide(self, scored: ScoredBatch, sends: list[Any] | None = None) -> list[dict[str, Any]]:
        """Decision records of ``scored`` (in its order), emitted with the scores.

        Without ``sends`` the records are acknowledged by the broker before
        this returns; with it the send futures are appended to ``sends`` for
        the caller to confirm before it commits (the consumer's async acks).
        """
        from fedfraud.training.fraud.features import FraudInput

        model, tag, clock = self.model, self.model_tag, self.clock
        with clock.section("fraud.state_read"):
            states, rings = self._read(list(dict.fromkeys(scored.cardholder)))
        with clock.section("fraud.features"):
            records: list[dict[str, Any] | None] = [None] * len(scored)
            fresh_rows: list[int] = []
            features: list[np.ndarray] = []
            for i, tx in enumerate(scored.transaction_id):
                holder = scored.cardholder[i]
                previous = next((r for r in rings[holder] if r["transaction_id"] == tx), None)
                if previous is not None:
                    content = scored.content[i] if scored.content else None
                    if content is not None and previous.get("content", content) != content:
                        records[i] = {"transaction_id": tx, "cardholder": holder, "decision": "rejected",
                                      "reject_reason": "conflicting_duplicate"}
                    else:
                        records[i] = {**previous, "redelivered": True}
                    continue
                features.append(
                    states[holder].update(
                        FraudInput(
                            ts_us=scored.ts_us[i],
                            amount=scored.amount[i],
                            mcc=scored.mcc[i],
                            merchant=int(scored.merchant[i]),
                            location=scored.location[i],
                            time=scored.time[i],
                            anomaly_score=float(scored.anomaly_score[i]),
                        )
                    )
                )
                fresh_rows.append(i)
        shadow_out: list[dict[str, Any]] = []
        if fresh_rows:
            X = np.stack(features)
            with clock.section("fraud.model"):
                decisions = model.predict_batch(X, top_k=self.top_k)
            with clock.section("fraud.records"):
                self._records(scored, fresh_rows, decisions, tag, rings, records)
            # monitoring and shadowing never fail a decision: an error costs this batch's figures, not its records
            if self.drift is not None:
                with clock.section("fraud.drift"):
                    _guarded("drift", lambda: self.drift.observe(np.column_stack([X, [d.score for d in decisions]])))
            if self.shadow is not None:
                with clock.section("shadow.fraud"):
                    shadow_out = _guarded("shadow", lambda: self._shadow_records(scored, fresh_rows, X, decisions,
                                                                                   tag)) or []
        with clock.section("fraud.state_write"):
            touched = {scored.cardholder[i] for i in fresh_rows}
            self.kv.put_many("fraud", [(h, pack_fraud_state(states[h].to_bytes(), rings[h])) for h in touched])
        decided = now_us()
        out = [{**_public(r), "decided_us": decided} for r in records if r is not None]
        futures = self._emit(scored, out, shadow_out)
        if sends is None:
            with self.clock.section("kafka.flush"):
                if futures:
                    confirm_sent(self.producer, futures)
        else:
            sends += futures
        return out

    def _shadow_records(self, scored: ScoredBatch, rows: list[int], X: np.ndarray, decisions: Sequence[Any],
                        tag: str) -> list[dict[str, Any]]:
        """The challenger's score of each fresh row, with the champion's beside it (``shadow-scores`` records).

        The feature row is the champion's with the challenger's anomaly score in
        the last column (the AS is the only model-made input).
        """
        assert self.shadow is not None
        challenger, c_tag = self.shadow
        as_rows = scored.shadow_anomaly_score if scored.shadow_anomaly_score is not None else scored.anomaly_score
        a_tag = scored.shadow_anomaly_model or scored.anomaly_model
        Xs = X.copy()
        Xs[:, -1] = np.asarray(as_rows, dtype=np.float32)[rows]
        c_scores = challenger.scores(Xs)
        out = []
        for k, i in enumerate(rows):
            c_fraud = bool(c_scores[k] >= challenger.threshold)
            self.shadow_agreed += int(c_fraud == bool(decisions[k].decision))
            out.append({
                "transaction_id": scored.transaction_id[i], "cardholder": scored.cardholder[i],
                "champion": {"fraud_model": tag, "anomaly_model": scored.anomaly_model,
                             "score": float(decisions[k].score), "anomaly_score": _finite(scored.anomaly_score[i])},
                "challenger": {"fraud_model": c_tag, "anomaly_model": a_tag, "score": float(c_scores[k]),
                               "anomaly_score": _finite(float(Xs[k, -1])), "decision": "fraud" if c_fraud else "legit"},
                "scored_us": now_us(),
            })
        self.shadow_scored += len(out)
        return out

    def _read(self, holders: list[str]) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
        """Fraud-feature states and decision rings of ``holders`` (one batched read; corrupt → empty)."""
        from fedfraud.training.fraud.features import CorruptFraudStateError, FraudFeatureState

        states: dict[str, FraudFeatureState] = {}
        rings: dict[str, list[dict[str, Any]]] = {}
        for holder, blob in zip(holders, self.kv.get_many("fraud", holders), strict=True):
            state, ring = FraudFeatureState(self.fraud_cfg, self.dim), []
            if blob:
                raw, ring = unpack_fraud_state(blob)
                try:
                    state = FraudFeatureState.from_bytes(raw, self.fraud_cfg, self.dim)
                except CorruptFraudStateError as exc:
                    log.warning("corrupt_fraud_state cardholder=%s reason=%s; rebuilt empty", holder, exc)
            states[holder], rings[holder] = state, ring
        return states, rings

    def _records(self, scored: ScoredBatch, rows: list[int], decisions: Sequence[Any], tag: str,
                 rings: dict[str, list[dict[str, Any]]], records: list[dict[str, Any] | None]) -> None:
        """Decision records of the fresh ``rows`` into ``records``, remembered in the cardholders' rings."""
        for i, d in zip(rows, decisions, strict=True):
            a_s = float(scored.anomaly_score[i])
            record = {
                "transaction_id": scored.transaction_id[i],
                "cardholder": scored.cardholder[i],
                "score": d.score,
                "decision": "fraud" if d.decision else "legit",
                "anomaly_score": None if math.isnan(a_s) else a_s,
                "top_reasons": [
                    {"feature": r.feature, "value": _finite(r.value), "contribution": r.contribution}
                    for r in d.top_reasons
                ],
                "models": {"anomaly": scored.anomaly_model, "fraud": tag},
                "produced_us": int(scored.produced_us[i]),
                "redelivered": False,
            }
            ring = rings[scored.cardholder[i]]
            ring.append({**record, "content": scored.content[i]} if scored.content else record)
            del ring[: max(len(ring) - self.ring, 0)]
            records[i] = record

    def _emit(self, scored: ScoredBatch, records: list[dict[str, Any]],
              shadow: Sequence[dict[str, Any]] = ()) -> list[Any]:
        """Send the batch's anomaly scores, decisions and shadow scores; returns the send futures.

        At-least-once: the input offsets are committed only after every one of
        these futures is acknowledged (:func:`fedfraud.serving.kafka.confirm_sent`, or the
        consumer's :class:`fedfraud.serving.acks.AckWindow`; a ``flush``
        alone does not report failed sends). Rejected rows (``decision:
        rejected``) are the caller's to dead-letter, not decisions.
        """
        if self.producer is None or not len(scored):
            return []
        send = self.producer.send
        futures: list[Any] = []
        rejected = {i for i, r in enumerate(records) if r["decision"] == "rejected"}  # records align with rows
        with self.clock.section("kafka.produce"):
            if self.scores_topic is not None:
                for i, tx in enumerate(scored.transaction_id):
                    if i in rejected:
                        continue
                    value = {
                        "transaction_id": tx,
                        "cardholder": scored.cardholder[i],
                        "anomaly_score": float(scored.anomaly_score[i]),
                        "model": scored.anomaly_model,
                        "redelivered": bool(scored.redelivered[i]),
                        "scored_us": scored.scored_us,
                    }
                    futures.append(send(self.scores_topic, key=scored.cardholder[i].encode(), value=json_bytes(value)))
            if self.topic is not None:
                for r in records:
                    if r["decision"] != "rejected":
                        futures.append(send(self.topic, key=r["cardholder"].encode(), value=json_bytes(r)))
            if self.shadow_topic is not None:
                for r in shadow:
                    futures.append(send(self.shadow_topic, key=r["cardholder"].encode(), value=json_bytes(r)))
        return futures


def _public(record: dict[str, Any]) -> dict[str, Any]:
    """A ring entry without its private bookkeeping (the content hash stays in the bank's state)."""
    return {k: v for k, v in record.items() if k != "content"} if "content" in record else record


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def fraud_config_for(version_config: dict[str, Any], fallback: Any) -> Any:
    """The FraudConfig the model was trained with (its registry config), else ``fallback``."""
    from pydantic import ValidationError

    from fedfraud.training.fraud.config import FraudConfig

    for candidate in (version_config.get("fraud"), version_config):
        if isinstance(candidate, dict):
            try:
                return FraudConfig.model_validate(
                    {k: v for k, v in candidate.items() if k in FraudConfig.model_fields}
                )
            except ValidationError:
                continue
    return fallback if fallback is not None else FraudConfig()


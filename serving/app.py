"""Ray Serve application: Kafka ingress + HTTP gateway, anomaly scorer, fraud decider.

Built by :func:`build_app` from typed :class:`ScoringArgs` (STYLE §7), which
``infra/serve_config.yaml`` references by ``import_path`` so ``serve run`` /
``serve deploy`` work too. Handles go into constructors::

    Gateway(FastAPI: /score /healthz /metrics, Kafka consumer thread)
      ├── AnomalyScorer  (Feast states, GNN embed via @serve.batch sized by nodes; no Kafka I/O)
      └── FraudDecider   (fraud features + XGBoost; produces anomaly-scores + decisions, one flush)

The consumer thread processes micro-batches in partition order and pipelines
three steps: while the fraud decision of batch k runs, batch k+1 is scored,
and while batch k+1 is scored, batch k+2 is polled and decoded. Batch k+1's
anomaly call starts only after batch k's returned, so a cardholder's
transactions are applied in order. Offsets of batch k are committed only after
its decisions (and its dead letters) were produced and flushed: at-least-once.
A failed stage call (a replica died) is retried with the same batch; the
stages are idempotent per transaction (see :mod:`serving.pipeline`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import Body, FastAPI, HTTPException, Response
from pydantic import BaseModel, ConfigDict, Field
from ray import serve
from ray.serve import Application
from ray.serve.handle import DeploymentHandle

from serving.kafka import DecodedBatch, decode_messages, dlq_value, json_bytes, now_us
from serving.metrics import CONTENT_TYPE, PipelineMetrics, StageClock

__all__ = ["AnomalyScorer", "FraudDecider", "Gateway", "ScoringArgs", "build_app"]

log = logging.getLogger(__name__)
APP_NAME = "fedfraud"


class ScoringArgs(BaseModel):
    """Arguments of the scoring application (``import_path: serving.app:build_app``).

    ``config`` is a :class:`fedfraud.config.FedfraudConfig` as a dict (its
    ``serving`` section holds Kafka, registry and batching settings), so a
    replica on another node rebuilds exactly the driver's configuration.
    """

    model_config = ConfigDict(extra="forbid")

    config: dict[str, Any] = Field(default_factory=dict, description="FedfraudConfig as a dict")
    bootstrap_servers: str = Field(..., description="Kafka bootstrap servers (embedded broker or cluster)")
    consume: bool = Field(True, description="run the Kafka consumer loop (off: HTTP only)")
    pipeline_depth: int = Field(1, ge=0, le=1, description="1: fraud(k) ‖ anomaly(k+1) ‖ decode(k+2); 0: serial")
    anomaly_loader: str = Field(
        "serving.pipeline:load_anomaly_scorer",
        description="module:function(registry, version) -> GraphScorer; the seam where the anomaly model plugs in",
    )


def _config(args: ScoringArgs) -> Any:
    from fedfraud.config import FedfraudConfig

    return FedfraudConfig.model_validate(args.config)


def _replica_setup(raw: dict[str, Any]) -> tuple[ScoringArgs, Any, Any]:
    """Validated args, the typed config and the model registry: what every model-serving replica starts from."""
    from training.registry import ModelRegistry

    args = ScoringArgs.model_validate(raw)
    cfg = _config(args)
    return args, cfg, ModelRegistry(cfg.serving.registry_root)


async def _watch_registry(
    poll_s: Callable[[], float], kind: str, registry: Any, current: Callable[[], str], load: Callable[[str], Any],
    swap: Callable[[Any], None],
) -> None:
    """Poll the registry and swap in a newer version (publish is an atomic rename: a listed version is complete)."""
    while True:
        await asyncio.sleep(poll_s())
        try:
            latest = registry.latest(kind)
            if latest is None or latest.tag == current():
                continue
            if int(current().rsplit(":v", 1)[-1]) >= latest.version:
                continue
            loaded = await asyncio.to_thread(load, str(latest.version))
            swap(loaded)  # one reference assignment; the next micro-batch uses it
            log.info("hot_swap kind=%s from=%s to=%s", kind, current(), latest.tag)
        except Exception:  # keep serving the old version if a new one cannot be read
            log.exception("reload of %s failed; keeping %s", kind, current())


def _tune_gc(threshold: int) -> None:
    """Freeze start-up objects out of the GC's reach and collect generation 0 less often (see ``gc_threshold``)."""
    import gc

    if threshold <= 0:
        return
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(threshold, gen1, gen2)


def _resolve(path: str) -> Callable[..., Any]:
    """``module:function`` → the function (one place where loader names resolve)."""
    import importlib

    module, _, name = path.partition(":")
    if not module or not name:
        raise ValueError(f"loader {path!r} must look like module:function")
    return getattr(importlib.import_module(module), name)


def _node_count(items: Sequence[tuple[Any, list[Any]]]) -> int:
    """@serve.batch size of (model, graphs) items: their total node count (≥ 1 per graph)."""
    return sum(max(1, int(g.num_nodes)) for _, graphs in items for g in graphs)


def _node_chunks(graphs: list[Any], budget: int) -> list[list[Any]]:
    """Consecutive runs of ``graphs`` of at most ``budget`` nodes each (≥ 1 graph per run).

    @serve.batch rejects an item larger than ``max_batch_size``; a full
    micro-batch (500 transactions of ~20-node graphs) is larger than the
    default 8,192-node budget, and without splitting the gateway retried it forever.
    """
    chunks: list[list[Any]] = []
    size = budget + 1
    for g in graphs:
        n = max(1, int(g.num_nodes))
        if size + n > budget:
            chunks.append([])
            size = 0
        chunks[-1].append(g)
        size += n
    return chunks


class _Busy:
    """Per-cardholder exclusion: concurrent requests touching the same cardholder run one after the other."""

    def __init__(self) -> None:
        self._busy: set[str] = set()
        self._cond = asyncio.Condition()

    async def acquire(self, keys: set[str]) -> None:
        async with self._cond:
            await self._cond.wait_for(lambda: self._busy.isdisjoint(keys))
            self._busy |= keys

    async def release(self, keys: set[str]) -> None:
        async with self._cond:
            self._busy -= keys
            self._cond.notify_all()


@serve.deployment(ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=8, health_check_period_s=5)
class AnomalyScorer:
    """Reads/updates ego states in Feast (batched) and scores transitions with the registry's GNN."""

    def __init__(self, args: dict[str, Any]) -> None:
        from feature_store.online import OnlineStateClient
        from feature_store.privacy import PrivateFeaturizer
        from serving.kvstore import open_kv
        from serving.pipeline import AnomalyStage

        self.args, cfg, self.registry = _replica_setup(args)
        s = cfg.serving
        self.serving = s
        loader = _resolve(self.args.anomaly_loader)
        self._load = lambda v: loader(self.registry, v)
        client = OnlineStateClient.open(cfg.features, cfg.egograph)
        featurizer = PrivateFeaturizer.for_bank(cfg.encoder, cfg.privacy, s.bank_id)
        from pathlib import Path

        kv = open_kv(s.fraud_state_path, Path(cfg.features.repo_dir))
        # no Kafka I/O here: the fraud decider emits anomaly-scores with the decisions (one flush per batch)
        self.stage = AnomalyStage(
            client, featurizer, kv, self._load(s.anomaly_version), s.bank_id, cfg.features.location_cell_deg,
            cfg.egograph.dedupe_ring,
        )
        self.poll_s = s.registry_poll_s
        self._busy = _Busy()
        self._watcher: asyncio.Task[None] | None = None
        self.reconfigure({})
        _tune_gc(s.gc_threshold)
        log.info("anomaly scorer ready model=%s", self.stage.model.tag)

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Runtime knobs: ``max_nodes_per_batch``, ``batch_wait_timeout_s``, ``registry_poll_s``."""
        self.max_nodes = int(user_config.get("max_nodes_per_batch", self.serving.max_nodes_per_batch))
        self._embed.set_max_batch_size(self.max_nodes)
        self._embed.set_batch_wait_timeout_s(
            float(user_config.get("batch_wait_timeout_s", self.serving.batch_wait_timeout_s))
        )
        self.poll_s = float(user_config.get("registry_poll_s", self.poll_s))

    def _ensure_watcher(self) -> None:
        if self._watcher is None and self.serving.anomaly_version == "latest":
            self._watcher = asyncio.get_running_loop().create_task(
                _watch_registry(lambda: self.poll_s, "anomaly", self.registry, lambda: self.stage.model.tag,
                                self._load, lambda m: setattr(self.stage, "model", m))
            )

    @serve.batch(max_batch_size=8192, batch_wait_timeout_s=0.002, batch_size_fn=_node_count)
    async def _embed(self, items: list[tuple[Any, list[Any]]]) -> list[np.ndarray]:
        """One GNN forward per model over the graphs of concurrent requests, batched up to a node budget.

        An item is one request's graph list (a micro-batch from Kafka or one
        POST /score), so the per-graph cost of the batching queue is paid once
        per request, not once per graph.
        """
        out: list[np.ndarray | None] = [None] * len(items)
        by_model: dict[int, list[int]] = {}
        for i, (model, _) in enumerate(items):
            by_model.setdefault(id(model), []).append(i)
        for idx in by_model.values():
            graphs = [g for i in idx for g in items[i][1]]
            with self.stage.clock.section("anomaly.gnn_embed"):
                q = items[idx[0]][0].embed(graphs)
            start = 0
            for i in idx:
                n = len(items[i][1])
                out[i] = q[start : start + n]
                start += n
        return out  # type: ignore[return-value]

    async def score(self, frame: Any, produced_us: np.ndarray, source: str = "kafka") -> Any:
        """Anomaly scores of a validated, event-time-ordered micro-batch (a :class:`ScoredBatch`)."""
        self._ensure_watcher()
        keys = set(frame["cardholder_id"].astype(str))
        await self._busy.acquire(keys)
        try:
            work = self.stage.begin(frame, produced_us, source)
            if work.graphs:
                parts = await asyncio.gather(
                    *(self._embed((work.model, chunk)) for chunk in _node_chunks(work.graphs, self.max_nodes))
                )
                q = np.concatenate(parts)
            else:
                q = np.zeros((0, 0), dtype=np.float32)
            return self.stage.complete(work, q)
        finally:
            await self._busy.release(keys)

    def model_tag(self) -> str:
        return self.stage.model.tag

    def profile(self, reset: bool = False) -> dict[str, dict[str, float]]:
        """CPU/wall seconds per section of this replica's stage (:class:`serving.pipeline.StageClock`)."""
        return self.stage.clock.snapshot(reset)


@serve.deployment(ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=8, health_check_period_s=5)
class FraudDecider:
    """Fraud features + AS → XGBoost decision with reasons; emits to ``fraud-decisions``."""

    def __init__(self, args: dict[str, Any]) -> None:
        from pathlib import Path

        from serving.kafka import make_producer
        from serving.kvstore import open_kv
        from serving.pipeline import FraudStage, fraud_config_for, load_fraud_model

        self.args, cfg, self.registry = _replica_setup(args)
        s = cfg.serving
        self.serving = s
        model, tag = load_fraud_model(self.registry, s.fraud_version)
        trained = self.registry.get("fraud", tag.rsplit(":v", 1)[-1]).config
        fraud_cfg = fraud_config_for(trained, getattr(cfg, "fraud", None))
        kv = open_kv(s.fraud_state_path, Path(cfg.features.repo_dir))
        producer = make_producer(self.args.bootstrap_servers, s.producer, client_id="fedfraud-fraud")
        top_k = getattr(fraud_cfg, "top_reasons", 3)
        self.stage = FraudStage(kv, model, tag, fraud_cfg, cfg.encoder.dim, s.decision_ring, top_k, producer,
                                s.topics.decisions, s.topics.anomaly_scores)
        self.poll_s = s.registry_poll_s
        self._watcher: asyncio.Task[None] | None = None
        _tune_gc(s.gc_threshold)
        log.info("fraud decider ready model=%s", tag)

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Runtime knobs: ``registry_poll_s``, ``top_reasons``."""
        self.poll_s = float(user_config.get("registry_poll_s", self.poll_s))
        self.stage.top_k = int(user_config.get("top_reasons", self.stage.top_k))

    def _ensure_watcher(self) -> None:
        if self._watcher is None and self.serving.fraud_version == "latest":
            from serving.pipeline import load_fraud_model

            self._watcher = asyncio.get_running_loop().create_task(
                _watch_registry(lambda: self.poll_s, "fraud", self.registry, lambda: self.stage.model_tag,
                                lambda v: load_fraud_model(self.registry, v), lambda mt: self.stage.swap(*mt))
            )

    async def decide(self, scored: Any) -> list[dict[str, Any]]:
        """Decision records of a :class:`ScoredBatch`, produced and flushed (with its anomaly scores) before
        returning.
        """
        self._ensure_watcher()
        return self.stage.decide(scored)

    def profile(self, reset: bool = False) -> dict[str, dict[str, float]]:
        """CPU/wall seconds per section of this replica's stage (:class:`serving.pipeline.StageClock`)."""
        return self.stage.clock.snapshot(reset)


@dataclass
class _InFlight:
    """A micro-batch from poll to commit: its anomaly call, then its scores and fraud call."""

    offsets: dict[Any, int]
    decoded: DecodedBatch
    started: float
    anomaly: Any = None  # scorer response, submitted, not yet taken
    submitted: float = 0.0
    scored: Any = None
    response: Any = None  # fraud response


@dataclass(frozen=True)
class _HttpMessage:
    """An HTTP record in the shape :func:`serving.kafka.decode_messages` reads."""

    value: bytes
    offset: int
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp: int = 0
    topic: str = "http"
    partition: int = -1


api = FastAPI(title="fedfraud scoring")


@serve.deployment(ray_actor_options={"num_cpus": 0.25}, health_check_period_s=5)
@serve.ingress(api)
class Gateway:
    """Kafka consumer loop + HTTP endpoints; owns the delivery counters."""

    def __init__(self, scorer: DeploymentHandle, fraud: DeploymentHandle, args: dict[str, Any]) -> None:
        self.args = ScoringArgs.model_validate(args)
        cfg = _config(self.args)
        self.serving = cfg.serving
        self.scorer = scorer
        self.fraud = fraud
        self.metrics = PipelineMetrics()
        self.clock = StageClock()
        self.max_poll_records = self.serving.consumer.max_poll_records
        self.depth = self.args.pipeline_depth
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        _tune_gc(self.serving.gc_threshold)
        if self.args.consume:
            self._thread = threading.Thread(target=self._run, name="fedfraud-consumer", daemon=True)
            self._thread.start()

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Runtime knobs: ``max_poll_records`` (micro-batch bound), ``pipeline_depth`` (0 or 1)."""
        self.max_poll_records = int(user_config.get("max_poll_records", self.max_poll_records))
        self.depth = int(user_config.get("pipeline_depth", self.depth))

    def check_health(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"consumer loop failed: {self._error!r}")

    def __del__(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # ------------------------------------------------------------------ Kafka loop
    def _run(self) -> None:
        try:
            self._consume()
        except BaseException as exc:  # surfaced by check_health → Serve restarts the replica
            log.exception("consumer loop failed")
            self._error = exc

    def _retry(self, submit: Callable[[], Any], stage: str) -> Any:
        """Run a stage call until it succeeds; idempotent stages make a retry after a crash safe."""
        delay = 0.2
        while True:
            try:
                response = submit()
                deadline = time.monotonic() + self.serving.stage_timeout_s
                while True:  # wait in slices so a shutdown is not held up by a dead stage
                    try:
                        return response.result(timeout_s=1.0)
                    except TimeoutError:
                        if self._stop.is_set() or time.monotonic() > deadline:
                            raise
            except Exception as exc:
                if self._stop.is_set():
                    raise
                self.metrics.retries.labels(stage=stage).inc()
                log.warning("stage=%s failed (%s); retrying the same micro-batch in %.1fs", stage,
                            exc.__class__.__name__, delay)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _consume(self) -> None:
        from kafka import TopicPartition

        from feature_store.schema import Validator
        from serving.kafka import make_consumer, make_producer

        s = self.serving
        consumer = make_consumer(self.args.bootstrap_servers, s.consumer, s.topics.transactions)
        producer = make_producer(self.args.bootstrap_servers, s.producer, client_id="fedfraud-dlq")
        validator = Validator(dedupe=False)  # redelivery is handled idempotently downstream
        scoring: _InFlight | None = None  # anomaly call in flight (overlaps decoding the next batch)
        prev: _InFlight | None = None  # fraud call in flight (overlaps scoring the next batch)
        last_lag = 0.0
        log.info("consumer started topic=%s group=%s assignment=%s", s.topics.transactions, s.consumer.group_id,
                 s.consumer.assignment)
        try:
            while not self._stop.is_set():
                busy = scoring is not None or prev is not None
                with self.clock.section("gateway.poll"):
                    polled = consumer.poll(timeout_ms=5 if busy else 100, max_records=self.max_poll_records)
                msgs = [m for part in polled.values() for m in part]
                if not msgs:
                    if scoring is not None:
                        prev, scoring = self._advance(consumer, producer, scoring, prev), None
                    elif prev is not None:
                        self._finish(consumer, producer, prev)
                        prev = None
                    if time.monotonic() - last_lag > 1.0:
                        self._update_lag(consumer)
                        last_lag = time.monotonic()
                    continue
                t0 = time.perf_counter()
                self.metrics.consumed.inc(len(msgs))
                self.metrics.inflight.inc(len(msgs))
                self.metrics.batch_size.observe(len(msgs))
                offsets: dict[Any, int] = {}
                with self.clock.section("gateway.decode"):
                    for m in msgs:
                        tp = TopicPartition(m.topic, m.partition)
                        offsets[tp] = max(offsets.get(tp, -1), m.offset + 1)
                    decoded = decode_messages(msgs, validator)
                    for dead in decoded.dead:
                        headers = [("reason", dead.reason.encode()), ("detail", dead.detail.encode()[:256])]
                        producer.send(s.topics.dlq, key=dead.key, value=dlq_value(dead), headers=headers)
                self.metrics.stage.labels(stage="decode").observe(time.perf_counter() - t0)
                if scoring is not None:  # batch k+1 is scored only after batch k: per-cardholder order
                    prev, scoring = self._advance(consumer, producer, scoring, prev), None
                current = self._submit_anomaly(_InFlight(offsets, decoded, t0))
                if self.depth == 0:
                    self._finish(consumer, producer, self._advance(consumer, producer, current, prev))
                    prev = None
                else:
                    scoring = current
            if scoring is not None:
                prev = self._advance(consumer, producer, scoring, prev)
            if prev is not None:
                self._finish(consumer, producer, prev)
        finally:
            producer.flush()
            producer.close()
            consumer.close()
            log.info("consumer stopped")

    def _submit_anomaly(self, item: _InFlight) -> _InFlight:
        """Start the anomaly call of ``item`` (none for a batch of only dead letters)."""
        if len(item.decoded.frame):
            item.submitted = time.perf_counter()
            item.anomaly = self.scorer.score.remote(item.decoded.frame, item.decoded.produced_us, "kafka")
        return item

    def _advance(self, consumer: Any, producer: Any, item: _InFlight, prev: _InFlight | None) -> _InFlight:
        """Take ``item``'s anomaly scores (retrying a failed call), finish ``prev``, start ``item``'s fraud call."""
        if item.anomaly is not None:
            first, d = [item.anomaly], item.decoded
            item.scored = self._retry(
                lambda: first.pop() if first else self.scorer.score.remote(d.frame, d.produced_us, "kafka"), "anomaly"
            )
            self.metrics.stage.labels(stage="anomaly").observe(time.perf_counter() - item.submitted)
            self.metrics.set_model("anomaly", item.scored.anomaly_model)
        if prev is not None:
            self._finish(consumer, producer, prev)
        item.response = self.fraud.decide.remote(item.scored) if item.scored is not None else None
        return item

    def _finish(self, consumer: Any, producer: Any, item: _InFlight) -> None:
        """Wait for the decisions, flush dead letters, then commit: the at-least-once point."""
        from kafka.errors import CommitFailedError
        from kafka.structs import OffsetAndMetadata

        records: list[dict[str, Any]] = []
        if item.scored is not None:
            t2 = time.perf_counter()
            first = [item.response]

            def submit() -> Any:
                resp = first.pop() if first else self.fraud.decide.remote(item.scored)
                return resp

            records = self._retry(submit, "fraud")
            self.metrics.stage.labels(stage="fraud").observe(time.perf_counter() - t2)
        with self.clock.section("gateway.commit"):
            if item.decoded.dead:
                producer.flush()
            try:
                consumer.commit({tp: OffsetAndMetadata(off, "", -1) for tp, off in item.offsets.items()})
            except CommitFailedError as exc:  # lost the partitions in a rebalance: the new owner redelivers
                log.warning("commit failed after rebalance (%s); messages will be redelivered", exc)
        self._account(records, item.decoded)

    def _account(self, records: list[dict[str, Any]], decoded: DecodedBatch) -> None:
        m = self.metrics
        for dead in decoded.dead:
            m.dead.labels(reason=dead.reason).inc()
        m.decided.inc(len(records))
        m.inflight.dec(decoded.n_input)
        redelivered = 0
        for r in records:
            m.e2e.observe(max(r["decided_us"] - r["produced_us"], 0) / 1e6)
            redelivered += bool(r.get("redelivered"))
        m.redelivered.inc(redelivered)
        if records:
            m.set_model("fraud", records[-1]["models"]["fraud"])

    def _update_lag(self, consumer: Any) -> None:
        try:
            parts = consumer.assignment()
            if not parts:
                return
            ends = consumer.end_offsets(list(parts))
            self.metrics.lag.set(sum(max(ends[tp] - consumer.position(tp), 0) for tp in parts))
        except Exception:  # lag is best-effort observability
            log.debug("lag update failed", exc_info=True)

    # ------------------------------------------------------------------ HTTP
    @api.post("/score")
    async def score(self, payload: Any = Body(...)) -> dict[str, Any]:
        """One transaction (JSON object) or a batch (JSON array) → decision records, synchronously."""
        items = payload if isinstance(payload, list) else [payload]
        if not items:
            raise HTTPException(422, "empty batch")
        stamp = str(now_us()).encode()
        msgs = [
            _HttpMessage(value=json_bytes(item) if isinstance(item, dict) else b"<not an object>", offset=i,
                         headers=(("produced-us", stamp),))
            for i, item in enumerate(items)
        ]
        from feature_store.schema import Validator

        decoded = decode_messages(msgs, Validator(dedupe=False))
        records: list[dict[str, Any]] = []
        if len(decoded.frame):
            scored = await self.scorer.score.remote(decoded.frame, decoded.produced_us, "http")
            records = await self.fraud.decide.remote(scored)
            self.metrics.http_scored.inc(len(records))
        rejected = [{"index": d.offset, "reason": d.reason, "detail": d.detail} for d in decoded.dead]
        return {"decisions": records, "rejected": rejected}

    @api.get("/healthz")
    async def healthz(self) -> dict[str, Any]:
        """Liveness plus the delivery counters and model versions."""
        alive = self._thread is None or (self._thread.is_alive() and self._error is None)
        if not alive:
            raise HTTPException(503, f"consumer loop not running: {self._error!r}")
        return {"status": "ok", "consuming": self._thread is not None, **self.metrics.snapshot()}

    @api.get("/metrics")
    async def metrics_text(self) -> Response:
        """Prometheus text format."""
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    def snapshot(self) -> dict[str, Any]:
        """Delivery counters for programmatic callers (handles)."""
        return self.metrics.snapshot()

    async def profile(self, reset: bool = False) -> dict[str, dict[str, dict[str, float]]]:
        """Per-section CPU/wall seconds of the gateway and (one replica of) each stage; ``reset`` zeroes them."""
        scorer, fraud = self.scorer.profile.remote(reset), self.fraud.profile.remote(reset)
        return {"gateway": self.clock.snapshot(reset), "scorer": await scorer, "fraud": await fraud}


def build_app(args: ScoringArgs | dict[str, Any]) -> Application:
    """Typed builder (STYLE §7): gateway bound to scorer and fraud handles, replicas from the serving config."""
    if isinstance(args, dict):  # ``serve run`` passes the YAML args as a dict
        args = ScoringArgs.model_validate(args)
    cfg = _config(args)
    s = cfg.serving
    from training.registry import ModelRegistry

    registry = ModelRegistry(s.registry_root)
    registry.get("anomaly", s.anomaly_version)  # fail fast, one line, if nothing is registered
    registry.get("fraud", s.fraud_version)
    dumped = args.model_dump()
    scorer = AnomalyScorer.options(num_replicas=s.scorer_replicas).bind(dumped)
    fraud = FraudDecider.options(num_replicas=s.fraud_replicas).bind(dumped)
    return Gateway.bind(scorer, fraud, dumped)


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
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from fastapi import Depends, FastAPI, HTTPException, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from ray import serve
from ray.serve import Application
from ray.serve.handle import DeploymentHandle

from serving.kafka import DecodedBatch, decode_messages, dlq_headers, dlq_value, json_bytes, now_us
from serving.metrics import CONTENT_TYPE, PipelineMetrics, StageClock
from serving.poison import Outage

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

    def ready(self) -> bool:
        """One read of both state stores (Feast online store, scores KV); raises when either is unreachable."""
        self.stage.client.read_states(["__readyz__"])
        self.stage.kv.get_many("scores", ["__readyz__"])
        return True

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
    dlq: list[Any] = field(default_factory=list)  # send futures of the decode stage's dead letters
    anomaly: Any = None  # scorer response, submitted, not yet taken
    submitted: float = 0.0
    scored: Any = None
    response: Any = None  # fraud response
    failed: bool = False  # a stage ran out of attempts: bisect at finish


class _StageFailed(RuntimeError):
    """A stage call failed ``stage_max_attempts`` times in a row."""


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


#: Bodies longer than this are refused before they are read, whatever the config says (the config's
#: ``http_max_body_bytes``, checked in the endpoint, may only be smaller).
_HARD_BODY_CAP = 64 << 20


async def _capped_body(request: Request) -> bytes:
    """The raw body, read in chunks and refused with 413 as soon as it passes the hard cap."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > _HARD_BODY_CAP:
        raise HTTPException(413, f"body over {_HARD_BODY_CAP} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > _HARD_BODY_CAP:
            raise HTTPException(413, f"body over {_HARD_BODY_CAP} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _json(body: dict[str, Any], status_code: int = 200) -> Response:
    """A JSON response through :func:`serving.kafka.json_bytes` (numpy scalars, NaN as null), like the topics."""
    return Response(json_bytes(body), status_code=status_code, media_type="application/json")


@serve.deployment(ray_actor_options={"num_cpus": 0.25}, health_check_period_s=5)
@serve.ingress(api)
class Gateway:
    """Kafka consumer loop + HTTP endpoints; owns the delivery counters."""

    def __init__(self, scorer: DeploymentHandle, fraud: DeploymentHandle, args: dict[str, Any]) -> None:
        from feature_store.schema import Validator

        self.args = ScoringArgs.model_validate(args)
        cfg = _config(self.args)
        self.serving = cfg.serving
        self.guards = cfg.serving.guards
        self.scorer = scorer
        self.fraud = fraud
        self.metrics = PipelineMetrics()
        self.clock = StageClock()
        self.max_poll_records = self.serving.consumer.max_poll_records
        self.depth = self.args.pipeline_depth
        g = self.guards
        self.validator = Validator(dedupe=False, max_future_s=g.max_future_s, max_age_days=g.max_age_days)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._retrying_since: float | None = None  # monotonic start of the current run of failed tries
        self._progress = time.monotonic()  # last commit (or start)
        self._lag = 0
        self._inflight = 0  # consumed, not yet committed
        self._broker_error: str | None = None
        self._producer: Any = None
        _tune_gc(self.serving.gc_threshold)
        if self.args.consume:
            self._thread = threading.Thread(target=self._run, name="fedfraud-consumer", daemon=True)
            self._thread.start()

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Runtime knobs: ``max_poll_records`` (micro-batch bound), ``pipeline_depth`` (0 or 1)."""
        self.max_poll_records = int(user_config.get("max_poll_records", self.max_poll_records))
        self.depth = int(user_config.get("pipeline_depth", self.depth))

    def problems(self) -> list[str]:
        """Why this replica is not healthy right now (empty: healthy); the one source of /healthz and Serve."""
        out: list[str] = []
        if self._thread is None:
            return out
        now = time.monotonic()
        if self._error is not None or not self._thread.is_alive():
            out.append(f"consumer loop not running: {self._error!r}")
        if self._retrying_since is not None and now - self._retrying_since > self.guards.retry_budget_s:
            out.append(f"a micro-batch has been retrying for {now - self._retrying_since:.0f}s")
        if (self._lag > 0 or self._inflight > 0) and now - self._progress > self.guards.stall_s:
            idle = now - self._progress
            out.append(f"stalled: lag {self._lag}, {self._inflight} in flight, no commit for {idle:.0f}s")
        if self._broker_error is not None:
            out.append(f"broker unreachable: {self._broker_error}")
        return out

    def check_health(self) -> None:
        problems = self.problems()
        if problems:
            raise RuntimeError("; ".join(problems))

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
        """Run a stage call up to ``stage_max_attempts`` times with backoff; :class:`_StageFailed` after.

        Idempotent stages make a retry after a crash safe. The attempts are
        bounded so a poison record cannot hold the partition forever: the
        caller then bisects the batch (:meth:`_bisect`).
        """
        delay = self.guards.retry_backoff_s
        for attempt in range(1, self.guards.stage_max_attempts + 1):
            try:
                result = self._wait(submit())
                self._retrying_since = None
                return result
            except Exception as exc:
                if self._stop.is_set():
                    raise
                if self._retrying_since is None:
                    self._retrying_since = time.monotonic()
                self.metrics.retries.labels(stage=stage).inc()
                log.warning("stage=%s attempt %d/%d failed (%s: %s)", stage, attempt, self.guards.stage_max_attempts,
                            exc.__class__.__name__, str(exc)[:200])
                if attempt == self.guards.stage_max_attempts:
                    raise _StageFailed(stage) from exc
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
        raise AssertionError("unreachable")

    def _wait(self, response: Any) -> Any:
        """A handle response's result, in slices so a shutdown is not held up by a dead stage."""
        deadline = time.monotonic() + self.serving.stage_timeout_s
        while True:
            try:
                return response.result(timeout_s=1.0)
            except TimeoutError:
                if self._stop.is_set() or time.monotonic() > deadline:
                    raise

    def _consume(self) -> None:
        from kafka import TopicPartition

        from serving.kafka import make_consumer, make_producer

        s = self.serving
        consumer = make_consumer(self.args.bootstrap_servers, s.consumer, s.topics.transactions)
        producer = self._producer = make_producer(self.args.bootstrap_servers, s.producer, client_id="fedfraud-dlq")
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
                if time.monotonic() - last_lag > 1.0:
                    self._update_lag(consumer)
                    last_lag = time.monotonic()
                if not msgs:
                    if scoring is not None:
                        prev, scoring = self._advance(consumer, producer, scoring, prev), None
                    elif prev is not None:
                        self._finish(consumer, producer, prev)
                        prev = None
                    else:
                        self._progress = time.monotonic()  # idle with nothing in flight is not a stall
                    continue
                t0 = time.perf_counter()
                self.metrics.consumed.inc(len(msgs))
                self._inflight += len(msgs)
                self.metrics.inflight.inc(len(msgs))
                self.metrics.batch_size.observe(len(msgs))
                offsets: dict[Any, int] = {}
                with self.clock.section("gateway.decode"):
                    for m in msgs:
                        tp = TopicPartition(m.topic, m.partition)
                        offsets[tp] = max(offsets.get(tp, -1), m.offset + 1)
                    decoded = decode_messages(msgs, self.validator, self.guards.max_message_bytes)
                    dlq = [self._dead_letter(producer, dead) for dead in decoded.dead]
                self.metrics.stage.labels(stage="decode").observe(time.perf_counter() - t0)
                if scoring is not None:  # batch k+1 is scored only after batch k: per-cardholder order
                    prev, scoring = self._advance(consumer, producer, scoring, prev), None
                current = self._submit_anomaly(_InFlight(offsets, decoded, t0, dlq))
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
            try:
                producer.flush(timeout=5)
            finally:
                producer.close(timeout=5)
                consumer.close()
                log.info("consumer stopped")

    def _dead_letter(self, producer: Any, dead: Any) -> Any:
        """Send one dead letter (payload capped); returns the send future, checked before the commit."""
        value = dlq_value(dead, self.guards.dlq_payload_bytes)
        return producer.send(self.serving.topics.dlq, key=dead.key, value=value, headers=dlq_headers(dead))

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
            try:
                item.scored = self._retry(
                    lambda: first.pop() if first else self.scorer.score.remote(d.frame, d.produced_us, "kafka"),
                    "anomaly",
                )
                item.scored.content = d.content
                self.metrics.stage.labels(stage="anomaly").observe(time.perf_counter() - item.submitted)
                self.metrics.set_model("anomaly", item.scored.anomaly_model)
            except _StageFailed:
                item.failed = True
        if prev is not None:
            self._finish(consumer, producer, prev)
        item.response = self.fraud.decide.remote(item.scored) if item.scored is not None else None
        return item

    def _finish(self, consumer: Any, producer: Any, item: _InFlight) -> None:
        """Wait for the decisions, send copies and dead letters, confirm every send, then commit.

        The commit is the at-least-once point: it happens only after the
        broker acknowledged every decision, copy and dead letter of the batch.
        """
        from kafka.errors import KafkaError
        from kafka.structs import OffsetAndMetadata

        from serving.kafka import confirm_sent

        records: list[dict[str, Any]] = []
        d = item.decoded
        if item.scored is not None and not item.failed:
            t2 = time.perf_counter()
            first = [item.response]
            try:
                records = self._retry(lambda: first.pop() if first else self.fraud.decide.remote(item.scored), "fraud")
            except _StageFailed:
                item.failed = True
            self.metrics.stage.labels(stage="fraud").observe(time.perf_counter() - t2)
        delay = self.guards.retry_backoff_s
        while item.failed:
            try:
                records = self._bisect(d)
                break
            except Outage as exc:  # nothing is dead-lettered in an outage; health turns red after the budget
                if self._stop.is_set():
                    raise
                log.warning("outage while scoring (%s); retrying in %.1fs", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        futures = list(item.dlq)
        dead_reasons = [dead.reason for dead in d.dead]
        with self.clock.section("gateway.commit"):
            futures += self._rejects_and_copies(producer, d, records, dead_reasons)
            if futures:
                confirm_sent(producer, futures)  # DeliveryError: the loop stops uncommitted; Serve restarts it
            try:
                consumer.commit({tp: OffsetAndMetadata(off, "", -1) for tp, off in item.offsets.items()})
            except KafkaError as exc:  # lost the partitions in a rebalance: the new owner redelivers
                log.warning("commit failed (%s); the batch will be redelivered and re-emitted as redelivered", exc)
        self._progress = time.monotonic()
        self._account(records, d, dead_reasons)

    def _rejects_and_copies(self, producer: Any, d: DecodedBatch, records: list[dict[str, Any]],
                            dead_reasons: list[str]) -> list[Any]:
        """Dead-letter rows the stages rejected, emit in-batch copies; return the send futures."""
        from serving.kafka import DeadLetter

        futures: list[Any] = []

        def dead_letter(msg: Any, reason: str, detail: str) -> None:
            dead = DeadLetter(msg.key, msg.value, reason, detail, msg.topic, msg.partition, msg.offset)
            futures.append(self._dead_letter(producer, dead))
            dead_reasons.append(reason)

        for i, r in enumerate(records):
            if r["decision"] == "rejected":
                dead_letter(d.sources[i], r["reject_reason"], r.get("detail", "rejected by the scoring stages"))
        for msg, row in d.copies:
            r = records[row]
            if r["decision"] == "rejected":
                dead_letter(msg, r["reject_reason"], "copy of a rejected transaction in the same batch")
            else:
                copy = {**r, "redelivered": True}
                futures.append(producer.send(self.serving.topics.decisions, key=r["cardholder"].encode(),
                                             value=json_bytes(copy)))
                records.append(copy)
        return futures

    def _bisect(self, d: DecodedBatch) -> list[dict[str, Any]]:
        """Score ``d`` in halves, serially, until the records that fail alone are found (:mod:`serving.poison`).

        Returns one record per frame row, in frame order: a decision, or a
        ``rejected`` record with reason ``processing_error`` for a row that
        failed on its own. Raises :class:`serving.poison.Outage` when no record
        is to blame, so nothing is dead-lettered in an outage.
        """
        from serving.poison import isolate_failures

        if not len(d.frame):
            return []
        out: dict[int, dict[str, Any]] = {}

        def run(rows: list[int]) -> None:
            piece = d.frame.iloc[rows].reset_index(drop=True)
            scored = self._wait(self.scorer.score.remote(piece, d.produced_us[rows], "kafka"))
            scored.content = [d.content[i] for i in rows] if d.content else []
            out.update(zip(rows, self._wait(self.fraud.decide.remote(scored)), strict=True))

        log.warning("bisecting a micro-batch of %d rows to find the records that fail", len(d.frame))
        errors = isolate_failures(range(len(d.frame)), run)
        for i, why in errors.items():
            out[i] = {"transaction_id": str(d.frame["transaction_id"].iloc[i]), "decision": "rejected",
                      "reject_reason": "processing_error", "detail": why}
        self._retrying_since = None
        return [out[i] for i in range(len(d.frame))]

    def _account(self, records: list[dict[str, Any]], decoded: DecodedBatch, dead_reasons: list[str]) -> None:
        m = self.metrics
        for reason in dead_reasons:
            m.dead.labels(reason=reason).inc()
        decided = [r for r in records if r["decision"] != "rejected"]
        m.decided.inc(len(decided))
        m.inflight.dec(decoded.n_input)
        self._inflight -= decoded.n_input
        redelivered = 0
        for r in decided:
            m.e2e.observe(max(r["decided_us"] - r["produced_us"], 0) / 1e6)
            redelivered += bool(r.get("redelivered"))
        m.redelivered.inc(redelivered)
        if decided:
            m.set_model("fraud", decided[-1]["models"]["fraud"])

    def _update_lag(self, consumer: Any) -> None:
        try:
            parts = consumer.assignment()
            if not parts:
                return
            ends = consumer.end_offsets(list(parts))
            self._lag = sum(max(ends[tp] - consumer.position(tp), 0) for tp in parts)
            self.metrics.lag.set(self._lag)
            self._broker_error = None
        except Exception as exc:  # the broker did not answer: health says so
            self._broker_error = f"{exc.__class__.__name__}: {str(exc)[:200]}"
            log.warning("broker unreachable: %s", self._broker_error)

    # ------------------------------------------------------------------ HTTP
    @api.post("/score")
    async def score(self, body: bytes = Depends(_capped_body)) -> Response:
        """One transaction (JSON object) or a batch (JSON array) → decision records, synchronously.

        Bad input never yields a 500: a body over ``http_max_body_bytes`` or a
        batch over ``http_max_batch`` is 413; a body that is not JSON (or uses
        NaN/Infinity) is 422; a single transaction that fails validation is 422
        with its reason; in a batch, rejected items are listed with their index
        and reason next to the decisions of the others.
        """
        from serving.kafka import parse_json

        g = self.guards
        if len(body) > g.http_max_body_bytes:
            raise HTTPException(413, f"body over {g.http_max_body_bytes} bytes")
        try:
            payload = parse_json(body)
        except Exception as exc:  # noqa: BLE001 - any parse failure is the client's
            raise HTTPException(422, f"body is not JSON: {exc.__class__.__name__}") from None
        single = not isinstance(payload, list)
        items = [payload] if single else payload
        if not items:
            raise HTTPException(422, "empty batch")
        if len(items) > g.http_max_batch:
            raise HTTPException(413, f"batch of {len(items)} transactions, at most {g.http_max_batch}")
        stamp = str(now_us()).encode()
        msgs = [
            _HttpMessage(value=json_bytes(item) if isinstance(item, dict) else b"<not an object>", offset=i,
                         headers=(("produced-us", stamp),))
            for i, item in enumerate(items)
        ]
        decoded = decode_messages(msgs, self.validator, g.http_max_body_bytes)
        rejected = [{"index": d.offset, "reason": d.reason, "detail": d.detail} for d in decoded.dead]
        records: list[dict[str, Any]] = []
        if len(decoded.frame):
            scored = await self.scorer.score.remote(decoded.frame, decoded.produced_us, "http")
            scored.content = decoded.content
            out = await self.fraud.decide.remote(scored)
            for i, r in enumerate(out):
                if r["decision"] == "rejected":
                    rejected.append({"index": decoded.sources[i].offset, "reason": r["reject_reason"],
                                     "detail": "transaction_id reused with different content"})
                else:
                    records.append(r)
            by_row = dict(enumerate(out))
            for _msg, row in decoded.copies:
                if by_row[row]["decision"] != "rejected":
                    records.append({**by_row[row], "redelivered": True})
            self.metrics.http_scored.inc(len(records))
        if single and rejected:
            raise HTTPException(422, rejected[0])
        return _json({"decisions": records, "rejected": sorted(rejected, key=lambda r: r["index"])})

    @api.get("/healthz")
    async def healthz(self) -> Response:
        """Liveness: 503 when the consumer loop died, stalled, retries past its budget or lost the broker."""
        problems = self.problems()
        body = {"status": "unhealthy" if problems else "ok", "problems": problems,
                "consuming": self._thread is not None, **self.metrics.snapshot()}
        return _json(body, 503 if problems else 200)

    @api.get("/readyz")
    async def readyz(self) -> Response:
        """Readiness: liveness plus a round trip to the state stores (Feast online store and the decision KV)."""
        problems = self.problems()
        try:
            await asyncio.wait_for(self.scorer.ready.remote(), timeout=5.0)
        except Exception as exc:  # noqa: BLE001 - any failure means not ready
            problems.append(f"state store unreachable: {exc.__class__.__name__}: {str(exc)[:200]}")
        if self._thread is not None and self._producer is None:
            problems.append("consumer not connected to the broker yet")
        return _json({"status": "not ready" if problems else "ready", "problems": problems}, 503 if problems else 200)

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


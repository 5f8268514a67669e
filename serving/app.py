"""Ray Serve application: one deployment, ``StreamScorer``, whose replicas each consume and score in-process.

Built by :func:`build_app` from typed :class:`ScoringArgs` (STYLE §7), which
``infra/serve_config.yaml`` references by ``import_path`` so ``serve run`` /
``serve deploy`` work too. The builder validates the whole config once and
binds the deployment only its own typed slice, :class:`fedfraud.serving.config.ScorerConfig`::

    StreamScorer replica (FastAPI: /score /healthz /readyz /metrics; bearer token on /score and /metrics)
      ├── StreamConsumer thread  (fedfraud.serving.consumer: one member of the Kafka consumer group)
      └── HotPath                (fedfraud.serving.hotpath: anomaly + fraud stages in this process, no actor hops)

Throughput scales with partitions: each replica is one consumer in the group
``serving.consumer.group_id``, so ``serving.scorer_replicas`` replicas share
the partitions of ``transactions`` (at most one replica per partition does
work) and a dead replica's partitions move to the survivors. Ray Serve is the
process manager (restarts, health checks, placement on a Ray cluster) and the
HTTP face; ``POST /score`` runs the same in-process path as the stream.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from ray import serve
from ray.serve import Application

from fedfraud.serving.auth import BearerAuth, api_token, require_bearer
from fedfraud.serving.config import ScorerConfig
from fedfraud.serving.http_body import read_capped_body
from fedfraud.serving.grpc_bind import confine_replica_grpc
from fedfraud.serving.kafka import decode_messages, ingress_validator, json_bytes, now_us
from fedfraud.serving.metrics import CONTENT_TYPE, DurableCounters, MetricsBoard, PipelineMetrics

__all__ = ["ScoringArgs", "StreamScorer", "build_app"]

log = logging.getLogger(__name__)
APP_NAME = "fedfraud"
#: The environment variable a Ray worker reads its niceness from when it starts (``ray_constants``; Ray's job
#: supervisor sets it to 0 for itself the same way).
RAY_WORKER_NICENESS = "RAY_worker_niceness"


class ScoringArgs(BaseModel):
    """Arguments of the scoring application (``import_path: fedfraud.serving.app:build_app``).

    ``config`` is a :class:`fedfraud.config.FedfraudConfig` as a dict (its
    ``serving`` section holds Kafka, registry and batching settings); the
    builder validates it and hands each replica its :class:`ScorerConfig`
    sections, from which a replica on another node rebuilds exactly the
    driver's configuration.
    """

    model_config = ConfigDict(extra="forbid")

    config: dict[str, Any] = Field(default_factory=dict, description="FedfraudConfig as a dict")
    bootstrap_servers: str = Field(..., description="Kafka bootstrap servers (embedded broker or cluster)")
    consume: bool = Field(True, description="run the Kafka consumer loop (off: HTTP only)")
    anomaly_loader: str = Field(
        "fedfraud.serving.anomaly_stage:load_anomaly_scorer",
        description="module:function(registry, version) -> GraphScorer; the seam where the anomaly model plugs in",
    )


def _replica_id() -> str:
    """Serve's id of this replica (a uuid outside Serve): the ``replica`` label of its metrics."""
    import uuid

    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # noqa: BLE001 - not inside a Serve replica
        return uuid.uuid4().hex[:12]


def _config(args: ScoringArgs) -> Any:
    """The whole config, validated where the app is built (the entry point, like the CLI)."""
    from fedfraud.config import FedfraudConfig

    return FedfraudConfig.model_validate(args.config)


class _ReplicaArgs(BaseModel):
    """What :func:`build_app` binds to each :class:`StreamScorer` replica: its own sections, not the whole config."""

    model_config = ConfigDict(extra="forbid")

    config: ScorerConfig
    bootstrap_servers: str
    consume: bool
    anomaly_loader: str


def _tune_gc(threshold: int) -> None:
    """Freeze start-up objects out of the GC's reach and collect generation 0 less often (see ``gc_threshold``)."""
    import gc

    if threshold <= 0:
        return
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(threshold, gen1, gen2)
    gc.callbacks.append(_log_long_collections)


_GC_STARTED: list[float] = [0.0]


def _log_long_collections(phase: str, info: dict[str, int]) -> None:
    """Log a collection that stops the scoring thread for more than 20 ms (it shows up as a latency spike)."""
    if phase == "start":
        _GC_STARTED[0] = time.perf_counter()
        return
    ms = (time.perf_counter() - _GC_STARTED[0]) * 1e3
    if ms > 20.0:
        log.warning("gc pause %.0f ms generation=%d collected=%d", ms, info.get("generation", -1),
                       info.get("collected", 0))


@dataclass(frozen=True)
class _HttpMessage:
    """An HTTP record in the shape :func:`fedfraud.serving.kafka.decode_messages` reads."""

    value: bytes
    offset: int
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp: int = 0
    topic: str = "http"
    partition: int = -1


api = FastAPI(title="fedfraud scoring")


async def _capped_body(request: Request) -> bytes:
    """The raw body, refused with 413 past the replica's ``serving.guards.http_max_body_bytes`` before a byte beyond
    it is read (the configured cap first: the 64 MiB hard cap only bounds the config).
    """
    return await read_capped_body(request, serve.get_replica_context().servable_object.guards.http_max_body_bytes)


def _item_bytes(item: Any) -> bytes:
    """One batch item as the bytes a Kafka message would carry; a non-object or a non-finite number (``1e400``
    parses to inf) becomes a value decoding rejects as ``malformed``.
    """
    if not isinstance(item, dict):
        return b"<not an object>"
    try:
        return json_bytes(item)
    except ValueError:
        return b"<an object with a non-finite number>"


def thread_niceness() -> list[int]:
    """The distinct niceness values of this process's threads (Linux ``/proc``; else the calling thread's)."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return [os.getpriority(os.PRIO_PROCESS, 0)]
    values = set()
    for task in tasks.iterdir():
        try:  # field 19 of stat, the 17th after the ")" that ends the thread's name
            values.add(int((task / "stat").read_text().rsplit(")", 1)[1].split()[16]))
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            continue
    return sorted(values)


def _json(body: dict[str, Any], status_code: int = 200) -> Response:
    """A JSON response through :func:`fedfraud.serving.kafka.json_bytes` (numpy scalars, NaN as null)."""
    return Response(json_bytes(body), status_code=status_code, media_type="application/json")


async def _detail_requested(request: Request) -> bool:
    """Whether a probe asked for its detailed view (``?detail=true``); that view needs the bearer token (401/403
    otherwise), since it shows reasons, counters and model tags the open probes do not.

    A dependency at module level, not a ``request: Request`` parameter of the endpoint: Serve ships the ingress
    class by value, and a method's string annotation ``"Request"`` does not resolve there (422).
    """
    if request.query_params.get("detail", "").lower() not in ("1", "true", "yes"):
        return False
    await require_bearer(request)
    return True


@serve.deployment(ray_actor_options={"num_cpus": 0.5}, health_check_period_s=5, max_ongoing_requests=16)
@serve.ingress(api)
class StreamScorer:
    """Kafka consumer + in-process scoring + HTTP endpoints of one replica; owns its delivery counters."""

    def __init__(self, args: dict[str, Any]) -> None:
        from fedfraud.serving.consumer import StreamConsumer
        from fedfraud.serving.hotpath import HotPath

        confine_replica_grpc()  # before Serve opens this replica's gRPC server on [::] (serving/grpc_bind.py)
        self.args = _ReplicaArgs.model_validate(args)
        cfg = self.args.config
        self.bearer = BearerAuth.from_settings(cfg.serving.auth)  # before anything else: no token, no replica
        self.serving = cfg.serving
        self.guards = cfg.serving.guards
        self.metrics = PipelineMetrics()
        self.hot = HotPath(cfg, self.args.bootstrap_servers, self.args.anomaly_loader)
        self.hot.watch_registry(self.serving.registry_poll_s)
        self.validator = ingress_validator(self.guards)
        self.consumer: StreamConsumer | None = None
        self.durable = DurableCounters(self.hot.anomaly.kv, self.serving.consumer.group_id, _replica_id())
        self.board = MetricsBoard(self.hot.anomaly.kv, self.serving.consumer.group_id, _replica_id(),
                                  self.metrics.render).start()
        _tune_gc(self.serving.gc_threshold)
        if self.args.consume:
            self.consumer = StreamConsumer(self.serving, self.args.bootstrap_servers, self.hot.score, self.metrics,
                                           self.hot.clock, self.durable, cfg.egograph.dedupe_ring).start()
        for kind, tag in self.hot.models().items():
            self.metrics.set_model(kind, tag)
        self.metrics.watch_loop(self.hot.loop_figures)

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Runtime knobs: ``max_poll_records`` (N) and ``max_batch_wait_ms`` (T) of the micro-batch."""
        if self.consumer is not None:
            self.consumer.max_records = int(user_config.get("max_poll_records", self.consumer.max_records))
            self.consumer.max_wait_ms = int(user_config.get("max_batch_wait_ms", self.consumer.max_wait_ms))

    def problems(self) -> list[str]:
        """Why this replica is unhealthy (empty: healthy); the one source of /healthz and Serve's check."""
        return self.consumer.problems() if self.consumer is not None else []

    def check_health(self) -> None:
        problems = self.problems()
        if problems:
            raise RuntimeError("; ".join(problems))

    def __del__(self) -> None:
        if getattr(self, "board", None) is not None:
            self.board.stop()
        if getattr(self, "consumer", None) is not None:
            self.consumer.stop()
        if getattr(self, "hot", None) is not None:
            self.hot.close()

    # ------------------------------------------------------------------ HTTP
    @api.post("/score", dependencies=[Depends(require_bearer)])
    async def score(self, body: bytes = Depends(_capped_body)) -> Response:
        """One transaction (JSON object) or a batch (JSON array) → decision records, synchronously.

        Needs ``Authorization: Bearer <token>`` (401 without, 403 with a wrong
        one; checked before the body is read). Bad input never yields a 500: a
        body over ``http_max_body_bytes`` or a batch over ``http_max_batch`` is
        413; a body that is not JSON (or uses NaN/Infinity) is 422; a single
        transaction that fails validation is 422 with its reason; in a batch,
        rejected items are listed with their index and reason next to the
        decisions of the others.
        """
        with self.hot.clock.section("http.score"):  # the handler's wall time; the Serve proxy's hop is outside it
            return await self._score(body)

    async def _score(self, body: bytes) -> Response:
        from fedfraud.serving.kafka import parse_json

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
        msgs = [_HttpMessage(value=_item_bytes(item), offset=i, headers=(("produced-us", stamp),))
                for i, item in enumerate(items)]
        decoded = decode_messages(msgs, self.validator, g.http_max_body_bytes)
        rejected = [{"index": d.offset, "reason": d.reason, "detail": d.detail} for d in decoded.dead]
        records: list[dict[str, Any]] = []
        if len(decoded.frame):
            out = await asyncio.to_thread(self.hot.score, decoded.frame, decoded.produced_us, decoded.content, "http")
            for i, r in enumerate(out):
                if r["decision"] == "rejected":
                    rejected.append({"index": decoded.sources[i].offset, "reason": r["reject_reason"],
                                     "detail": "transaction_id reused with different content"})
                else:
                    records.append(r)
            by_row = dict(enumerate(out))
            for msg, row in decoded.copies:
                if by_row[row]["decision"] != "rejected":
                    records.append({**by_row[row], "redelivered": True})
                else:
                    rejected.append({"index": msg.offset, "reason": by_row[row]["reject_reason"],
                                     "detail": "copy of a rejected transaction in the same batch"})
            self.metrics.http_scored.inc(len(records))
        if single and rejected:
            raise HTTPException(422, rejected[0])
        return _json({"decisions": records, "rejected": sorted(rejected, key=lambda r: r["index"])})

    @api.get("/healthz")
    async def healthz(self, detail: bool = Depends(_detail_requested)) -> Response:
        """Liveness: 503 when the consumer loop died, stalled, retries past its budget or lost the broker.

        Open (the kubelet has no token), so it answers only ``{"status": "ok" | "unhealthy"}`` and touches no
        store: anyone may call it as often as they like, and a write would take the scoring state's write lock
        on SQLite. ``?detail=true`` with the bearer token adds the reasons, the delivery counters (read, never
        saved here) and the model tags.
        """
        problems = self.problems()
        status, code = ("unhealthy", 503) if problems else ("ok", 200)
        if not detail:
            return _json({"status": status}, code)
        counters = await asyncio.to_thread(self._health_detail)
        return _json({"status": status, "problems": problems, "consuming": self.consumer is not None, **counters},
                     code)

    def _health_detail(self) -> dict[str, Any]:
        """What :meth:`snapshot` shows, without saving this replica's counters first (a probe never writes)."""
        local = self.metrics.snapshot()
        return {**local, **self.durable.totals(), "replica": local}

    @api.get("/readyz")
    async def readyz(self, detail: bool = Depends(_detail_requested)) -> Response:
        """Readiness: liveness plus a round trip to the state stores (Feast online store and the decision KV).

        Open like ``/healthz``: only ``{"status": "ready" | "not ready"}``; the reasons (a store's error text
        names hosts) are logged, and shown with ``?detail=true`` and the bearer token.
        """
        problems = self.problems()
        try:
            await asyncio.wait_for(asyncio.to_thread(self.hot.ready), timeout=5.0)
        except Exception as exc:  # noqa: BLE001 - any failure means not ready
            problems.append(f"state store unreachable: {exc.__class__.__name__}: {str(exc)[:200]}")
            log.warning("readyz: %s", problems[-1])
        if self.consumer is not None and not self.consumer.joined:
            problems.append("consumer has not joined its group yet (no partitions to read)")
        status, code = ("not ready", 503) if problems else ("ready", 200)
        if not detail:
            return _json({"status": status}, code)
        return _json({"status": status, "problems": problems}, code)

    @api.get("/metrics", dependencies=[Depends(require_bearer)])
    async def metrics_text(self) -> Response:
        """Prometheus text format; behind the bearer token (model tags, drift and volumes are not public)."""
        return Response(await asyncio.to_thread(self.board.render), media_type=CONTENT_TYPE)

    def snapshot(self) -> dict[str, Any]:
        """Delivery counters of the whole consumer group (durable, all replicas) plus this replica's own.

        ``consumed``/``decided``/``dead_lettered``/``redelivered`` are the
        group's totals (:class:`fedfraud.serving.metrics.DurableCounters`), so they are
        right with several replicas and after a restart; ``replica`` holds
        this process's live figures (lag, models, counts since it started).
        """
        local = self.metrics.snapshot()
        if self.consumer is not None:
            self.consumer.save_counters()
        else:
            self.durable.save(local)
        totals = self.durable.totals()
        return {**local, **totals, "replica": local}

    def process(self) -> dict[str, Any]:
        """This replica's pid and the niceness of each of its threads (``serving.replica_niceness``)."""
        return {"pid": os.getpid(), "niceness": thread_niceness()}

    def profile(self, reset: bool = False) -> dict[str, dict[str, dict[str, float]]]:
        """Per-section CPU/wall seconds of this replica (consumer, anomaly and fraud stages, Kafka I/O)."""
        return {"replica": self.hot.clock.snapshot(reset)}

    def latency_split(self, reset: bool = False) -> dict[str, dict[str, dict[str, float]]]:
        """p50/p99 of the two parts of produce → decision on this replica (:meth:`StreamConsumer._split_latency`)."""
        return {"replica": self.hot.clock.percentiles(reset)}


def build_app(args: ScoringArgs | dict[str, Any]) -> Application:
    """Typed builder (STYLE §7): ``serving.scorer_replicas`` replicas of :class:`StreamScorer`, each bound
    its :class:`ScorerConfig` (the sections it reads), not the whole config.
    """
    if isinstance(args, dict):  # ``serve run`` passes the YAML args as a dict
        args = ScoringArgs.model_validate(args)
    cfg = ScorerConfig.of(_config(args))
    s = cfg.serving
    from fedfraud.training.registry import ModelRegistry

    registry = ModelRegistry(s.registry_root)
    registry.get("anomaly", s.anomaly_version)  # fail fast, one line, if nothing is registered
    from fedfraud.serving.graph_fraud import fraud_kind

    registry.get(fraud_kind(cfg.fraud.variant), s.fraud_version)
    api_token(s.auth)  # ... and if no API token is configured (each replica reads it again, where it runs)
    replica = _ReplicaArgs(config=cfg, bootstrap_servers=args.bootstrap_servers, consume=args.consume,
                           anomaly_loader=args.anomaly_loader)
    actor = dict(StreamScorer.ray_actor_options or {})
    runtime_env = dict(actor.get("runtime_env") or {})
    # the worker applies it at start-up: nice(n) on top of the Ray node's niceness
    runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), RAY_WORKER_NICENESS: str(s.replica_niceness)}
    actor["runtime_env"] = runtime_env
    return StreamScorer.options(num_replicas=s.scorer_replicas, ray_actor_options=actor).bind(
        replica.model_dump(mode="json")
    )

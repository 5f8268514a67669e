"""Prometheus metrics of the streaming pipeline, kept by the ingress replica and served on ``GET /metrics``.

The delivery invariant is visible here: for the Kafka stream,
``fedfraud_consumed_total == fedfraud_decided_total + fedfraud_dead_lettered_total``
whenever no micro-batch is in flight (``fedfraud_inflight_messages``; add it to
the right-hand side at any moment).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from contextlib import contextmanager
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "DurableCounters", "LoopFigures", "MetricsBoard", "PipelineMetrics", "StageClock"]

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class PipelineMetrics:
    """Counters, histograms and gauges of one ingress replica (its own registry, so tests can read it)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.consumed = Counter("fedfraud_consumed", "Kafka messages consumed from transactions", registry=r)
        self.decided = Counter("fedfraud_decided", "Kafka messages with a decision produced and flushed", registry=r)
        self.dead = Counter(
            "fedfraud_dead_lettered", "Kafka messages sent to the DLQ", ["reason"], registry=r
        )
        self.redelivered = Counter(
            "fedfraud_redelivered", "decisions re-emitted for redelivered transactions", registry=r
        )
        self.http_scored = Counter("fedfraud_http_scored", "transactions scored through POST /score", registry=r)
        self.retries = Counter("fedfraud_stage_retries", "scoring calls retried after an error", ["stage"], registry=r)
        self.inflight = Gauge("fedfraud_inflight_messages", "consumed messages not yet decided", registry=r)
        self.lag = Gauge("fedfraud_consumer_lag", "end offset minus position, summed over partitions", registry=r)
        self.e2e = Histogram(
            "fedfraud_end_to_end_latency_seconds",
            "produce timestamp to decision timestamp",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.stage = Histogram(
            "fedfraud_stage_latency_seconds", "time per micro-batch and stage", ["stage"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.batch_size = Histogram(
            "fedfraud_batch_messages", "messages per micro-batch", buckets=(1, 8, 32, 64, 128, 256, 512, 1024),
            registry=r,
        )
        self.model = Gauge("fedfraud_model_info", "model version in use (value 1)", ["kind", "tag"], registry=r)
        self._models: dict[str, str] = {}
        self._lock = threading.Lock()

    def set_model(self, kind: str, tag: str) -> None:
        """Record the version a stage used; the old label is removed so only the current one shows."""
        with self._lock:
            old = self._models.get(kind)
            if old == tag:
                return
            if old is not None:
                self.model.remove(kind, old)
            self.model.labels(kind=kind, tag=tag).set(1)
            self._models[kind] = tag

    def watch_loop(self, figures: Callable[[], LoopFigures]) -> None:
        """Export drift and shadow figures, read from the hot path at scrape time (a custom collector)."""
        self.registry.register(_LoopCollector(figures))

    def render(self) -> bytes:
        """Prometheus text exposition format."""
        return generate_latest(self.registry)

    def snapshot(self) -> dict[str, Any]:
        """The delivery counters as plain numbers (``/healthz`` and tests)."""
        dead = sum(s.value for m in self.dead.collect() for s in m.samples if s.name.endswith("_total"))
        return {
            "consumed": int(self.consumed._value.get()),
            "decided": int(self.decided._value.get()),
            "dead_lettered": int(dead),
            "inflight": int(self.inflight._value.get()),
            "redelivered": int(self.redelivered._value.get()),
            "http_scored": int(self.http_scored._value.get()),
            "consumer_lag": int(self.lag._value.get()),
            "models": dict(self._models),
        }


@dataclass(frozen=True)
class LoopFigures:
    """What the retraining loop reads from a replica: PSI per input, its window, and shadow counts."""

    psi: dict[str, float]
    drift_rows: int
    shadow_scored: int
    shadow_agreed: int
    challenger: str | None
    side_errors: dict[str, int]


class _LoopCollector(Collector):
    """``fedfraud_drift_psi{feature}``, ``fedfraud_drift_window_rows``, ``fedfraud_shadow_scored_total`` and
    ``fedfraud_shadow_agreed_total``: values the hot path keeps, read when Prometheus scrapes.
    """

    def __init__(self, figures: Callable[[], LoopFigures]) -> None:
        self.figures = figures

    def collect(self) -> Iterator[Any]:
        f = self.figures()
        g = GaugeMetricFamily("fedfraud_drift_psi", "population stability index of a fraud-model input (or score) "
                              "over the live window vs the champion's training reference", labels=["feature"])
        for name, value in sorted(f.psi.items()):
            g.add_metric([name], value)
        yield g
        yield GaugeMetricFamily("fedfraud_drift_window_rows", "live rows in the drift window", value=f.drift_rows)
        labels = ["challenger"]
        scored = CounterMetricFamily("fedfraud_shadow_scored", "transactions the challenger scored in shadow",
                                     labels=labels)
        agreed = CounterMetricFamily("fedfraud_shadow_agreed", "shadow-scored transactions where the challenger's "
                                     "decision equalled the champion's", labels=labels)
        if f.challenger is not None:
            scored.add_metric([f.challenger], f.shadow_scored)
            agreed.add_metric([f.challenger], f.shadow_agreed)
        yield scored
        yield agreed
        errors = CounterMetricFamily("fedfraud_side_errors", "micro-batches whose shadow scoring or drift update "
                                     "failed (their decisions were made and sent)", labels=["kind"])
        for kind, n in sorted(f.side_errors.items()):
            errors.add_metric([kind], n)
        yield errors


class DurableCounters:
    """Each replica's delivery counts in the state store (KV table ``counters``); totals add them up.

    A replica saves its counts after every committed micro-batch, with its
    in-flight count and a heartbeat. ``consumed`` is counted when its batch
    commits, so the saved figures always satisfy consumed = decided +
    dead-lettered, and the totals survive a replica's restart (its last save
    stays) and add up across replicas (the counts of one Kafka consumer
    group). ``inflight`` sums only replicas seen within ``heartbeat_s``: a dead
    replica's uncommitted messages are redelivered to a live one.
    """

    FIELDS = ("consumed", "decided", "dead_lettered", "redelivered", "http_scored")

    def __init__(self, kv: Any, group: str, replica: str | None = None, heartbeat_s: float = 10.0) -> None:
        import uuid

        self.kv = kv
        self.prefix = f"{group}/"
        self.key = self.prefix + (replica or uuid.uuid4().hex[:12])
        self.heartbeat_s = heartbeat_s

    def save(self, snapshot: dict[str, Any]) -> None:
        """Persist a :meth:`PipelineMetrics.snapshot` (consumed counted at commit: minus what is in flight)."""
        import json
        import time

        counts = {f: int(snapshot.get(f, 0)) for f in self.FIELDS}
        counts["consumed"] -= int(snapshot.get("inflight", 0))
        value = {"counts": counts, "inflight": int(snapshot.get("inflight", 0)), "seen": time.time()}
        self.kv.put_many("counters", [(self.key, json.dumps(value).encode())])

    def totals(self) -> dict[str, Any]:
        """Counts summed over every replica of the group, ever; ``inflight`` over the live ones."""
        import json
        import time

        now = time.time()
        out: dict[str, Any] = dict.fromkeys(self.FIELDS, 0)
        out.update(inflight=0, replicas=0, live_replicas=0)
        for _, blob in self.kv.items("counters", self.prefix):
            value = json.loads(blob)
            for f in self.FIELDS:
                out[f] += int(value["counts"].get(f, 0))
            out["replicas"] += 1
            if now - float(value.get("seen", 0)) <= self.heartbeat_s:
                out["live_replicas"] += 1
                out["inflight"] += int(value.get("inflight", 0))
        return out


class MetricsBoard:
    """Every replica's metrics on every replica's ``/metrics``, each sample labelled ``replica``.

    A replica writes its own exposition text to the shared state store (KV
    table ``metrics``) every ``period_s`` and just before it answers a scrape;
    a scrape renders the last text of every replica seen within ``stale_s``.
    So a scrape that Serve's proxy routes to any replica returns the same
    families, each sample tagged with the replica that counted it (Prometheus
    sums them with ``sum without (replica)``). It is the shared-store
    equivalent of ``ray.serve.metrics``, which would export through Ray's
    metrics agent on another port instead of the application's ``/metrics``.
    """

    def __init__(self, kv: Any, group: str, replica: str, render: Callable[[], bytes], period_s: float = 2.0,
                 stale_s: float = 30.0) -> None:
        self.kv = kv
        self.prefix = f"{group}/"
        self.replica = replica
        self.render_own = render
        self.period_s = period_s
        self.stale_s = stale_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def publish(self) -> None:
        """Write this replica's current exposition text with a heartbeat."""
        import json

        value = {"replica": self.replica, "seen": time.time(), "text": self.render_own().decode("utf-8")}
        self.kv.put_many("metrics", [(self.prefix + self.replica, json.dumps(value).encode())])

    def start(self) -> MetricsBoard:
        def loop() -> None:
            while not self._stop.wait(self.period_s):
                try:
                    self.publish()
                except Exception:  # noqa: BLE001 - a store blip must not kill the metrics thread
                    log.debug("metrics board publish failed", exc_info=True)

        self._thread = threading.Thread(target=loop, name="fedfraud-metrics-board", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def render(self) -> bytes:
        """Prometheus text of every live replica (this one's fresh), samples labelled ``replica``."""
        import json

        from prometheus_client.core import Metric
        from prometheus_client.parser import text_string_to_metric_families

        self.publish()
        now = time.time()
        families: dict[str, Metric] = {}
        for _, blob in self.kv.items("metrics", self.prefix):
            value = json.loads(blob)
            if now - float(value.get("seen", 0)) > self.stale_s:
                continue
            for fam in text_string_to_metric_families(value["text"]):
                merged = families.get(fam.name)
                if merged is None:
                    merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                for s in fam.samples:
                    merged.add_sample(s.name, {**s.labels, "replica": value["replica"]}, s.value, s.timestamp)
        registry = CollectorRegistry()
        registry.register(_Families(list(families.values())))
        return generate_latest(registry)


class _Families(Collector):
    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> Iterator[Any]:
        yield from self.families


class StageClock:
    """CPU (this thread's) and wall seconds per named section, so a benchmark can say where time goes.

    Thread CPU time excludes time the OS gave other processes, so the numbers
    stay meaningful on a busy machine; wall time shows waiting (I/O, acks).
    """

    #: most recent samples :meth:`observe` keeps per name (a bench block at 2,000 tx/s for 5 s holds 10,000)
    MAX_SAMPLES = 50_000

    def __init__(self) -> None:
        self._cpu: defaultdict[str, float] = defaultdict(float)
        self._wall: defaultdict[str, float] = defaultdict(float)
        self._calls: defaultdict[str, int] = defaultdict(int)
        self._samples: dict[str, deque[float]] = {}
        self._samples_lock = threading.Lock()  # the consumer thread observes, a bench's call reads and resets

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        cpu, wall = time.thread_time(), time.perf_counter()
        try:
            yield
        finally:
            self._cpu[name] += time.thread_time() - cpu
            self._wall[name] += time.perf_counter() - wall
            self._calls[name] += 1

    def snapshot(self, reset: bool = False) -> dict[str, dict[str, float]]:
        """``{section: {cpu_s, wall_s, calls}}`` since the last reset."""
        out = {k: {"cpu_s": self._cpu[k], "wall_s": self._wall[k], "calls": self._calls[k]} for k in list(self._cpu)}
        if reset:
            self._cpu.clear(), self._wall.clear(), self._calls.clear()
        return out

    def observe(self, name: str, seconds: Iterable[float]) -> None:
        """Keep per-transaction durations (a mean hides the tail that a p99 target is about); bounded, O(1) each."""
        with self._samples_lock:
            kept = self._samples.get(name)
            if kept is None:
                kept = self._samples[name] = deque(maxlen=self.MAX_SAMPLES)
            kept.extend(seconds)

    def percentiles(self, reset: bool = False) -> dict[str, dict[str, float]]:
        """``{name: {n, p50_ms, p99_ms}}`` of the most recent :meth:`observe` samples (since the last reset)."""
        import numpy as np

        with self._samples_lock:
            taken = {name: np.asarray(kept, dtype=np.float64) for name, kept in self._samples.items() if kept}
            if reset:
                self._samples = {}
        out = {}
        for name, values in taken.items():
            p50, p99 = np.percentile(values * 1e3, [50, 99])
            out[name] = {"n": float(len(values)), "p50_ms": float(p50), "p99_ms": float(p99)}
        return out

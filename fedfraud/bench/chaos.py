"""``fedfraud bench chaos``: one fault at a time against the running stream, audited on the topics themselves.

Faults (each while a replay streams at a fixed rate):

- **malformed records**: one message of every malformed class, between good transactions;
- **broker outage**: every client connection to the broker dropped, and new ones refused, for ``outage_s``;
- **Redis outage**: the same for the online store (Feast and serving's decision state);
- **replica kill**: the scoring replica's process killed (Serve starts another; the group rebalances).

The outages go through :class:`fedfraud.core.tcpproxy.TcpProxy`, a loopback proxy in front of the
real broker and the real Redis: clients see exactly what a restart shows them
(connections reset, then refused, then accepted again) while the data stays.
A real broker *process* restart cannot be shown with the embedded broker: its
storage is memory only (the Tansu build shipped on PyPI has no PostgreSQL or
S3 storage feature), so a restart would lose the input topic itself.

Audit, per fault, from the ``transactions``, ``fraud-decisions`` and DLQ topics:
in; decided (distinct transactions with a decision); dead-lettered (DLQ records
of this fault's messages); duplicates marked (``redelivered: true``) and
unmarked (a second unmarked decision of one transaction); lost (an input with
neither); and recovery, seconds from the end of the fault until ``/healthz``
is green again. ``health_red`` says whether ``/healthz`` turned red during the fault.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fedfraud.bench.harness import table
from fedfraud.core.tcpproxy import TcpProxy

__all__ = ["MALFORMED", "ChaosResult", "FaultRow", "TcpProxy", "audit", "run_chaos_bench"]

log = logging.getLogger(__name__)

#: Redis database the chaos bench owns (flushed at start).
CHAOS_REDIS_DB = 13


def _record(**overrides: Any) -> dict[str, Any]:
    row = {"transaction_id": "chaos", "cardholder_id": "chaos", "merchant_id": "m", "timestamp": "2026-11-01T00:00:00Z",
           "amount": 1.0, "lat": 1.0, "lon": 2.0, "mcc": "x"}
    return {**row, **overrides}


#: One message of each malformed class (value bytes), by name.
MALFORMED: dict[str, bytes] = {
    "not JSON": b"\x00\x01 not json",
    "bad UTF-8": b'{"transaction_id":"\xff\xfe"}',
    "JSON array": b"[1, 2, 3]",
    "deep nesting": b"[" * 50_000 + b"]" * 50_000,
    "NaN token": b'{"amount": NaN}',
    "401-digit amount": json.dumps(_record()).replace('"amount": 1.0', '"amount": ' + "9" * 401).encode(),
    "amount 1e308": json.dumps(_record(amount=1e308)).encode(),
    "amount a boolean": json.dumps(_record(amount=True)).encode(),
    "id an object": json.dumps(_record(cardholder_id={"a": 1})).encode(),
    "timestamp in 1900": json.dumps(_record(timestamp="1900-01-01T00:00:00Z")).encode(),
    "missing field": json.dumps({k: v for k, v in _record().items() if k != "lat"}).encode(),
    "id too long": json.dumps(_record(transaction_id="x" * 300)).encode(),
    "oversized": b'{"pad":"' + b"x" * (600 << 10) + b'"}',  # over the bench's 256 KiB cap, under the producer's 1 MB
}


@dataclass
class FaultRow:
    """One fault's audit, from the topics."""

    fault: str
    n_in: int
    decided: int
    dead_lettered: int
    marked_duplicates: int
    unmarked_duplicates: int
    lost: int
    recovery_s: float
    health_red: bool | None = None


def audit(fault: str, ids: set[str], n_extra: int, decisions: list[dict[str, Any]],
          dead: list[dict[str, Any]], recovery_s: float, health_red: bool | None) -> FaultRow:
    """Count one fault's outcome from the records read back from the decision and DLQ topics."""
    unmarked: dict[str, int] = {}
    marked = 0
    for d in decisions:
        if d["transaction_id"] not in ids:
            continue
        if d.get("redelivered"):
            marked += 1
        else:
            unmarked[d["transaction_id"]] = unmarked.get(d["transaction_id"], 0) + 1
    decided = {d["transaction_id"] for d in decisions} & ids
    # a DLQ record names its transaction in its masked canonical record (fedfraud.serving.kafka.dead_letters)
    dead_ids = {str(tx) for d in dead if (tx := (d.get("record") or {}).get("transaction_id")) is not None} & ids
    lost = len(ids - decided - dead_ids) + max(n_extra - (len(dead) - len(dead_ids)), 0)
    return FaultRow(fault, len(ids) + n_extra, len(decided), len(dead), marked,
                    sum(max(c - 1, 0) for c in unmarked.values()), lost, recovery_s, health_red)


@dataclass
class ChaosResult:
    rows: list[FaultRow] = field(default_factory=list)
    rate: float = 0.0
    outage_s: float = 0.0
    load_avg: float = 0.0
    cpus: int = 0

    def to_markdown(self) -> str:
        lines = [
            "### Faults on the live stream (`fedfraud bench chaos`)",
            "",
            f"Embedded Tansu broker and Redis behind loopback proxies, Ray Serve, {self.cpus} CPUs, load average "
            f"{self.load_avg:.1f} at start; replay at {self.rate:.0f} tx/s; outages last {self.outage_s:.0f} s. "
            "Counted on the topics.",
            "",
            *table(["fault", "in", "decided", "dead-lettered", "duplicates marked", "unmarked", "lost",
                    "/healthz red during", "recovery"],
                   ([r.fault, r.n_in, r.decided, r.dead_lettered, r.marked_duplicates, r.unmarked_duplicates, r.lost,
                     "n/a" if r.health_red is None else ("yes" if r.health_red else "no"), f"{r.recovery_s:.1f} s"]
                    for r in self.rows), "lrrrrrrlr"),
        ]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [asdict(r) for r in self.rows], "rate": self.rate, "outage_s": self.outage_s}


def _health(url: str) -> int:
    import httpx

    try:
        return httpx.get(f"{url}/healthz", timeout=2.0).status_code
    except httpx.HTTPError:
        return 0


def _wait_green(url: str, timeout_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if _health(url) == 200:
            return time.monotonic() - t0
        time.sleep(0.25)
    return float("inf")


@contextmanager
def _watch_health(url: str) -> Iterator[dict[str, bool]]:
    """Polls /healthz in the background while the block runs; ``seen["red"]`` if it was ever not 200."""
    seen = {"red": False}
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            if _health(url) != 200:
                seen["red"] = True
            stop.wait(0.25)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(timeout=5)


def _kill_replica() -> None:
    import ray

    victims = [a for a in ray.util.list_named_actors(all_namespaces=True) if "StreamScorer" in a["name"]]
    ray.kill(ray.get_actor(victims[0]["name"], namespace=victims[0]["namespace"]), no_restart=True)


def run_chaos_bench(n_per_fault: int = 600, rate: float = 150.0, outage_s: float = 5.0,
                    config: Any = None, faults: tuple[str, ...] | None = None) -> ChaosResult:
    """Start the stack behind proxies, run each fault once while streaming, audit each on the topics."""
    from fedfraud.bench.serving import COLUMNS, publish_bench_models
    from fedfraud.config import FedfraudConfig
    from fedfraud.serving.auth import per_run_token
    from fedfraud.serving.kafka.broker import EmbeddedBroker, free_port
    from fedfraud.serving.runtime import start
    from fedfraud.training.data.config import GeneratorConfig
    from fedfraud.training.data.synthetic import generate_frame
    from fedfraud.training.registry import ModelRegistry

    cfg: FedfraudConfig = config or FedfraudConfig()
    tmp = Path(tempfile.mkdtemp(prefix="fedfraud-bench-chaos-"))
    frame, _ = generate_frame(GeneratorConfig(banks=1, cardholders=150, days=60, seed=7))
    frame = frame.sort_values(["timestamp", "transaction_id"]).reset_index(drop=True)[COLUMNS]
    reg = ModelRegistry(tmp / "registry")
    publish_bench_models(reg, frame.head(2000), cfg)

    redis_host, redis_port = cfg.features.redis.address()
    cfg.features.redis.client(db=CHAOS_REDIS_DB).flushdb()
    redis_proxy = TcpProxy(redis_port, target_host=redis_host).start()
    broker_port = free_port()
    broker_proxy = TcpProxy(broker_port).start()
    s = cfg.serving
    broker = EmbeddedBroker(topics={t: s.partitions for t in s.topics.all()}, port=broker_port,
                            advertised_port=broker_proxy.port)
    serving = s.model_copy(update={
        "registry_root": str(reg.root), "bootstrap_servers": None, "http_port": free_port(),
        "auth": per_run_token(s.auth, tmp),
        "fraud_state_path": f"{'rediss' if cfg.features.redis.ssl else 'redis'}://{redis_proxy.address}/{CHAOS_REDIS_DB}",
        "fraud_state_password_env": cfg.features.redis.password_env,
        "fraud_state_ca_file": cfg.features.redis.ssl_ca_certs,
        "guards": s.guards.model_copy(update={"max_message_bytes": 256 << 10,
                                              "stall_s": min(s.guards.stall_s, outage_s / 2),
                                              "retry_budget_s": min(s.guards.retry_budget_s, outage_s / 2)}),
    })
    features = cfg.features.model_copy(update={
        "repo_dir": str(tmp / "repo"), "profile": "redis",
        "redis": cfg.features.redis.model_copy(
            update={"connection_string": f"{redis_proxy.address},db={CHAOS_REDIS_DB}"}),
    })
    cfg = cfg.model_copy(update={"serving": serving, "features": features})
    actions: dict[str, tuple[Callable[[], None], Callable[[], None] | None]] = {
        "malformed records": (lambda: None, None),
        "broker outage": (broker_proxy.cut, broker_proxy.restore),
        "Redis outage": (redis_proxy.cut, redis_proxy.restore),
        "replica kill": (_kill_replica, None),
    }
    chosen = faults or tuple(actions)
    unknown = [f for f in chosen if f not in actions]
    if unknown:
        raise ValueError(f"unknown faults {unknown}; choose from {list(actions)}")
    result = ChaosResult(rate=rate, outage_s=outage_s, load_avg=os.getloadavg()[0], cpus=os.cpu_count() or 0)
    broker.start()
    rt = None
    try:
        rt = start(cfg, bootstrap_servers=broker.bootstrap_servers)
        cursor = 2000
        rt.replay(frame.iloc[cursor : cursor + 200].reset_index(drop=True), rate=0)  # warm-up
        cursor += 200
        for name in chosen:
            begin, end = actions[name]
            part = frame.iloc[cursor : cursor + n_per_fault].reset_index(drop=True)
            cursor += len(part)
            extra = [(b"chaos", v) for v in MALFORMED.values()] if name == "malformed records" else []
            out: dict[str, Any] = {}
            thread = threading.Thread(target=lambda p=part, x=extra, o=out: o.setdefault(
                "r", rt.replay(p, rate=rate, extra=x, timeout_s=240)))
            with _watch_health(rt.url) as seen:
                thread.start()
                time.sleep(min(1.5, len(part) / rate / 3))
                log.info("fault: %s", name)
                begin()
                if end is not None:
                    time.sleep(outage_s)
                    end()
                # from the end of the fault (restore, or the kill) until /healthz is green again
                recovery = _wait_green(rt.url, 120) if name != "malformed records" else 0.0
                thread.join()
            replayed = out["r"]
            row = audit(name, set(part["transaction_id"].astype(str)), len(extra), replayed.decisions,
                        replayed.dead_letters, recovery, seen["red"] if end is not None else None)
            log.info("%s", row)
            result.rows.append(row)
    finally:
        if rt is not None:
            rt.stop()
        broker.stop()
        broker_proxy.cut()
        redis_proxy.cut()
    return result

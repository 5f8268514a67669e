"""``fedfraud bench console``: queue first-page and case-view latency with 20,000 decisions in the topic.

:func:`run_console_bench` generates one bank's transactions, applies and materializes its Feast repo (SQLite),
starts the embedded broker, produces the transactions (card tokens, rounded coordinates: what
``fedfraud stream`` sends) and one decision per transaction to ``fraud-decisions``, then starts the console
(the same :func:`fedfraud.console.runtime.open_console` and uvicorn as ``fedfraud console``) and times over
HTTP, with the bearer token:

* the queue's first page (50 declines, newest first), and the same page with filters;
* the case view of distinct decisions (two records read back by offset, the online store's ego graph and
  merchant risk, two matplotlib drawings);
* the reference, measured in the same run: a raw Kafka read of one page, i.e. the 50 newest records of
  ``fraud-decisions`` with a fresh librdkafka consumer (assign at offsets, poll), what any Kafka-backed queue pays at
  least.

The decisions are not the scorer's: a trained model and Ray Serve would add minutes and nothing the console
reads. They are records in the scorer's layout (:meth:`fedfraud.serving.fraud_stage.FraudStage._records`)
with seeded scores: about 3% declines, with three reasons each.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from fedfraud.bench.harness import load_average, table

if TYPE_CHECKING:
    from fedfraud.config import FedfraudConfig
    from fedfraud.serving.config import TopicNames

__all__ = ["ConsoleBench", "REASONS", "build_bank", "decision_records", "fill_topics", "run_console_bench"]

log = logging.getLogger(__name__)

QUEUE_TARGET_MS = 300.0
CASE_TARGET_MS = 500.0
#: Fraud-model inputs named as the scorer's reasons (a subset of the fraud row's features).
REASONS = ("amount", "anomaly_score", "amount_ratio_30d", "hour_sin", "distance_km", "tx_count_1h",
           "merchant_fed_fraud_rate_7d", "category_surprise")


def build_bank(work: Path, cfg: FedfraudConfig, cardholders: int, days: int, seed: int) -> tuple[pd.DataFrame, Path]:
    """One generated bank (bank 0) and its Feast repo, applied and materialized on SQLite: what the console's
    case view reads the ego graphs from.
    """
    from fedfraud.feature_store.feast_store import apply_repo, materialize_repo, open_store
    from fedfraud.feature_store.layout import read_bank
    from fedfraud.feature_store.offline import write_offline
    from fedfraud.training.data.config import GeneratorConfig
    from fedfraud.training.data.synthetic import generate_dataset

    data, repo = work / "data", work / "repo"
    generate_dataset(data, GeneratorConfig(banks=1, cardholders=cardholders, days=days, seed=seed), raw_csv=False,
                     progress=False)
    write_offline(data, repo, cfg.encoder, cfg.privacy, cfg.egograph, cfg.features.location_cell_deg, banks=[0],
                  progress=False)
    store = open_store(cfg.features, repo, "sqlite")
    apply_repo(store)
    materialize_repo(store)
    return read_bank(data, 0), repo


def decision_records(wire: list[dict[str, Any]], seed: int, fraud_model: str = "fraud:v1",
                     anomaly_model: str = "anomaly:v1") -> list[dict[str, Any]]:
    """One decision per wire record in the scorer's layout, with seeded scores (about 3% declines)."""
    rng = np.random.default_rng(seed)
    scores = rng.beta(0.4, 6.0, size=len(wire))
    now = time.time_ns() // 1000 - len(wire) * 1000
    out = []
    for i, (tx, score) in enumerate(zip(wire, scores, strict=True)):
        fraud = bool(score >= 0.3)
        reasons = [{"feature": str(f), "value": round(float(rng.normal()), 4),
                    "contribution": round(float(rng.uniform(0.1, 2.0)), 4)}
                   for f in rng.choice(REASONS, size=3, replace=False)] if fraud else []
        out.append({"transaction_id": tx["transaction_id"], "cardholder": tx["cardholder_id"], "score": float(score),
                    "decision": "fraud" if fraud else "legit", "anomaly_score": float(rng.gamma(2.0, 0.5)),
                    "top_reasons": reasons, "models": {"anomaly": anomaly_model, "fraud": fraud_model},
                    "produced_us": now + i * 1000, "redelivered": False, "decided_us": now + i * 1000 + 900})
    return out


def fill_topics(bootstrap_servers: str, frame: pd.DataFrame, cfg: FedfraudConfig, topics: TopicNames,
                seed: int = 7, limit: int | None = None) -> list[dict[str, Any]]:
    """Produce ``frame``'s rows (bank 0, as ``fedfraud stream`` sends them) and one decision each; returns the
    decisions, acknowledged by the broker.
    """
    from fedfraud.feature_store.privacy import PrivateFeaturizer
    from fedfraud.serving.kafka import confirm_sent, json_bytes, make_producer
    from fedfraud.serving.replay import wire_records

    featurizer = PrivateFeaturizer.for_bank(cfg.encoder, cfg.privacy, 0)
    wire = wire_records(frame.head(limit) if limit else frame, featurizer)
    decisions = decision_records(wire, seed)
    producer = make_producer(bootstrap_servers, cfg.serving.producer, client_id="fedfraud-bench-console",
                             security=cfg.serving.kafka_security)
    try:
        futures = [producer.send(topics.transactions, key=r["cardholder_id"].encode(), value=json_bytes(r))
                   for r in wire]
        futures += [producer.send(topics.decisions, key=d["cardholder"].encode(), value=json_bytes(d))
                    for d in decisions]
        confirm_sent(producer, futures, timeout_s=120)
    finally:
        producer.close()
    return decisions


def _percentiles(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms, dtype=np.float64)
    return {"n": float(len(a)), "p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
            "max": float(a.max())}


@dataclass
class ConsoleBench:
    """Latencies (ms) of the console's pages and of the raw Kafka reference, with the run's context."""

    decisions: int
    declines: int
    index_s: float
    rows: dict[str, dict[str, float]] = field(default_factory=dict)
    loadavg: list[str] = field(default_factory=list)
    commit: str = ""

    def to_markdown(self) -> str:
        targets = {"queue first page": f"p95 ≤ {QUEUE_TARGET_MS:.0f} ms", "case view": f"p95 ≤ {CASE_TARGET_MS:.0f} ms"}
        lines = [
            f"### Console latency: {self.decisions:,} decisions in `fraud-decisions` ({self.declines:,} declines)",
            "",
            f"Embedded broker, SQLite online store, console over HTTP on loopback (uvicorn, one process); "
            f"commit {self.commit or '?'}; the index read the topics in {self.index_s:.1f} s.",
            "",
            *table(["request", "n", "p50 ms", "p95 ms", "max ms", "target"],
                   ([name, f"{r['n']:.0f}", f"{r['p50']:.1f}", f"{r['p95']:.1f}", f"{r['max']:.1f}",
                     targets.get(name, "reference" if name.startswith("reference") else "")]
                    for name, r in self.rows.items())),
        ]
        lines += ["", "Load average (`/proc/loadavg`): " + "; ".join(self.loadavg)]
        return "\n".join(lines)


def _commit() -> str:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _timed_get(url: str, headers: dict[str, str]) -> float:
    start = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as resp:
        resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}")
    return (time.perf_counter() - start) * 1000


def _raw_page_ms(bootstrap_servers: str, topic: str, size: int, security: Any) -> float:
    """The reference: the ``size`` newest records of ``topic`` read straight from Kafka (one fresh consumer, as
    a stateless page request would make).
    """
    from fedfraud.serving.kafka import parse_json
    from fedfraud.serving.kafka.consumer import assign_from, make_reader, take, wait_for_partitions, watermarks

    start = time.perf_counter()
    consumer = make_reader(bootstrap_servers, client_id="fedfraud-bench-console", fetch_max_wait_ms=10,
                           security=security)
    try:
        ends = watermarks(consumer, [(topic, p) for p in sorted(wait_for_partitions(consumer, topic))])
        per = -(-size // len(ends))
        starts = {part: max(high - per, 0) for part, (_, high) in ends.items()}
        want = sum(ends[part][1] - first for part, first in starts.items())
        assign_from(consumer, starts)
        got = 0
        while got < want:
            msgs = take(consumer, 200, 500)
            for m in msgs:
                parse_json(m.value or b"")
            got += len(msgs)
    finally:
        consumer.close()
    return (time.perf_counter() - start) * 1000


def run_console_bench(cfg: FedfraudConfig, decisions: int = 20_000, requests: int = 60, seed: int = 7,
                      work: Path | None = None) -> ConsoleBench:
    """Fill the topics with ``decisions`` decisions and time the console's queue and case pages."""
    from fedfraud.console.runtime import ConsoleServer, close_console, open_console
    from fedfraud.core.credentials import bearer_headers, new_token
    from fedfraud.core.net import free_port
    from fedfraud.serving.kafka.broker import EmbeddedBroker

    loads = [f"before: {load_average()}"]
    topics = cfg.serving.topics
    with tempfile.TemporaryDirectory(prefix="fedfraud-bench-console-") as tmp:
        base = Path(work or tmp)
        per_card = 30.0  # transactions per cardholder in 30 days, about, with the generator's defaults
        frame, repo = build_bank(base, cfg, cardholders=int(decisions / per_card * 1.15) + 10, days=30, seed=seed)
        if len(frame) < decisions:
            raise RuntimeError(f"the generator made {len(frame)} transactions, fewer than {decisions}")
        log.info("bench console: %d transactions generated, feature repo at %s", len(frame), repo)
        with EmbeddedBroker(topics={t: cfg.serving.partitions for t in topics.all()}) as broker:
            made = fill_topics(broker.bootstrap_servers, frame, cfg, topics, seed, limit=decisions)
            token = new_token()
            started = time.perf_counter()
            console = open_console(cfg, broker.bootstrap_servers, base / "audit.jsonl", base / "registry", repo,
                                   wait_s=300, token=token)
            index_s = time.perf_counter() - started
            server = ConsoleServer(console, port=free_port()).start()
            try:
                headers = bearer_headers(token)
                rng = np.random.default_rng(seed)
                declines = [d["transaction_id"] for d in made if d["decision"] == "fraud"]
                bench = ConsoleBench(decisions=len(made), declines=len(declines), index_s=index_s,
                                     commit=_commit())
                for _ in range(3):  # warm-up: first imports, matplotlib's font cache, the first store read
                    _timed_get(f"{server.url}/", headers)
                    _timed_get(f"{server.url}/case/{declines[0]}", headers)
                bench.rows["queue first page"] = _percentiles(
                    [_timed_get(f"{server.url}/", headers) for _ in range(requests)])
                bench.rows["queue first page, filtered (score ≥ 0.5, reason amount)"] = _percentiles(
                    [_timed_get(f"{server.url}/?min_score=0.5&reason=amount", headers) for _ in range(requests)])
                bench.rows["queue page 10"] = _percentiles(
                    [_timed_get(f"{server.url}/?page=10", headers) for _ in range(requests)])
                picks = rng.choice(len(declines), size=min(requests, len(declines)), replace=False)
                bench.rows["case view"] = _percentiles(
                    [_timed_get(f"{server.url}/case/{declines[i]}", headers) for i in picks])
                bench.rows["reference: raw Kafka read of 50 newest decisions"] = _percentiles(
                    [_raw_page_ms(broker.bootstrap_servers, topics.decisions, 50, cfg.serving.kafka_security)
                     for _ in range(requests)])
            finally:
                server.stop()
                close_console(console)
    loads.append(f"after: {load_average()}")
    bench.loadavg = loads
    log.info("bench console: %s", json.dumps(bench.rows))
    return bench

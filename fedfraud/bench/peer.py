"""The plain peer of ``fedfraud bench serving --peers``: what most fraud-scoring tutorials build.

A librdkafka consumer ──> JSON ──> the product's fraud features ──> XGBoost ──> a decision record on the decisions
topic. No graph, no GNN, no Feast, no Ray: one process, one loop, the per-cardholder fraud-feature states in a dict
in memory. It is the reference the hot path's figures are divided by, so everything that is not *work per
transaction* is kept as the product does it:

* the same clients and settings (:func:`fedfraud.serving.kafka.make_consumer` / ``make_producer``, the deployment's
  ``serving.consumer`` / ``serving.producer``), the same micro-batch window (``max_poll_records`` records or
  ``max_batch_wait_ms`` after the first), and the same at-least-once point (:class:`fedfraud.serving.acks.AckWindow`:
  offsets committed once the decisions are acknowledged, the next batch scored meanwhile);
* the same feature rows (:meth:`fedfraud.training.fraud.features.FraudFeatureState.update` on the bank's private
  features), minus the anomaly score: the peer's model is an XGBoost fitted on the same training rows without that
  column (:func:`publish_peer_model`);
* ``decided_us`` stamped when the batch is decided, before its sends, as the fraud stage stamps it.

What it leaves out is what the product adds: validation and dead letters, redelivery detection, the shared state
store, the online store, ego graphs and the GNN, the Serve replica, top reasons.

:class:`PeerProcess` runs it in a process of its own (the bench's CPU sampler counts that process as the scoring
replica); :class:`PlainPeer` is the loop itself, which a test can run in a thread.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from fedfraud.serving.metrics import StageClock

if TYPE_CHECKING:
    from fedfraud.config import FedfraudConfig
    from fedfraud.serving.kafka.consumer import IngressConsumer, Record
    from fedfraud.serving.kafka.producer import Producer
    from fedfraud.training.registry import ModelRegistry

__all__ = ["PEER_GROUP", "PeerProcess", "PlainPeer", "publish_peer_model"]

log = logging.getLogger(__name__)

#: The peer's consumer group (its offsets never mix with the scorer's).
PEER_GROUP = "fedfraud-bench-peer"


def publish_peer_model(reg: ModelRegistry, train: pd.DataFrame, cfg: FedfraudConfig) -> None:
    """The peer's XGBoost: fitted on ``train`` as :func:`fedfraud.bench.serving.publish_bench_models` fits the
    product's (same rows, same private features, same size), without the anomaly-score column; published to
    ``reg`` unless it already holds one.
    """
    from fedfraud.feature_store.privacy import PrivateFeaturizer
    from fedfraud.training.fraud.config import FraudConfig
    from fedfraud.training.fraud.features import build_features, fit_transitions
    from fedfraud.training.fraud.model import fit_model

    if reg.latest("fraud") is not None:
        return
    fcfg = FraudConfig(nthread=1)
    private = PrivateFeaturizer.for_bank(cfg.encoder, cfg.privacy, cfg.serving.bank_id).transform(train)
    table = fit_transitions(train, private.cardholder, np.ones(len(train), dtype=bool))
    feats = build_features(train, private, fcfg, transitions=table)
    model = fit_model(feats, feats, False, fcfg, "centralized", meta={"peer": "plain XGBoost, no anomaly score"})
    model.publish(reg, config={"fraud": fcfg.model_dump()}, metrics={})


class PlainPeer:
    """Consume → features → XGBoost → produce, one micro-batch at a time (see the module docstring)."""

    def __init__(self, cfg: FedfraudConfig, bootstrap_servers: str, registry_root: str | Path,
                 clock: StageClock | None = None) -> None:
        from fedfraud.feature_store.privacy import PrivateFeaturizer
        from fedfraud.serving.fraud_stage import fraud_config_for, load_fraud_model
        from fedfraud.training.fraud.features import feature_names
        from fedfraud.training.registry import ModelRegistry

        self.cfg = cfg
        self.bootstrap_servers = bootstrap_servers
        registry = ModelRegistry(registry_root)
        self.model, self.tag = load_fraud_model(registry, "latest")
        self.fraud_cfg = fraud_config_for(registry.get_ref(self.tag).config, cfg.fraud)
        if tuple(feature_names(self.fraud_cfg)) != tuple(self.model.input_names):
            raise ValueError(f"peer model {self.tag} reads {self.model.input_names}, not the rows its config builds")
        self.featurizer = PrivateFeaturizer.for_bank(cfg.encoder, cfg.privacy, cfg.serving.bank_id)
        self.dim = cfg.encoder.dim
        self.states: dict[str, Any] = {}  # pseudonym → FraudFeatureState, in memory as a tutorial keeps them
        self.clock = clock or StageClock()
        self.decided = 0
        self.ready = threading.Event()

    def run(self, stop: threading.Event) -> None:
        """Consume until ``stop`` is set; then confirm and commit what was scored."""
        from fedfraud.serving.acks import AckWindow
        from fedfraud.serving.kafka import make_consumer, make_producer

        s = self.cfg.serving
        consumer = make_consumer(self.bootstrap_servers, s.consumer.model_copy(update={"assignment": "manual"}),
                                 s.topics.transactions, group_id=PEER_GROUP, security=s.kafka_security)
        producer = make_producer(self.bootstrap_servers, s.producer, client_id="fedfraud-peer",
                                 security=s.kafka_security)
        acks = AckWindow(s.consumer.max_unacked_batches, s.consumer.commit_interval_ms,
                         lambda offsets, asynchronous: consumer.commit(offsets, asynchronous=asynchronous))
        self.ready.set()
        try:
            while not stop.is_set():
                msgs = self._poll(consumer)
                if not msgs:
                    acks.drain()
                    continue
                futures, offsets = self.process(msgs, producer)
                with self.clock.section("consumer.commit"):
                    acks.add(futures, offsets, lambda: None)
            acks.drain()
        finally:
            producer.close(timeout=5)
            consumer.close()

    def _poll(self, consumer: IngressConsumer) -> list[Record]:
        """One micro-batch, closed as the scorer closes it (``max_poll_records`` or ``max_batch_wait_ms``)."""
        c = self.cfg.serving.consumer
        with self.clock.section("consumer.poll"):
            msgs = consumer.poll(timeout_ms=100, max_records=c.max_poll_records)
            if msgs and c.max_batch_wait_ms > 0:
                deadline = time.monotonic() + c.max_batch_wait_ms / 1000
                while len(msgs) < c.max_poll_records:
                    left_ms = int((deadline - time.monotonic()) * 1000)
                    if left_ms <= 0:
                        break
                    msgs += consumer.poll(timeout_ms=left_ms, max_records=c.max_poll_records - len(msgs))
        return msgs

    def process(self, msgs: list[Record], producer: Producer) -> tuple[list[Any], dict[tuple[str, int], int]]:
        """Decide ``msgs`` (poll order: each cardholder's in produce order) and send the decisions; returns the
        send futures and the offsets they cover.
        """
        from fedfraud.feature_store.encoders import timestamps_us
        from fedfraud.serving.kafka import json_bytes, now_us, produced_us_of
        from fedfraud.training.fraud.features import FraudFeatureState, FraudInput

        clock = self.clock
        with clock.section("peer.decode"):
            frame = pd.DataFrame.from_records([json.loads(m.value or b"{}") for m in msgs])
            frame["timestamp"] = pd.to_datetime(frame["timestamp"], utc=True, format="ISO8601")
            produced = [produced_us_of(m.headers, m.timestamp) for m in msgs]
        with clock.section("peer.features"):
            private = self.featurizer.transform(frame)
            ts = timestamps_us(frame["timestamp"]).tolist()
            amounts = frame["amount"].to_numpy(dtype=np.float64).tolist()
            mccs = frame["mcc"].astype(str).tolist()
            holders = [str(h) for h in private.cardholder]
            rows = []
            for i, holder in enumerate(holders):
                state = self.states.get(holder)
                if state is None:
                    state = self.states[holder] = FraudFeatureState(self.fraud_cfg, self.dim)
                rows.append(state.update(FraudInput(ts[i], amounts[i], mccs[i], int(private.merchant[i]),
                                                    private.location[i], private.time[i]), self.model.transitions))
        with clock.section("fraud.model"):
            scores = self.model.scores(np.stack(rows))
        stamp = now_us()
        ids = frame["transaction_id"].astype(str).tolist()
        futures = []
        with clock.section("kafka.produce"):
            topic = self.cfg.serving.topics.decisions
            for i, score in enumerate(scores.tolist()):
                record = {"transaction_id": ids[i], "cardholder": holders[i], "score": score,
                          "decision": "fraud" if score >= self.model.threshold else "legit",
                          "models": {"fraud": self.tag}, "produced_us": produced[i], "decided_us": stamp}
                futures.append(producer.send(topic, key=holders[i].encode(), value=json_bytes(record)))
        offsets: dict[tuple[str, int], int] = {}
        for m in msgs:
            tp = (m.topic, m.partition)
            offsets[tp] = max(offsets.get(tp, -1), m.offset + 1)
        self.decided += len(msgs)
        return futures, offsets


def _serve(config: dict[str, Any], bootstrap_servers: str, registry_root: str, conn: Connection) -> None:
    """The peer process: the loop in a thread, this thread answering the bench (``profile``, ``stop``)."""
    from fedfraud.config import FedfraudConfig
    from fedfraud.core.logs import configure_logging

    configure_logging("WARNING")
    try:
        peer = PlainPeer(FedfraudConfig.model_validate(config), bootstrap_servers, registry_root)
    except Exception as exc:  # e.g. no peer model in the registry: the bench reports it instead of timing out
        conn.send(("error", repr(exc)))
        return
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            peer.run(stop)
        except BaseException as exc:  # reported to the bench on its next call
            log.exception("peer loop failed")
            errors.append(exc)

    thread = threading.Thread(target=loop, name="fedfraud-peer", daemon=True)
    thread.start()
    peer.ready.wait(60)
    conn.send(("ready", None))
    while True:
        command, arg = conn.recv()
        if errors:
            conn.send(("error", repr(errors[0])))
            return
        if command == "profile":
            conn.send(("profile", peer.clock.snapshot(reset=bool(arg))))
        elif command == "stop":
            stop.set()
            thread.join(timeout=30)
            conn.send(("stopped", peer.decided))
            return


class PeerProcess:
    """:class:`PlainPeer` in a process of its own (spawned: no Ray, no torch state inherited from the bench)."""

    def __init__(self, cfg: FedfraudConfig, bootstrap_servers: str, registry_root: str | Path) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_serve, args=(cfg.model_dump(mode="json"), bootstrap_servers,
                                                          str(registry_root), child), name="fedfraud-peer",
                                    daemon=True)
        self._process.start()
        self._expect("ready", timeout_s=180)

    @property
    def pid(self) -> int:
        assert self._process.pid is not None
        return self._process.pid

    def _expect(self, what: str, timeout_s: float = 60.0) -> Any:
        if not self._conn.poll(timeout_s):
            raise TimeoutError(f"the peer process did not answer {what!r} within {timeout_s:.0f}s")
        kind, value = self._conn.recv()
        if kind != what:
            raise RuntimeError(f"the peer process answered {kind}: {value}")
        return value

    def profile(self, reset: bool = False) -> dict[str, dict[str, float]]:
        """The loop thread's :class:`StageClock` sections since the last reset."""
        self._conn.send(("profile", reset))
        return dict(self._expect("profile"))

    def stop(self) -> int:
        """Stop the loop (what it scored is confirmed and committed); returns how many transactions it decided."""
        try:
            self._conn.send(("stop", None))
            return int(self._expect("stopped"))
        finally:
            self._process.join(timeout=10)
            if self._process.is_alive():
                self._process.terminate()

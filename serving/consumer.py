"""The Kafka consumer loop of a scoring replica: poll, decode, score in-process, produce, commit.

One thread per replica, one consumer in the group ``serving.consumer.group_id``,
so partitions are shared by replicas and move to a survivor when one dies.
Each micro-batch goes through the same steps::

    poll until N records or the oldest waited T ms (latency-bounded batching)
      ──> decode + validate (never raises; dead letters sent at once)
      ──> score(frame)        (fedfraud.serving.hotpath.HotPath: states, GNN, XGBoost, produce + confirm)
      ──> copies / rejects    (decisions of in-batch copies; DLQ for rows the stages rejected)
      ──> ack window          (fedfraud.serving.acks.AckWindow: the next batches are scored while the broker acks)
      ──> commit, in order    (the at-least-once point: only offsets whose batch and predecessors are acked)

A failing batch is retried ``guards.stage_max_attempts`` times, then bisected
(:mod:`fedfraud.serving.poison`); an outage is retried until it ends, never
dead-lettered. :meth:`StreamConsumer.problems` is the one source of health.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from fedfraud.serving.config import ServingConfig
from fedfraud.serving.acks import AckWindow
from fedfraud.serving.kafka.dead_letters import DeadLetter, dead_letter_of, dlq_message
from fedfraud.serving.kafka import (
    DecodedBatch,
    decode_messages,
    ingress_validator,
    json_bytes,
    now_us,
)
from fedfraud.serving.kafka.consumer import CommitFailed, IngressConsumer, Partition
from fedfraud.serving.metrics import DurableCounters, PipelineMetrics, StageClock
from fedfraud.serving.poison import RetryingScorer, Score

__all__ = ["StreamConsumer"]

log = logging.getLogger(__name__)

def _without(msgs: list[Any], revoked: set[tuple[str, int]]) -> list[Any]:
    """``msgs`` minus those of partitions revoked during the batch window (their new owner reads them)."""
    if not revoked:
        return msgs
    kept = [m for m in msgs if (m.topic, m.partition) not in revoked]
    if len(kept) < len(msgs):
        log.warning("dropped %d records of revoked partitions from the batch; their new owner scores them",
                    len(msgs) - len(kept))
    return kept


class _Revocations:
    """Rebalance listener (Kafka's consumer contract): remembers partitions revoked during a batch window.

    The client calls it from inside ``poll``, on the consumer's thread. A
    partition revoked while a micro-batch is being gathered is dropped from
    that batch: the new owner reads it again from the last commit, so this
    replica must not score it too (that would make two unmarked decisions).
    """

    def __init__(self) -> None:
        self.revoked: set[tuple[str, int]] = set()
        self.before_revoke: Callable[[], Any] | None = None
        self.joined = False

    def on_partitions_revoked(self, revoked: list[Partition]) -> None:
        self.revoked |= set(revoked)
        if revoked:
            log.info("partitions revoked: %s", sorted(self.revoked))
            if self.before_revoke is not None:
                try:
                    self.before_revoke()
                except Exception as exc:  # the new owner redelivers what was not committed
                    log.warning("could not commit before the rebalance (%s); those batches will be redelivered", exc)

    def on_partitions_lost(self, lost: list[Partition]) -> None:
        self.revoked |= set(lost)  # lost: too late to commit for them

    def on_partitions_assigned(self, assigned: list[Partition]) -> None:
        self.joined = True  # the group join completed (an empty assignment is a hot standby: still ready)
        if assigned:
            log.info("partitions assigned: %s", sorted(assigned))


class StreamConsumer:
    """The consumer thread of one replica; :meth:`start`, :meth:`stop`, :meth:`problems`."""

    def __init__(self, serving: ServingConfig, bootstrap_servers: str, score: Score,
                 metrics: PipelineMetrics | None = None, clock: StageClock | None = None,
                 durable: DurableCounters | None = None, replay_window: int | None = None) -> None:
        self.serving = serving
        self.guards = serving.guards
        self.bootstrap_servers = bootstrap_servers
        self.metrics = metrics or PipelineMetrics()
        self.clock = clock or StageClock()
        self.durable = durable
        self.validator = ingress_validator(self.guards)
        self.max_records = serving.consumer.max_poll_records
        self.max_wait_ms = serving.consumer.max_batch_wait_ms
        #: most uncommitted transactions of one cardholder (message key): the stages recognise a redelivery
        #: only among a cardholder's last ``decision_ring`` / ``dedupe_ring`` transactions, so no more than
        #: that many may be uncommitted at once, or a crash could re-decide one without the mark
        self.replay_window = min(replay_window or serving.decision_ring, serving.decision_ring)
        self._uncommitted: Counter[bytes | None] = Counter()
        self._stop = threading.Event()
        #: bounded retries, bisection and blame of a failing batch (:mod:`fedfraud.serving.poison`)
        self._scoring = RetryingScorer(score, self.guards, self.metrics, self._stop, self._made_progress)
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self._progress = time.monotonic()
        self._lag = 0
        self._inflight = 0
        self._broker_error: str | None = None
        self.connected = False

    # ------------------------------------------------------------------ lifecycle and health
    def start(self) -> StreamConsumer:
        self._thread = threading.Thread(target=self._run, name="fedfraud-consumer", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    @property
    def joined(self) -> bool:
        """The consumer completed its first group join (or was assigned partitions by hand): it can consume."""
        rebalance = getattr(self, "_rebalance", None)
        return self.connected and (self.serving.consumer.assignment == "manual" or bool(rebalance and rebalance.joined))

    def problems(self) -> list[str]:
        """Why this consumer is not healthy right now (empty: healthy)."""
        out: list[str] = []
        if self._thread is None:
            return out
        now = time.monotonic()
        if self.error is not None or not self._thread.is_alive():
            out.append(f"consumer loop not running: {self.error!r}")
        since = self._scoring.retrying_since
        if since is not None and now - since > self.guards.retry_budget_s:
            out.append(f"a micro-batch has been retrying for {now - since:.0f}s")
        if (self._lag > 0 or self._inflight > 0) and now - self._progress > self.guards.stall_s:
            idle = now - self._progress
            out.append(f"stalled: lag {self._lag}, {self._inflight} in flight, no commit for {idle:.0f}s")
        if self._broker_error is not None:
            out.append(f"broker unreachable: {self._broker_error}")
        return out

    def _run(self) -> None:
        try:
            self._consume()
        except BaseException as exc:  # surfaced by problems() → /healthz and Serve's check_health
            log.exception("consumer loop failed")
            self.error = exc

    # ------------------------------------------------------------------ the loop
    def _consume(self) -> None:
        """The poll loop: poll a micro-batch, cut it to the replay window, process it (:meth:`_process`); when
        idle, commit what is acknowledged; once a second, the lag and this replica's counters.
        """
        from fedfraud.serving.kafka import make_consumer, make_producer

        s = self.serving
        self._rebalance = r = _Revocations()
        consumer = make_consumer(self.bootstrap_servers, s.consumer, s.topics.transactions,
                                 on_assign=r.on_partitions_assigned, on_revoke=r.on_partitions_revoked,
                                 on_lost=r.on_partitions_lost, security=s.kafka_security)
        producer = make_producer(self.bootstrap_servers, s.producer, client_id="fedfraud-dlq",
                                 security=s.kafka_security)
        self._acks = AckWindow(s.consumer.max_unacked_batches, s.consumer.commit_interval_ms,
                               lambda offsets, asynchronous: self._commit(consumer, offsets, asynchronous))
        self._rebalance.before_revoke = self._drain  # give partitions away with their offsets committed
        self.connected = True
        last_lag = 0.0
        log.info("consumer started topic=%s group=%s assignment=%s batch<=%d wait<=%dms", s.topics.transactions,
                 s.consumer.group_id, s.consumer.assignment, self.max_records, self.max_wait_ms)
        try:
            while not self._stop.is_set():
                msgs = self._poll(consumer)
                if time.monotonic() - last_lag > 1.0:
                    with self.clock.section("consumer.lag"):  # a broker round trip only when idle
                        self._update_lag(consumer, probe=not msgs)
                    self.save_counters()  # also the heartbeat of this replica
                    last_lag = time.monotonic()
                if not msgs:
                    self._drain()  # idle: nothing to overlap the acks with, commit now
                    if self._lag == 0:
                        self._progress = time.monotonic()  # idle with nothing waiting is not a stall
                    continue
                self._process(consumer, producer, self._within_replay_window(consumer, msgs))
            self._drain()
        finally:
            try:
                producer.flush(timeout=5)
            finally:
                producer.close(timeout=5)
                consumer.close()
                log.info("consumer stopped")

    def _poll(self, consumer: Any) -> list[Any]:
        """One micro-batch: closes at ``max_records`` or when its first record has waited ``max_wait_ms``.

        Under low load a transaction does not wait for a batch to fill; under
        load, batches grow up to ``max_records`` and amortise the per-batch
        store round trips and the produce flush.
        """
        with self.clock.section("consumer.poll"):
            self._rebalance.revoked.clear()
            msgs = consumer.poll(timeout_ms=100, max_records=self.max_records)
            if msgs and self.max_wait_ms > 0:
                deadline = time.monotonic() + self.max_wait_ms / 1000
                while len(msgs) < self.max_records:
                    left_ms = int((deadline - time.monotonic()) * 1000)
                    if left_ms <= 0:
                        break
                    msgs += consumer.poll(timeout_ms=left_ms, max_records=self.max_records - len(msgs))
            return _without(msgs, self._rebalance.revoked)

    def _drain(self) -> None:
        """Confirm and commit every scored batch (:meth:`fedfraud.serving.acks.AckWindow.drain`)."""
        self._acks.drain()
        self._uncommitted.clear()

    def _within_replay_window(self, consumer: Any, msgs: list[Any]) -> list[Any]:
        """``msgs`` cut so that no cardholder (message key) has more than ``replay_window`` uncommitted
        transactions; each partition is sought back to its first message left out (read again next poll).
        Commits first when the batches awaiting acks already fill a cardholder's window.
        """
        window = self.replay_window
        wanted = Counter(m.key for m in msgs)
        if any(self._uncommitted[k] + n > window for k, n in wanted.items()):
            self._drain()  # commit what is scored: those transactions can no longer be redelivered
        if all(self._uncommitted[k] + n <= window for k, n in wanted.items()):
            self._uncommitted.update(wanted)
            return msgs
        kept: list[Any] = []
        cut: dict[tuple[str, int], int] = {}
        for m in msgs:  # poll order: offsets ascend within each partition
            tp = (m.topic, m.partition)
            if tp in cut:
                continue
            if self._uncommitted[m.key] >= window:
                cut[tp] = m.offset
                continue
            self._uncommitted[m.key] += 1
            kept.append(m)
        for tp, offset in cut.items():
            consumer.seek(tp, offset)
        log.info("micro-batch cut to %d of %d records: a cardholder reached %d uncommitted transactions",
                 len(kept), len(msgs), window)
        return kept

    def _process(self, consumer: Any, producer: Any, msgs: list[Any]) -> None:
        """Decode, score, dead-letter, confirm, commit, account: one micro-batch, start to end."""
        t0, picked_us = time.perf_counter(), now_us()
        self.metrics.consumed.inc(len(msgs))
        self.metrics.inflight.inc(len(msgs))
        self.metrics.batch_size.observe(len(msgs))
        self._inflight += len(msgs)
        offsets: dict[Partition, int] = {}
        with self.clock.section("consumer.decode"):
            for m in msgs:
                tp = (m.topic, m.partition)
                offsets[tp] = max(offsets.get(tp, -1), m.offset + 1)
            decoded = decode_messages(msgs, self.validator, self.guards.max_message_bytes)
            futures = [self._dead_letter(producer, dead) for dead in decoded.dead]
        dead_reasons = [dead.reason for dead in decoded.dead]
        sends: list[Any] = []
        records = self._scoring.score(decoded, sends) if len(decoded.frame) else []
        took = time.perf_counter() - t0
        self.metrics.stage.labels(stage="score").observe(took)
        if took > 0.25 and took > 0.002 * len(msgs):  # a stall, not a large batch (~0.2–0.5 ms per record)
            log.warning("slow micro-batch: %.0f ms for %d records", took * 1e3, len(msgs))
        self._split_latency(picked_us, records)
        with self.clock.section("consumer.commit"):
            futures += sends + self._rejects_and_copies(producer, decoded, records, dead_reasons)
            # committed once every send of this batch and of the batches before it is acknowledged
            # (DeliveryError: the loop stops uncommitted; Serve restarts it and the batch is redelivered)
            self._acks.add(futures, offsets, lambda: self._acked(records, decoded, dead_reasons))

    def _split_latency(self, picked_us: int, records: list[dict[str, Any]]) -> None:
        """Each decision's produce → decision time in two parts: until this replica picked its micro-batch up
        (the producer's linger, the broker, the fetch wait, the batch window, the batches ahead of it) and from
        there to the decision (decode and the hot path).
        """
        fresh = [r for r in records if r["decision"] != "rejected" and "decided_us" in r and "produced_us" in r]
        self.clock.observe("latency.produced_to_picked", [max(picked_us - r["produced_us"], 0) / 1e6 for r in fresh])
        self.clock.observe("latency.picked_to_decided", [max(r["decided_us"] - picked_us, 0) / 1e6 for r in fresh])

    def _made_progress(self) -> None:
        self._progress = time.monotonic()

    def _acked(self, records: list[dict[str, Any]], decoded: DecodedBatch, dead_reasons: list[str]) -> None:
        """A batch's sends are acknowledged: count it (the counters never run ahead of the topics)."""
        self._progress = time.monotonic()
        self._account(records, decoded, dead_reasons)

    def _commit(self, consumer: IngressConsumer, offsets: dict[Partition, int], asynchronous: bool = False) -> None:
        try:
            with self.clock.section("consumer.offset_commit"):
                consumer.commit(offsets, asynchronous=asynchronous)
        except CommitFailed as exc:  # lost the partitions in a rebalance: the new owner redelivers
            log.warning("commit failed (%s); the batches will be redelivered and re-emitted as redelivered", exc)
        self._progress = time.monotonic()
        self.save_counters()

    def save_counters(self) -> None:
        """Persist this replica's counts (:class:`fedfraud.serving.metrics.DurableCounters`); errors logged."""
        if self.durable is None:
            return
        try:
            with self.clock.section("consumer.save_counters"):
                self.durable.save(self.metrics.snapshot())
        except Exception as exc:  # counters are observability; the store's health shows on /readyz
            log.warning("saving counters failed: %s", exc)

    def _dead_letter(self, producer: Any, dead: DeadLetter) -> Any:
        """Send one dead letter, built and masked by :func:`fedfraud.serving.kafka.dead_letters.dlq_value` (raw bytes
        only if the operator opted in); returns the send future, checked before the commit.
        """
        key, value, headers = dlq_message(dead, self.guards.dlq_payload_bytes, self.guards.dlq_raw_capture)
        return producer.send(self.serving.topics.dlq, key=key, value=value, headers=headers)

    def _rejects_and_copies(self, producer: Any, d: DecodedBatch, records: list[dict[str, Any]],
                            dead_reasons: list[str]) -> list[Any]:
        """Dead-letter rows the stages rejected, emit in-batch copies (appended to ``records``); send futures."""
        futures: list[Any] = []

        def dead_letter(msg: Any, reason: str, detail: str) -> None:
            futures.append(self._dead_letter(producer, dead_letter_of(msg, reason, detail)))
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
            m.set_model("anomaly", decided[-1]["models"]["anomaly"])
            m.set_model("fraud", decided[-1]["models"]["fraud"])

    def _update_lag(self, consumer: IngressConsumer, probe: bool = True) -> None:
        """Lag from the end offsets librdkafka keeps (no round trip); ``probe``: ask the broker too (health)."""
        try:
            if probe:  # while records flow the broker has just answered a fetch: no need to ask it
                consumer.probe()
            self._lag = consumer.lag(cached=True)
            self.metrics.lag.set(self._lag)
            self._broker_error = None
        except Exception as exc:  # the broker did not answer: health says so
            self._broker_error = f"{exc.__class__.__name__}: {str(exc)[:200]}"
            log.warning("broker unreachable: %s", self._broker_error)

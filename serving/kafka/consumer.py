"""The ingress consumer: librdkafka (``confluent-kafka``) with manual commits and a rebalance listener.

Why librdkafka: kafka-python parses fetched record batches in Python on the
scoring thread (~0.1 ms per record in ``fedfraud bench serving``) and runs its
heartbeat thread under the same GIL; librdkafka fetches, decodes and
heartbeats in C threads, and ``consume`` hands over a ready batch.

Kafka's consumer contract is kept as the scoring loop needs it:

* manual commits only (``enable.auto.commit`` off): the loop commits an offset
  after the batch's decisions are acknowledged (at-least-once);
* offsets are committed synchronously (the commit is the at-least-once
  point, so a failure must be seen);
* the rebalance listener runs inside :meth:`IngressConsumer.poll`, on the
  loop's thread, before partitions are given away (``on_revoke``: commit what
  is scored) and after new ones arrive (eager protocol, librdkafka's
  ``range`` assignor);
* ``assignment: manual`` assigns every partition without a group protocol.

The tools that read topics end to end (replay's ``collect``, the label joiner, the analyst console, the test
helpers) make their consumer with :func:`make_reader` and read with the helpers beside it
(:func:`wait_for_partitions`, :func:`watermarks`, :func:`assign_from`, :func:`take`): one place builds every
librdkafka consumer, with the one security mapping, :meth:`fedfraud.serving.config.KafkaSecurity.librdkafka`.

Partitions are named ``(topic, partition)`` tuples, so nothing outside this
module depends on the client library.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fedfraud.serving.config import ConsumerSettings, KafkaSecurity

__all__ = ["CommitFailed", "IngressConsumer", "Partition", "Record", "assign_from", "caught_up", "make_consumer",
           "make_reader", "take", "wait_for_partitions", "watermarks"]

log = logging.getLogger(__name__)

Partition = tuple[str, int]


class CommitFailed(RuntimeError):
    """The group coordinator refused a commit (partitions lost in a rebalance): the new owner redelivers."""


@dataclass(frozen=True, slots=True)
class Record:
    """One consumed message (the fields :func:`fedfraud.serving.kafka.decode_messages` reads)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None
    timestamp: int  # ms since the epoch (the broker's or the producer's)


Listener = Callable[[list[Partition]], None]


class IngressConsumer:
    """A librdkafka consumer behind the few calls the scoring loop makes."""

    def __init__(self, config: dict[str, Any], topic: str, settings: ConsumerSettings,
                 on_assign: Listener | None = None, on_revoke: Listener | None = None,
                 on_lost: Listener | None = None) -> None:
        from confluent_kafka import Consumer

        self.topic = topic
        self.settings = settings
        self._rd = Consumer({**config, "logger": logging.getLogger("librdkafka"), "on_commit": _commit_result})
        self._on_assign, self._on_revoke, self._on_lost = on_assign, on_revoke, on_lost
        if settings.assignment == "manual":
            from confluent_kafka import TopicPartition

            parts = self.partitions(settings.request_timeout_ms / 1000)
            self._rd.assign([TopicPartition(topic, p) for p in sorted(parts)])
        else:
            self._rd.subscribe([topic], on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._lost)

    # ------------------------------------------------------------------ rebalance listener (inside poll)
    def _assigned(self, _c: Any, parts: Sequence[Any]) -> None:
        if self._on_assign is not None:
            self._on_assign([(p.topic, p.partition) for p in parts])

    def _revoked(self, _c: Any, parts: Sequence[Any]) -> None:
        if self._on_revoke is not None:
            self._on_revoke([(p.topic, p.partition) for p in parts])

    def _lost(self, _c: Any, parts: Sequence[Any]) -> None:
        if self._on_lost is not None:
            self._on_lost([(p.topic, p.partition) for p in parts])

    # ------------------------------------------------------------------ the calls of the loop
    def poll(self, timeout_ms: int, max_records: int) -> list[Record]:
        """Up to ``max_records`` messages, returning as soon as there is one (waiting at most ``timeout_ms``).

        librdkafka's ``consume(n, timeout)`` waits for all ``n`` until the
        timeout, which would hold a lone transaction for the whole timeout; so
        take what is queued, else wait for one message, then take what queued
        behind it. (The loop's own window, ``max_batch_wait_ms``, decides how
        long a batch waits to fill.)
        """
        return take(self._rd, timeout_ms, max_records)

    def seek(self, partition: Partition, offset: int) -> None:
        """Read ``partition`` again from ``offset`` on the next poll."""
        from confluent_kafka import TopicPartition

        self._rd.seek(TopicPartition(partition[0], partition[1], offset))

    def commit(self, offsets: dict[Partition, int], asynchronous: bool = False) -> None:
        """Commit ``offsets`` (next offset to read); :class:`CommitFailed` if a synchronous commit is refused.

        ``asynchronous`` sends the commit without waiting for the coordinator, the pattern of Kafka's own
        clients for the periodic commit in the loop (``commitAsync``); a synchronous commit goes before
        partitions are given away and at stop (``commitSync``). librdkafka sends a consumer's commits in
        order, so a later commit never lands before an earlier one; a failed one is logged by
        ``on_commit`` and costs at most a redelivery of what it covered (at-least-once).
        """
        from confluent_kafka import KafkaException, TopicPartition

        parts = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        if asynchronous:
            self._rd.commit(offsets=parts, asynchronous=True)
            return
        try:
            result = self._rd.commit(offsets=parts, asynchronous=False)
        except KafkaException as exc:
            raise CommitFailed(str(exc)) from exc
        failed = [tp for tp in result or () if tp.error is not None]
        if failed:
            raise CommitFailed(f"{failed[0].topic}[{failed[0].partition}]: {failed[0].error}")

    def committed(self, partitions: Sequence[Partition], timeout_s: float = 10.0) -> dict[Partition, int]:
        """The group's committed offsets (-1: none yet)."""
        from confluent_kafka import TopicPartition

        got = self._rd.committed([TopicPartition(t, p) for t, p in partitions], timeout=timeout_s)
        return {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else -1) for tp in got}

    def assignment(self) -> list[Partition]:
        return [(tp.topic, tp.partition) for tp in self._rd.assignment()]

    def lag(self, timeout_s: float = 5.0, cached: bool = False) -> int:
        """Messages in the assigned partitions not yet consumed (end offset − position).

        A broker round trip per partition, unless ``cached``: then the end offsets are the ones librdkafka
        keeps from its fetch responses (no round trip; a partition it has not fetched yet is still asked).
        The consumer loop asks ``cached``, so a lag figure never stalls a micro-batch (a ListOffsets round
        trip cost ~26 ms on the embedded broker, and its answer can trail the log there).
        """
        from confluent_kafka import TopicPartition

        parts = self._rd.assignment()
        if not parts:
            self._rd.list_topics(self.topic, timeout=timeout_s)  # a round trip all the same: raises if down
            return 0
        positions = self._rd.position(parts)
        total = 0
        missing = [tp for tp in positions if tp.offset < 0]
        known = {(tp.topic, tp.partition): tp.offset for tp in positions if tp.offset >= 0}
        if missing:  # nothing fetched yet: the committed offset is where reading starts
            known.update({k: v for k, v in self.committed([(tp.topic, tp.partition) for tp in missing],
                                                          timeout_s).items() if v >= 0})
        for tp in parts:
            part = TopicPartition(tp.topic, tp.partition)
            got = self._rd.get_watermark_offsets(part, cached=True) if cached else None
            if not got or got[1] < 0:  # not fetched yet (OFFSET_INVALID): ask the broker
                got = self._rd.get_watermark_offsets(part, timeout=timeout_s, cached=False)
            if not got:
                raise TimeoutError(f"no end offset for {tp.topic}[{tp.partition}] within {timeout_s}s")
            high = got[1]
            total += max(high - known.get((tp.topic, tp.partition), 0), 0)
        return total

    def probe(self, timeout_s: float = 5.0) -> None:
        """One metadata round trip to the broker; raises if it does not answer (the loop's health probe)."""
        self._rd.list_topics(self.topic, timeout=timeout_s)

    def partitions(self, timeout_s: float = 10.0) -> set[int]:
        """The topic's partitions, waiting for a fresh client's metadata."""
        return wait_for_partitions(self._rd, self.topic, timeout_s)

    def close(self) -> None:
        """Leave the group (partitions go to the others at once) and stop the client's threads."""
        self._rd.close()


def _commit_result(err: Any, partitions: Sequence[Any]) -> None:
    """Log librdkafka's report of a failed commit (served inside ``poll``) when an asynchronous one failed:
    the next commit covers its offsets, or a rebalance redelivers them.
    """
    failed = [tp for tp in partitions or () if tp.error is not None]
    if err is not None or failed:
        log.warning("asynchronous commit failed: %s", err or failed[0].error)


def make_consumer(bootstrap_servers: str, settings: ConsumerSettings, topic: str, group_id: str | None = None,
                  on_assign: Listener | None = None, on_revoke: Listener | None = None,
                  on_lost: Listener | None = None, security: KafkaSecurity | None = None) -> IngressConsumer:
    """The ingress consumer: manual commits (at-least-once), group or manual partition assignment, with the
    deployment's :class:`~fedfraud.serving.config.KafkaSecurity`.
    """
    config = {
        **(security or KafkaSecurity()).librdkafka(),
        "bootstrap.servers": bootstrap_servers,
        "group.id": group_id or settings.group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": settings.auto_offset_reset,
        "session.timeout.ms": settings.session_timeout_ms,
        "heartbeat.interval.ms": settings.heartbeat_interval_ms,
        "max.poll.interval.ms": settings.max_poll_interval_ms,
        "socket.timeout.ms": settings.request_timeout_ms,
        "fetch.wait.max.ms": settings.fetch_max_wait_ms,
        "partition.assignment.strategy": "range",
    }
    return IngressConsumer(config, topic, settings, on_assign, on_revoke, on_lost)


# ---------------------------------------------------------------------------------------------------- readers
def take(rd: Any, timeout_ms: int, max_records: int) -> list[Record]:
    """Up to ``max_records`` messages of librdkafka consumer ``rd``, returning as soon as there is one (waiting at
    most ``timeout_ms``).

    librdkafka's ``consume(n, timeout)`` waits for all ``n`` until the timeout, which would hold a lone record
    for the whole timeout; so take what is queued, else wait for one message, then take what queued behind it.
    """
    got = rd.consume(num_messages=max_records, timeout=0)
    if not got and timeout_ms > 0:
        first = rd.poll(timeout_ms / 1000)
        if first is not None:
            got = [first]
            if max_records > 1:
                got += rd.consume(num_messages=max_records - 1, timeout=0)
    out: list[Record] = []
    for m in got:
        err = m.error()
        if err is not None:  # a fetch error for one partition; librdkafka retries on its own
            log.warning("consume error on %s[%s]: %s", m.topic(), m.partition(), err)
            continue
        out.append(Record(m.topic(), m.partition(), m.offset(), m.key(), m.value(), m.headers(), m.timestamp()[1]))
    return out


def make_reader(bootstrap_servers: str, client_id: str = "fedfraud-reader", fetch_max_wait_ms: int = 100,
                security: KafkaSecurity | None = None, **properties: Any) -> Any:
    """A librdkafka consumer for reading assigned partitions (:func:`assign_from`), never a group member.

    librdkafka needs a ``group.id`` even when nothing subscribes: a throwaway one, and nothing is ever
    committed to it (auto commit and offset store off). ``fetch_max_wait_ms`` is how long the broker may
    hold a fetch for more data, the latency knob of small reads; ``properties`` are further librdkafka
    properties (``max.partition.fetch.bytes``, ...).
    """
    from confluent_kafka import Consumer

    config = {
        **(security or KafkaSecurity()).librdkafka(),
        "bootstrap.servers": bootstrap_servers,
        "client.id": client_id,
        "group.id": f"{client_id}-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": fetch_max_wait_ms,
        "logger": logging.getLogger("librdkafka"),
        **properties,
    }
    return Consumer(config)


def wait_for_partitions(client: Any, topic: str, timeout_s: float = 10.0) -> set[int]:
    """The topic's partitions, asked of any librdkafka client (consumer, producer, admin). A fresh client may not
    have the metadata yet, so wait for it: an empty answer taken at face value made end offsets look like "from
    the beginning".
    """
    deadline = time.monotonic() + timeout_s
    while True:
        meta = client.list_topics(topic, timeout=max(deadline - time.monotonic(), 0.1))
        found = meta.topics.get(topic)
        if found is not None and found.error is None and found.partitions:
            return set(found.partitions)
        if time.monotonic() >= deadline:
            raise RuntimeError(f"topic {topic!r} has no partitions (does it exist?)")
        time.sleep(0.05)


def watermarks(consumer: Any, partitions: Iterable[Partition], timeout_s: float = 10.0
               ) -> dict[Partition, tuple[int, int]]:
    """``(low, high)`` offsets of each partition, asked of the broker: the first offset still kept and the next
    offset to be written (its end).
    """
    from confluent_kafka import TopicPartition

    out: dict[Partition, tuple[int, int]] = {}
    for topic, partition in partitions:
        got = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_s, cached=False)
        if not got:
            raise TimeoutError(f"no offsets for {topic}[{partition}] within {timeout_s}s")
        out[(topic, partition)] = (int(got[0]), int(got[1]))
    return out


def assign_from(consumer: Any, starts: Mapping[Partition, int | None]) -> None:
    """Assign exactly these partitions, each read from its offset (None: from its beginning)."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING if off is None else off)
                     for (t, p), off in starts.items()])


def caught_up(positions: Mapping[Partition, int], ends: Mapping[Partition, tuple[int, int]]) -> bool:
    """True when every partition's next offset to read (``positions``) is at its end; offsets below the low
    watermark are gone (the reader resets to the earliest kept one), so they count as read.
    """
    return all(max(positions.get(part, 0), low) >= high for part, (low, high) in ends.items())

"""The consumer's at-least-once machinery on the embedded broker: async acks commit in order, and no
cardholder ever has more uncommitted transactions than the stages can recognise as redeliveries.
"""

from __future__ import annotations

import time
import uuid

import pytest

pytestmark = pytest.mark.integration


def _topic(broker, partitions: int = 1) -> str:
    from fedfraud.serving.kafka.broker import create_topics

    name = f"t-{uuid.uuid4().hex[:8]}"
    create_topics(broker.bootstrap_servers, {name: partitions})
    return name


def _consumer(broker, topic: str):
    from fedfraud.serving.config import ConsumerSettings
    from fedfraud.serving.kafka import make_consumer

    return make_consumer(broker.bootstrap_servers, ConsumerSettings(assignment="manual"), topic,
                         group_id=f"g-{uuid.uuid4().hex[:8]}")


def _poll_all(consumer, n: int, timeout_s: float = 20.0) -> list:
    out: list = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        out += consumer.poll(timeout_ms=200, max_records=500)
    return out


def test_a_cardholder_never_has_more_uncommitted_transactions_than_the_replay_rings_hold(kafka_broker):
    """40 messages of one cardholder and 5 of another: a batch is cut at the window and the partition is
    sought back, so the cut-off messages come again on the next poll, in order, and nothing is skipped."""
    from fedfraud.serving.config import ServingConfig
    from fedfraud.serving.consumer import StreamConsumer
    from fedfraud.serving.kafka import make_producer

    topic = _topic(kafka_broker)
    s = ServingConfig()
    producer = make_producer(kafka_broker.bootstrap_servers, s.producer, client_id="test-window")
    keys = [b"hot"] * 30 + [b"cold"] * 5 + [b"hot"] * 10
    for i, key in enumerate(keys):
        producer.send(topic, key=key, value=str(i).encode())
    producer.flush()
    consumer = _consumer(kafka_broker, topic)
    stream = StreamConsumer(s, kafka_broker.bootstrap_servers, score=lambda *a, **k: [], replay_window=16)
    stream._acks = _NoPending()
    first = stream._within_replay_window(consumer, _poll_all(consumer, len(keys)))
    assert [m.offset for m in first] == list(range(16))  # the hot cardholder's 17th message cuts the partition
    stream._drain()  # what the loop does once those are scored: commit, and the window opens again
    rest = _poll_all(consumer, len(keys) - 16)
    assert [m.offset for m in rest] == list(range(16, len(keys)))  # read again from the cut, nothing skipped
    second = stream._within_replay_window(consumer, rest)
    assert [m.offset for m in second] == list(range(16, 37))  # 14 + 2 hot (16 in all), and the 5 cold ones
    consumer.close()
    producer.close()


class _NoPending:
    """An empty ack window (nothing scored yet): draining it commits nothing."""

    def __len__(self) -> int:
        return 0

    def drain(self) -> int:
        return 0


def test_offsets_are_committed_in_order_and_only_once_the_broker_acknowledged(kafka_broker):
    from fedfraud.serving.acks import AckWindow
    from fedfraud.serving.config import ServingConfig
    from fedfraud.serving.kafka import DeliveryError, make_producer

    topic = _topic(kafka_broker)
    out_topic = _topic(kafka_broker)
    s = ServingConfig()
    producer = make_producer(kafka_broker.bootstrap_servers, s.producer, client_id="test-acks")
    for i in range(6):
        producer.send(topic, value=str(i).encode())
    producer.flush()
    consumer = _consumer(kafka_broker, topic)
    msgs = _poll_all(consumer, 6)
    tp = (topic, 0)
    committed: list[tuple[int, bool]] = []

    def commit(offsets, asynchronous):
        consumer.commit(offsets, asynchronous=asynchronous)
        committed.append((offsets[tp], asynchronous))

    acked: list[int] = []
    window = AckWindow(max_batches=8, commit_interval_ms=0, commit=commit)
    for batch in (msgs[:2], msgs[2:4], msgs[4:]):
        sends = [producer.send(out_topic, value=m.value) for m in batch]
        window.add(sends, {tp: batch[-1].offset + 1}, lambda b=batch: acked.append(b[-1].offset))
    window.drain()
    assert acked == [1, 3, 5] and committed[-1] == (6, False)  # in order, up to the last acknowledged batch
    # the loop's periodic commits go asynchronously, the drain's synchronously (commitAsync / commitSync)
    assert all(asynchronous for _, asynchronous in committed[:-1])
    assert [offset for offset, _ in committed] == sorted(offset for offset, _ in committed)
    assert consumer.committed([tp]) == {tp: 6}

    # a send that never reaches its broker (every connection to it cut): DeliveryError, offset never committed
    from fedfraud.core.tcpproxy import TcpProxy
    from fedfraud.serving.kafka.broker import EmbeddedBroker, free_port

    broker_port = free_port()
    proxy = TcpProxy(broker_port).start()
    with EmbeddedBroker(topics={"out": 1}, port=broker_port, advertised_port=proxy.port) as other:
        lost = make_producer(other.bootstrap_servers, s.producer.model_copy(update={"delivery_timeout_ms": 2000}))
        lost.send("out", value=b"reached").get(timeout=10)
        proxy.cut()
        window.add([lost.send("out", value=b"never")], {tp: 99}, lambda: acked.append(99))
        with pytest.raises(DeliveryError):
            window.drain()
        lost.close(timeout=1)
    assert consumer.committed([tp]) == {tp: 6} and 99 not in acked
    consumer.close()
    producer.close()


def test_lag_from_fetched_end_offsets_counts_what_is_left_to_read(kafka_broker):
    """The loop's cheap lag (end offsets librdkafka kept from its fetches, no round trip) counts exactly the
    records not yet read. (The embedded Tansu broker's ListOffsets answer can trail its log, so the broker's
    own figure is not the reference here: reading the records is.)
    """
    from fedfraud.serving.config import ProducerSettings
    from fedfraud.serving.kafka import make_producer

    topic = _topic(kafka_broker, partitions=2)
    producer = make_producer(kafka_broker.bootstrap_servers, ProducerSettings(), client_id="test-lag")
    for i in range(10):
        producer.send(topic, key=f"k{i}".encode(), value=str(i).encode())
    producer.flush()
    consumer = _consumer(kafka_broker, topic)
    assert len(_poll_all(consumer, 10)) == 10
    assert consumer.lag(cached=True) == 0
    for i in range(5):
        producer.send(topic, key=f"k{i}".encode(), value=b"more")
    producer.flush()
    deadline = time.monotonic() + 10
    while consumer.lag(cached=True) < 5 and time.monotonic() < deadline:  # librdkafka's prefetch updates it
        time.sleep(0.05)
    assert consumer.lag(cached=True) == 5
    assert len(_poll_all(consumer, 5)) == 5 and consumer.lag(cached=True) == 0
    consumer.close()

"""The pipeline's Kafka producer: librdkafka (``confluent-kafka``) behind a small send/future interface.

Why librdkafka: kafka-python builds and compresses record batches in Python on
a sender thread that shares the GIL with the scoring thread. Measured in
``fedfraud bench serving``, its ``send`` cost ~0.1 ms per record on the
scoring thread plus the sender thread's time, for two records per
transaction; librdkafka does the same work in C threads that never hold the
GIL (~3 µs per ``produce`` call).

Every producer of the project (scorer, DLQ, label joiner, replay tool,
benches) is made by :func:`make_producer`, so the delivery contract is the same
everywhere:

* :meth:`Producer.send` returns a :class:`Delivery`, resolved by librdkafka's
  delivery report (the broker's acknowledgement under ``acks=all``, or the
  error that ended the record's retries);
* :meth:`Delivery.get` waits for it and raises :class:`DeliveryError` on a failure;
* :func:`confirm_sent` flushes and checks a list of deliveries: the
  at-least-once point before input offsets are committed.

Delivery reports are served by ``poll``/``flush`` on the calling thread (the
librdkafka model); :class:`Delivery` polls when asked whether it is done, so
no extra thread is needed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from fedfraud.serving.config import KafkaSecurity, ProducerSettings

__all__ = ["Delivery", "DeliveryError", "Producer", "confirm_sent", "make_producer"]

log = logging.getLogger(__name__)


class DeliveryError(RuntimeError):
    """The broker did not acknowledge a record: the caller must not commit the input offsets."""


class Delivery:
    """The outcome of one :meth:`Producer.send`: pending, acknowledged (offset known) or failed."""

    __slots__ = ("_owner", "_done", "exception", "offset", "partition")

    def __init__(self, owner: Producer | None) -> None:
        self._owner = owner
        self._done = False
        self.exception: BaseException | None = None
        self.offset = -1
        self.partition = -1

    def _resolve(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.exception = DeliveryError(f"{err.name()}: {err.str()}")
        else:
            self.partition, self.offset = msg.partition(), msg.offset()
        self._done = True

    def _fail(self, exc: BaseException) -> Delivery:
        self.exception, self._done = exc, True
        return self

    @property
    def is_done(self) -> bool:
        """Resolved either way; serves pending delivery reports first (never blocks)."""
        if not self._done and self._owner is not None:
            self._owner.poll(0)
        return self._done

    def failed(self) -> bool:
        return self.is_done and self.exception is not None

    def succeeded(self) -> bool:
        return self.is_done and self.exception is None

    def get(self, timeout: float | None = None) -> Delivery:
        """Wait up to ``timeout`` s for the broker: this delivery, acknowledged (``partition``, ``offset`` set),
        or :class:`DeliveryError`.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._done:
            left = 0.1 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise DeliveryError(f"no acknowledgement within {timeout:g}s")
            assert self._owner is not None
            self._owner.poll(min(left, 0.1))
        if self.exception is not None:
            raise self.exception
        return self


class Producer:
    """A librdkafka producer with :class:`Delivery` futures; thread-safe (librdkafka's producer is)."""

    def __init__(self, config: dict[str, Any]) -> None:
        from confluent_kafka import Producer as _Rd

        self._rd: Any = _Rd({**config, "logger": logging.getLogger("librdkafka")})
        self.closed = False

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None,
             headers: Sequence[tuple[str, bytes]] | None = None) -> Delivery:
        """Queue one record; a record librdkafka refuses at once (too large, unknown topic) is a failed delivery."""
        from confluent_kafka import KafkaException

        delivery = Delivery(self)
        if self._rd is None:
            return delivery._fail(DeliveryError("producer closed"))
        while True:
            try:
                self._rd.produce(topic, value=value, key=key, headers=list(headers) if headers else None,
                                 on_delivery=delivery._resolve)
                return delivery
            except BufferError:  # the local queue is full: serve reports until there is room
                self.poll(0.05)
            except KafkaException as exc:
                return delivery._fail(DeliveryError(str(exc)))

    def poll(self, timeout: float = 0.0) -> None:
        """Serve delivery reports on this thread (librdkafka's poll is thread-safe)."""
        if self._rd is not None:
            self._rd.poll(timeout)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued record is acknowledged or failed; :class:`DeliveryError` on timeout."""
        if self._rd is None:
            return
        left = self._rd.flush(-1 if timeout is None else timeout)
        if left:
            raise DeliveryError(f"{left} record(s) still unacknowledged after {timeout:g}s")

    def close(self, timeout: float | None = 5.0) -> None:
        """Flush what is queued (bounded by ``timeout``); a record left over is logged, not raised."""
        if self.closed:
            return
        self.closed = True
        try:
            self.flush(timeout)
        except DeliveryError as exc:
            log.warning("producer closed with %s", exc)
        finally:
            self._rd = None  # librdkafka's threads and connections end with the handle


def make_producer(bootstrap_servers: str, settings: ProducerSettings, client_id: str = "fedfraud",
                  security: KafkaSecurity | None = None) -> Producer:
    """A producer with the pipeline's durability settings (acks=all, idempotent by default) and the
    deployment's :class:`~fedfraud.serving.config.KafkaSecurity` (plaintext only when none is given).
    """
    config: dict[str, Any] = {
        **(security or KafkaSecurity()).librdkafka(),
        "bootstrap.servers": bootstrap_servers,
        "client.id": client_id,
        "acks": settings.acks,
        "enable.idempotence": settings.enable_idempotence,
        "linger.ms": settings.linger_ms,
        "batch.size": settings.batch_size,
        "compression.type": settings.compression_type or "none",
        "message.timeout.ms": settings.delivery_timeout_ms,
        "message.max.bytes": settings.max_request_size,
    }
    if settings.enable_idempotence:
        config["max.in.flight.requests.per.connection"] = 5
    return Producer(config)


def confirm_sent(producer: Producer, futures: Sequence[Delivery], timeout_s: float = 30.0) -> None:
    """Flush, then check every send; raise :class:`DeliveryError` on the first failure.

    A flush that returns does not mean every record arrived: a record can end
    in an error (a dead broker, a record over the size limit), so each
    delivery is checked before anyone commits input offsets.
    """
    producer.flush(timeout=timeout_s)
    for future in futures:
        if not future.is_done:
            raise DeliveryError("a send was still pending after flush")
        if future.exception is not None:
            raise DeliveryError(f"send failed: {future.exception!r}") from future.exception

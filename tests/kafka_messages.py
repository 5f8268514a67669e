"""A consumer record as ``fedfraud.serving.kafka.decode_messages`` reads it, for tests without a broker."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Msg:
    """The fields of a librdkafka ``Message`` that decoding reads (``key``, ``value``, ``headers``, ...)."""

    value: bytes
    offset: int
    key: bytes | None = b"k"
    headers: tuple = ()
    timestamp: int = 1_700_000_000_000
    topic: str = "transactions"
    partition: int = 0

"""Asynchronous broker acknowledgements with in-order commits: the consumer's at-least-once point.

A micro-batch's decisions, anomaly scores and dead letters are *sent* when it
is scored; waiting for the broker to acknowledge them before scoring the next
batch put one round trip (~7 ms on the embedded broker) into every batch's
service time. :class:`AckWindow` keeps up to ``max_batches`` batches whose sends
are in flight while the consumer scores the next ones, and commits an input
offset only when every send of its batch *and of all batches before it* is
acknowledged. A failed send raises :class:`fedfraud.serving.kafka.DeliveryError` and
nothing after it is committed, so a restart redelivers those batches (the
stages re-emit stored decisions marked ``redelivered``).

Commits are batched to at most one per ``commit_interval_ms`` and sent
asynchronously (no coordinator round trip in a batch's service time); :meth:`drain`
confirms and commits everything synchronously (before a rebalance gives partitions
away, and at stop), as Kafka's consumer contract asks.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fedfraud.serving.kafka import DeliveryError

__all__ = ["AckWindow"]

log = logging.getLogger(__name__)


@dataclass
class _Batch:
    futures: list[Any]
    offsets: dict[Any, int]  # TopicPartition -> next offset to read
    on_acked: Callable[[], None]


class AckWindow:
    """Batches awaiting broker acks, oldest first; :meth:`add`, :meth:`settle`, :meth:`drain`."""

    def __init__(self, max_batches: int, commit_interval_ms: int, commit: Callable[[dict[Any, int], bool], None],
                 timeout_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_batches = max_batches
        self.commit_interval_s = commit_interval_ms / 1000
        self.timeout_s = timeout_s
        self._commit = commit
        self._clock = clock
        self._batches: deque[_Batch] = deque()
        self._ready: dict[Any, int] = {}
        self._unsynced: dict[Any, int] = {}  # committed asynchronously since the last synchronous commit
        self._last_commit = clock()

    def __len__(self) -> int:
        return len(self._batches)

    def add(self, futures: list[Any], offsets: dict[Any, int], on_acked: Callable[[], None]) -> None:
        """Track one scored batch; then settle what is acknowledged (waiting if the window is full)."""
        self._batches.append(_Batch(futures, offsets, on_acked))
        self.settle()

    def settle(self, block: bool = False) -> int:
        """Confirm acknowledged batches in order (all of them when ``block``); commit if due. Returns how many."""
        done = 0
        while self._batches:
            head = self._batches[0]
            must_wait = block or len(self._batches) > self.max_batches
            if not must_wait and not all(f.is_done for f in head.futures):
                break
            self._confirm(head.futures)
            self._batches.popleft()
            for tp, offset in head.offsets.items():
                self._ready[tp] = max(self._ready.get(tp, -1), offset)
            head.on_acked()
            done += 1
        if block and self._unsynced:  # a drain also makes sure the asynchronous commits before it landed
            for tp, offset in self._unsynced.items():
                self._ready[tp] = max(self._ready.get(tp, -1), offset)
            self._unsynced = {}
        if self._ready and (block or self._clock() - self._last_commit >= self.commit_interval_s):
            ready, self._ready = self._ready, {}
            self._commit(ready, not block)  # (offsets, asynchronous)
            if not block:
                for tp, offset in ready.items():
                    self._unsynced[tp] = max(self._unsynced.get(tp, -1), offset)
            self._last_commit = self._clock()
        return done

    def drain(self) -> int:
        """Wait for every tracked send, then commit everything acknowledged (rebalance, stop)."""
        return self.settle(block=True)

    def discard(self) -> None:
        """Forget tracked batches without committing them (their partitions were lost: the new owner redelivers)."""
        self._batches.clear()
        self._ready.clear()
        self._unsynced.clear()

    def _confirm(self, futures: list[Any]) -> None:
        deadline = self._clock() + self.timeout_s
        for future in futures:
            try:
                future.get(timeout=max(deadline - self._clock(), 0.001))
            except Exception as exc:  # a failed or timed-out send: nothing from here on may be committed
                raise DeliveryError(f"send not acknowledged: {exc!r}") from exc

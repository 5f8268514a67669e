"""What the consumer does with a micro-batch that fails: bounded retries, bisection, blame, and outages.

:class:`RetryingScorer` scores a decoded micro-batch for the poll loop (:mod:`fedfraud.serving.consumer`).
A failing call is tried ``guards.stage_max_attempts`` times with doubling waits (the one retry policy,
:func:`fedfraud.core.retry.retrying`), then the batch is bisected (:func:`isolate_failures`):
halves are scored serially until each failure is pinned to one record, which
goes to the DLQ as ``processing_error`` while the rest are decided. When every
record fails, or a failure looks like infrastructure (:func:`is_outage`: a
store connection, a timeout, a dead replica), nothing is dead-lettered: the
batch is retried until the outage ends, and health turns red after ``guards.retry_budget_s``
(:attr:`RetryingScorer.retrying_since`). Rows that all fail alone with no sign of infrastructure for longer
than that budget are blamed after all. This is the Kafka-consumer convention of a dead-letter queue for
poison records only, never for an outage.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from fedfraud.core.retry import RetryCallState, RetryError, retrying
from fedfraud.serving.config import GuardSettings
from fedfraud.serving.kafka.codec import DecodedBatch
from fedfraud.serving.metrics import PipelineMetrics

__all__ = ["Outage", "RetryingScorer", "Score", "is_outage", "isolate_failures"]

log = logging.getLogger(__name__)


class Outage(RuntimeError):
    """Scoring fails for infrastructure reasons (store, broker, replica): retry, never dead-letter."""


_OUTAGE_MARKERS = ("Connection", "Timeout", "ActorDied", "ActorError", "ActorUnavailable", "Unavailable",
                   "OperationalError", "BrokenPipe", "DeliveryError")  # a decision the broker refused is not data


def is_outage(exc: BaseException) -> bool:
    """True when ``exc`` (or what it wraps) is an infrastructure failure, not the record's fault.

    Ray re-raises a replica's exception as a class deriving from both
    ``RayTaskError`` and the original, so the class names along the MRO and
    the cause chain tell a Redis ``ConnectionError`` or a dead replica from a
    ``ValueError`` that one record provokes.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (ConnectionError, TimeoutError)):
            return True
        if any(marker in cls.__name__ for cls in type(current).__mro__ for marker in _OUTAGE_MARKERS):
            return True
        current = current.__cause__ or current.__context__ or getattr(current, "cause", None)
    return False


def isolate_failures(rows: Sequence[int], run: Callable[[list[int]], None], blame_all: bool = False) -> dict[int, str]:
    """Call ``run`` on ``rows``, bisecting on failure; return {row: error} of rows that fail alone.

    ``run`` processes a contiguous run of rows in order (so one cardholder's
    transactions keep their order) and raises if any of them fails. A run that
    succeeds is done; a failing run of one row is recorded. Raises
    :class:`Outage` when a failure is infrastructure (:func:`is_outage`) or when
    every row of a multi-row batch fails alone (no record is to blame), unless
    ``blame_all``: the caller has waited that "outage" out long enough and no
    failure looked like infrastructure, so the rows are poison after all.
    Cost: one call for a clean batch, about 2·log2(n) more per poison record.
    """
    errors: dict[int, str] = {}

    def attempt(part: list[int]) -> None:
        try:
            run(part)
        except Exception as exc:
            if is_outage(exc):
                raise Outage(f"{exc.__class__.__name__}: {str(exc)[:200]}") from exc
            if len(part) == 1:
                errors[part[0]] = f"{exc.__class__.__name__}: {str(exc)[:200]}"
                return
            half = len(part) // 2
            attempt(part[:half])
            attempt(part[half:])

    rows = list(rows)
    attempt(rows)
    if len(errors) == len(rows) > 1 and not blame_all:
        raise Outage(f"every record of a {len(rows)}-row batch failed alone: an outage, not a poison record")
    return errors


class Score(Protocol):
    """``score(frame, produced_us, content, sends=futures)`` -> one record per frame row, in frame order (a
    decision or a ``decision: rejected`` record with ``reject_reason``); the decisions are produced and their
    send futures appended to ``sends`` (the consumer confirms them before it commits).
    """

    def __call__(self, frame: Any, produced_us: np.ndarray, content: list[str], *,
                 sends: list[Any]) -> list[dict[str, Any]]: ...


class _StageFailed(RuntimeError):
    """Scoring one micro-batch failed ``stage_max_attempts`` times in a row."""


class RetryingScorer:
    """``score`` of a whole micro-batch through failures: bounded retries, then bisection; outages waited out.

    ``retrying_since`` is when the batch being scored first failed (None: not retrying), for the consumer's
    health; ``progress`` is called whenever a piece is scored, so a long bisection is not taken for a stall;
    ``stopping`` ends the waits (the failure is raised).
    """

    def __init__(self, score: Score, guards: GuardSettings, metrics: PipelineMetrics, stopping: threading.Event,
                 progress: Callable[[], None]) -> None:
        self.score_rows = score
        self.guards = guards
        self.metrics = metrics
        self.stopping = stopping
        self.progress = progress
        self.retrying_since: float | None = None
        # every batch's first try runs through this policy: built once (~10 µs a call), not per batch
        self._tries = retrying(lambda exc: isinstance(exc, Exception) and not self.stopping.is_set(),
                               attempts=guards.stage_max_attempts, first_s=guards.retry_backoff_s, most_s=2.0,
                               after_failure=self._failed, reraise=False)

    def score(self, d: DecodedBatch, sends: list[Any]) -> list[dict[str, Any]]:
        """Records of ``d``'s frame (their send futures into ``sends``): bounded retries, then bisection;
        outages are waited out.
        """
        try:
            return self._retry(lambda: self.score_rows(d.frame, d.produced_us, d.content, sends=sends))
        except _StageFailed:
            pass
        started = time.monotonic()

        def bisect() -> list[dict[str, Any]]:
            # rows that all fail alone, with no sign of infrastructure, for longer than the retry budget: poison
            return self._bisect(d, sends, blame_all=time.monotonic() - started > self.guards.retry_budget_s)

        def outage(state: RetryCallState) -> None:  # nothing is dead-lettered in an outage
            nonlocal started
            exc = state.outcome.exception() if state.outcome is not None else None
            if exc is not None and exc.__cause__ is not None and is_outage(exc.__cause__):
                started = time.monotonic()  # a real infrastructure failure: never blame the rows for it
            log.warning("outage while scoring (%s); retrying in %.1fs", exc,
                        state.next_action.sleep if state.next_action is not None else 0.0)

        return retrying(lambda exc: isinstance(exc, Outage) and not self.stopping.is_set(),
                        first_s=self.guards.retry_backoff_s, most_s=5.0, before_sleep=outage)(bisect)

    def _retry(self, call: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        """``call`` up to ``stage_max_attempts`` times with doubling backoff; :class:`_StageFailed` after."""
        try:
            result = self._tries(call)
        except RetryError:
            raise _StageFailed("scoring") from None
        self.retrying_since = None
        return result

    def _failed(self, state: RetryCallState) -> None:
        """One failed try of a whole batch: counted, logged, and the start of the retrying time (health)."""
        exc = state.outcome.exception() if state.outcome is not None else None
        if self.retrying_since is None:
            self.retrying_since = time.monotonic()
        self.metrics.retries.labels(stage="score").inc()
        log.warning("scoring attempt %d/%d failed (%s: %s)", state.attempt_number, self.guards.stage_max_attempts,
                    exc.__class__.__name__, str(exc)[:200])

    def _bisect(self, d: DecodedBatch, sends: list[Any], blame_all: bool = False) -> list[dict[str, Any]]:
        """Score ``d`` in halves until the records that fail alone are found (:func:`isolate_failures`).

        Returns one record per frame row, in frame order: a decision, or a
        ``rejected`` record with reason ``processing_error``.
        """
        out: dict[int, dict[str, Any]] = {}

        def run(rows: list[int]) -> None:
            piece = d.frame.iloc[rows].reset_index(drop=True)
            content = [d.content[i] for i in rows] if d.content else []
            out.update(zip(rows, self.score_rows(piece, d.produced_us[rows], content, sends=sends), strict=True))
            self.progress()  # a bisection that scores pieces is progress, not a stall
            self.retrying_since = time.monotonic()

        log.warning("bisecting a micro-batch of %d rows to find the records that fail", len(d.frame))
        for i, why in isolate_failures(range(len(d.frame)), run, blame_all).items():
            out[i] = {"transaction_id": str(d.frame["transaction_id"].iloc[i]), "decision": "rejected",
                      "reject_reason": "processing_error", "detail": why}
        self.retrying_since = None
        return [out[i] for i in range(len(d.frame))]

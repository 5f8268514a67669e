"""Finding the records that break scoring, and telling them from an outage.

A micro-batch that fails its bounded retries is bisected (:func:`isolate_failures`):
halves are scored serially until each failure is pinned to one record, which
goes to the DLQ as ``processing_error`` while the rest are decided. When every
record fails, or a failure looks like infrastructure (:func:`is_outage`: a
store connection, a timeout, a dead replica), nothing is dead-lettered: the
caller retries and its health check turns red. This is the Kafka-consumer
convention of a dead-letter queue for poison records only, never for an outage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["Outage", "is_outage", "isolate_failures"]


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

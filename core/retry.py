"""The project's one retry policy, on tenacity: which failures are retried, how long to wait, when to give up.

Every loop that tries an operation again after it failed (the consumer's stage retries and outage wait,
the registry's publish, the wait for a starting broker) is a :func:`retrying` call, so the backoff rule and the
give-up rule are written once. Waits double from ``first_s`` up to ``most_s`` (:class:`doubling`).
"""

from __future__ import annotations

from collections.abc import Callable

from tenacity import (
    RetryCallState,
    RetryError,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    stop_any,
    stop_never,
)
from tenacity.stop import stop_base

__all__ = ["RetryCallState", "RetryError", "doubling", "retrying"]


class doubling:  # noqa: N801 - a tenacity wait strategy, named like tenacity's own (wait_fixed, ...)
    """Wait ``first_s`` after the first failure, then twice the last wait, never more than ``most_s``.

    tenacity's ``wait_exponential`` caps the first wait at ``most_s`` too; here a first wait above the cap is
    kept (``guards.retry_backoff_s`` may be set above it), as the hand-rolled loops did.
    """

    def __init__(self, first_s: float, most_s: float) -> None:
        self.first_s, self.most_s = first_s, most_s

    def __call__(self, state: RetryCallState) -> float:
        n = state.attempt_number
        return self.first_s if n <= 1 else min(self.first_s * 2 ** min(n - 1, 64), self.most_s)


def retrying(retry_on: Callable[[BaseException], bool], *, attempts: int | None = None,
             within_s: float | None = None, first_s: float = 0.0, most_s: float = 0.0,
             after_failure: Callable[[RetryCallState], None] | None = None,
             before_sleep: Callable[[RetryCallState], None] | None = None, reraise: bool = True) -> Retrying:
    """A tenacity ``Retrying``: retry a failure ``retry_on`` accepts, at most ``attempts`` tries and for at most
    ``within_s`` seconds (neither: until it succeeds), waiting :class:`doubling` between tries.

    A failure ``retry_on`` refuses is raised at once. ``after_failure`` sees every retried failure (the last
    one too: the place for counters and logs); ``before_sleep`` only those followed by a wait. When the
    policy gives up, the last failure is raised (``reraise``), else tenacity's :class:`RetryError`.
    Use it as ``retrying(...)(fn, *args)`` or ``for attempt in retrying(...): with attempt: ...``.
    """
    stops: list[stop_base] = []
    if attempts is not None:
        stops.append(stop_after_attempt(attempts))
    if within_s is not None:
        stops.append(stop_after_delay(within_s))
    stop: stop_base = stop_any(*stops) if stops else stop_never
    return Retrying(retry=retry_if_exception(retry_on), stop=stop, wait=doubling(first_s, most_s),
                    after=after_failure or (lambda _state: None), before_sleep=before_sleep, reraise=reraise)

"""Optional per-batch work (shadow scoring, drift monitoring) that must never fail the champion's decisions.

Both stages run such work through :func:`guarded`: an error costs that batch's
shadow or drift figures, never its records, and is counted in
:data:`SIDE_ERRORS`, which the hot path exports on ``/metrics``.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["SIDE_ERRORS", "guarded"]

log = logging.getLogger(__name__)


#: Errors of the optional per-batch work (shadow scoring, drift), by kind; exported on /metrics.
SIDE_ERRORS: dict[str, int] = {"shadow": 0, "drift": 0}


def guarded(kind: str, work: Any) -> Any:
    """Run optional per-batch work; on an error log it, count it and return None (the champion's path goes on)."""
    try:
        return work()
    except Exception:  # noqa: BLE001 - a challenger or a monitor must never stop the champion
        SIDE_ERRORS[kind] += 1
        log.exception("%s work failed for this micro-batch (%d so far); decisions are unaffected", kind,
                      SIDE_ERRORS[kind])
        return None

"""One ping when a Redis client is made, so a refused password or a failed TLS handshake stops start-up in one line.

Used by the Feast online store (:func:`fedfraud.feature_store.feast_store.open_store`)
and serving's own state store (:class:`fedfraud.serving.kvstore.RedisKV`). A server that
is merely unreachable is only logged: the stores retry on their own (the chaos
bench takes Redis away under a running scorer), but a wrong password never
heals by retrying.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from typing import Any

from fedfraud.errors import UserError

__all__ = ["check_redis"]

log = logging.getLogger(__name__)


def _tls_failure(exc: BaseException) -> BaseException | None:
    """The ``ssl.SSLError`` behind a redis-py connection error, if the failure was the TLS handshake."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def check_redis(connect: Callable[[], Any], where: str, password_env: str) -> None:
    """``connect()`` a client and ``PING``; a refused AUTH or TLS handshake is a one-line :class:`UserError`.

    (A callable, because a cluster client already connects in its constructor.)
    """
    import redis

    try:
        connect().ping()
    except redis.AuthenticationError as exc:
        reason = str(exc).split(". ")[0].rstrip(".")
        raise UserError(f"Redis at {where} refused the connection: {reason} "
                        f"(the password is read from ${password_env})") from None
    except redis.ConnectionError as exc:
        tls = _tls_failure(exc)
        if tls is not None or "SSL" in str(exc):
            raise UserError(f"TLS to Redis at {where} failed: {str(tls or exc).splitlines()[0]}") from None
        log.warning("Redis at %s is not reachable yet (%s); going on", where, str(exc).splitlines()[0])

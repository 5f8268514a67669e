"""One ping when a Redis client is made, so a refused password or a failed TLS handshake stops start-up in one line.

Used by the Feast online store (:func:`fedfraud.feature_store.feast_store.open_store`)
and serving's own state store (:class:`fedfraud.serving.kvstore.RedisKV`). A server that
is merely unreachable is only logged: the stores retry on their own (the chaos
bench takes Redis away under a running scorer), but a wrong password never
heals by retrying.

Before any of that, :func:`require_password` refuses to connect without a password to a Redis that is not on
loopback (the stores hold every cardholder's state), and says once that a loopback one is used without AUTH.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Sequence
from typing import Any

from fedfraud.core.errors import UserError
from fedfraud.core.net import is_loopback

__all__ = ["check_redis", "require_password"]

log = logging.getLogger(__name__)

#: The Redis targets already warned about (a replica opens its stores more than once).
_WARNED: set[str] = set()


def require_password(hosts: Sequence[str], password: str | None, where: str, password_env: str) -> None:
    """Refuse a Redis beyond loopback without a password (one-line :class:`UserError`); warn once for loopback.

    Why: an unset or empty ``$password_env`` used to mean "connect without AUTH" silently, so a missing Secret
    in production went unnoticed. ``hosts`` are the servers the client dials (empty for a unix socket: local).
    """
    if password:
        return
    remote = [h for h in hosts if not is_loopback(h)]
    if remote:
        raise UserError(f"Redis at {where} is not on loopback and ${password_env} is unset or empty: refusing to "
                        f"connect without a password (set ${password_env})")
    if where not in _WARNED:
        _WARNED.add(where)
        log.warning("Redis at %s: $%s is unset or empty, connecting without a password (loopback only)", where,
                    password_env)


def _tls_failure(exc: BaseException) -> BaseException | None:
    """The ``ssl.SSLError`` behind a redis-py connection error, if the failure was the TLS handshake."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _ping_once(client: Any) -> None:
    """``PING`` on a fresh connection made as ``client``'s pool makes them, but with no retries.

    Why: redis-py retries a failed connect and command 3 times with exponential backoff (seconds), an
    :class:`redis.AuthenticationError` too (it is a ``ConnectionError``), so a refused password took ~3 s to
    report though it never heals by retrying. The stores' own clients keep their retries. A client without a
    pool (a cluster client, which connects in its constructor) is pinged as it is.
    """
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    pool = getattr(client, "connection_pool", None)
    if pool is None:
        client.ping()
        return
    conn = pool.connection_class(**{**pool.connection_kwargs, "retry": Retry(NoBackoff(), 0)})
    try:
        conn.connect()
        conn.send_command("PING")
        conn.read_response()
    finally:
        conn.disconnect()


def check_redis(connect: Callable[[], Any], where: str, password_env: str) -> None:
    """``connect()`` a client and ``PING``; a refused AUTH or TLS handshake is a one-line :class:`UserError`.

    (A callable, because a cluster client already connects in its constructor.)
    """
    import redis

    try:
        _ping_once(connect())
    except redis.AuthenticationError as exc:
        reason = str(exc).split(". ")[0].rstrip(".")
        raise UserError(f"Redis at {where} refused the connection: {reason} "
                        f"(the password is read from ${password_env})") from None
    except redis.ConnectionError as exc:
        tls = _tls_failure(exc)
        if tls is not None or "SSL" in str(exc):
            raise UserError(f"TLS to Redis at {where} failed: {str(tls or exc).splitlines()[0]}") from None
        log.warning("Redis at %s is not reachable yet (%s); going on", where, str(exc).splitlines()[0])

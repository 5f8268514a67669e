"""Bearer-token check of the HTTP endpoints: 401 without a usable header, 403 for a wrong token.

Each Serve replica builds one :class:`BearerAuth` from :class:`fedfraud.serving.config.AuthSettings`
when it starts and keeps it as ``self.bearer``; protected routes declare
``dependencies=[Depends(require_bearer)]``. That runs before the body is read only
if the route has no body parameter (FastAPI reads and parses a pydantic body
before it solves any dependency), so routes that take a body read it themselves
(:func:`fedfraud.serving.http_body.read_capped_body`): an unauthenticated client
cannot make a replica read a large body either.
"""

from __future__ import annotations

import hmac
import logging
from pathlib import Path

from fastapi import HTTPException, Request

from fedfraud.core.credentials import API_TOKEN_ENV, new_token, read_secret, write_secret_file
from fedfraud.core.errors import UserError
from fedfraud.core.net import is_loopback
from fedfraud.serving.config import AuthSettings

__all__ = ["TOKEN_FILE", "BearerAuth", "api_token", "check_open_http", "per_run_token", "require_bearer",
           "serve_http_host"]

log = logging.getLogger(__name__)

_CHALLENGE = {"WWW-Authenticate": "Bearer"}
#: Name of the file a per-run token is written to, in the run's own folder.
TOKEN_FILE = "api-token"


def api_token(settings: AuthSettings) -> str | None:
    """The configured API token; None only when authentication is disabled.

    A missing token is a one-line :class:`UserError` naming where it is read
    from, so ``fedfraud serve`` (and a replica) refuses to start open. Disabled
    authentication is refused too when the running Serve's HTTP proxy listens
    beyond loopback (:func:`check_open_http`): ``serve deploy`` of a config
    with ``http_options.host: 0.0.0.0`` and ``serving.auth.disabled: true``
    stops in the builder and in every replica.
    """
    if settings.disabled:
        check_open_http(settings, serve_http_host())
        return None
    token = read_secret(API_TOKEN_ENV, settings.token_file)
    if token is None:
        raise UserError(f"no API token: set ${API_TOKEN_ENV} or serving.auth.token_file "
                        "(or --insecure-no-auth for local development only)")
    return token


def check_open_http(settings: AuthSettings, http_host: str | None) -> None:
    """Refuse ``settings.disabled`` on an HTTP address other machines can reach (one-line :class:`UserError`).

    Why: no authentication is meant for local development only; on ``0.0.0.0`` (or any non-loopback address) it
    would let anyone who can reach the port score, tokenize and read ``/metrics``. ``http_host`` None: not known
    (no Serve running yet), nothing to check.
    """
    if settings.disabled and http_host is not None and not is_loopback(http_host):
        raise UserError(f"authentication is disabled (serving.auth.disabled / --insecure-no-auth) but HTTP listens "
                        f"on {http_host!r}: that is only allowed on a loopback address such as 127.0.0.1; configure "
                        f"an API token instead")


def serve_http_host() -> str | None:
    """The host the running Ray Serve's HTTP proxies listen on; None outside Ray, before Serve starts, or without
    an HTTP proxy.
    """
    import ray

    if not ray.is_initialized():
        return None
    try:
        from ray.serve.context import _get_global_client

        host = _get_global_client().http_config.host
    except Exception:  # noqa: BLE001 - no Serve instance (yet) on this cluster
        log.debug("no Serve instance to read the HTTP host from", exc_info=True)
        return None
    return None if host is None else str(host)


def per_run_token(settings: AuthSettings, folder: Path) -> AuthSettings:
    """``settings`` as they are if a token is configured (or auth is disabled); otherwise a random token for
    this run only, written to ``folder/api-token`` (0600) and named as the token file.

    For ``fedfraud demo``, the benches and tests: they work without setup and
    still never serve open nor use a fixed secret. ``fedfraud serve`` does not
    call this: a long-running service must be given its token.
    """
    if settings.disabled or read_secret(API_TOKEN_ENV, settings.token_file) is not None:
        return settings
    path = write_secret_file(Path(folder) / TOKEN_FILE, new_token())
    log.warning("no API token configured ($%s): this run's random token is in %s", API_TOKEN_ENV, path)
    return settings.model_copy(update={"token_file": str(path)})


class BearerAuth:
    """Checks ``Authorization: Bearer <token>`` against one token in constant time."""

    def __init__(self, token: str | None) -> None:
        self._token = None if token is None else token.encode("utf-8")
        if token is None:
            log.warning("HTTP authentication is DISABLED: /score, /tokenize, /detokenize and /metrics are open")

    @classmethod
    def from_settings(cls, settings: AuthSettings) -> BearerAuth:
        return cls(api_token(settings))

    def check(self, authorization: str | None) -> None:
        """Return if the header carries the token; raise 401 (missing or malformed) or 403 (wrong token)."""
        if self._token is None:
            return
        scheme, _, credentials = (authorization or "").strip().partition(" ")
        credentials = credentials.strip()
        if scheme.lower() != "bearer" or not credentials:
            raise HTTPException(401, "missing or malformed Authorization header; expected 'Bearer <token>'",
                                headers=_CHALLENGE)
        if not hmac.compare_digest(credentials.encode("utf-8"), self._token):
            raise HTTPException(403, "invalid token")


async def require_bearer(request: Request) -> None:
    """FastAPI dependency of a protected route: the serving replica's ``bearer`` checks the request.

    A replica without one (a deployment class that forgot it) refuses every
    request rather than serving it open.
    """
    from ray import serve

    bearer = getattr(serve.get_replica_context().servable_object, "bearer", None)
    if not isinstance(bearer, BearerAuth):
        raise HTTPException(503, "authentication is not set up on this replica")
    bearer.check(request.headers.get("authorization"))

"""Secrets read from the environment or from a mounted file, never from a literal in code or config.

Shared by every layer (the HTTP services check the API token, their clients
send it; Redis and Kafka clients read their passwords the same way). A secret
is either an environment variable (a Kubernetes ``secretKeyRef`` env entry) or
a file (a mounted Secret volume); the config names the variable or the file,
never the value.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from fedfraud.core.errors import UserError

__all__ = ["API_TOKEN_ENV", "bearer_headers", "new_token", "read_secret", "write_secret_file"]

#: The API token of ``/score``, ``/tokenize``, ``/detokenize`` and ``/metrics`` (when no token file is configured).
API_TOKEN_ENV = "FEDFRAUD_API_TOKEN"


def read_secret(env: str, file: str | Path | None = None) -> str | None:
    """The secret in ``file`` if one is named (it must exist and be non-empty), else ``$env``; None if neither.

    A named file that is missing or empty is a one-line :class:`UserError`: a
    Secret that failed to mount must not look like "no secret configured".
    """
    if file is not None:
        path = Path(file)
        try:
            value = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise UserError(f"secret file {path} cannot be read ({exc.strerror or exc.__class__.__name__})") from None
        if not value:
            raise UserError(f"secret file {path} is empty")
        return value
    value = os.environ.get(env, "").strip()
    return value or None


def new_token() -> str:
    """A random per-run token (256 bits, URL-safe) for demos and tests; never a fixed default."""
    return secrets.token_urlsafe(32)


def write_secret_file(path: Path, value: str) -> Path:
    """Write ``value`` to ``path`` readable by this user only (0600, created so from the start)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(value + "\n")
    return path


def bearer_headers(token: str | None) -> dict[str, str]:
    """``{"Authorization": "Bearer <token>"}``, or no header when the service runs without authentication."""
    return {"Authorization": f"Bearer {token}"} if token else {}

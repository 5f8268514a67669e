"""The services and programs the suite promises (README, "Quick start"): Redis on 127.0.0.1:6379, PostgreSQL on
127.0.0.1:5432, the ``redis-server`` binary, the installed ``fedfraud`` console script.

A test that needs one calls ``require_*``. On a developer's machine a missing one skips the test with its reason
(``-ra`` lists it at the end of the run). In CI (``CI`` set to true, as ``.ci/run`` does) it fails the test
instead: there the prerequisite is promised, and a skipped test would let the suite pass without running it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import NoReturn

import pytest

REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
PG_HOST, PG_PORT = "127.0.0.1", 5432


def in_ci() -> bool:
    """Whether this run is CI's, where every prerequisite above is promised (``CI=true``, ``1`` or ``yes``)."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def missing(reason: str) -> NoReturn:
    """Skip with ``reason``, or fail with it in CI."""
    if in_ci():
        pytest.fail(f"prerequisite missing in CI (CI={os.environ['CI']}): {reason}", pytrace=False)
    pytest.skip(reason)


def require_redis(db: int = 15) -> None:
    """Redis answers on 127.0.0.1:6379 (database ``db``)."""
    import redis

    try:
        redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=db, socket_connect_timeout=1).ping()
    except redis.RedisError as exc:
        missing(f"no Redis at {REDIS_HOST}:{REDIS_PORT} ({exc})")


def require_binary(name: str) -> str:
    """The path of program ``name`` on ``PATH``."""
    path = shutil.which(name)
    if path is None:
        missing(f"no {name} binary on PATH")
    return path


def require_console_script(name: str, bindir: Path) -> Path:
    """The console script ``name`` installed beside the interpreter (``pip install -e .`` puts it there)."""
    script = bindir / name
    if not script.exists():
        missing(f"{name} console script not installed in {bindir} (pip install -e '.[dev]')")
    return script

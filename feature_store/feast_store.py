"""Render, open, apply and materialize the Feast feature repo for one online-store profile.

The declarations live in ``feature_store/repo/`` (plain Feast, ``feast apply``
works there). Programs never write into the package: :func:`render_repo` copies
``definitions.py`` into a working folder (``features.repo_dir``, a temp dir in
tests) next to a ``feature_store.yaml`` built as a validated Feast
``RepoConfig`` for the chosen profile, so the plain ``feast`` CLI works in that
folder as well.
"""

from __future__ import annotations

import importlib
import logging
import os
from datetime import datetime, timedelta, UTC
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq
import yaml

from fedfraud.core.errors import UserError
from fedfraud.feature_store.store_config import FeatureStoreConfig, RedisProfile, RegistryConfig

if TYPE_CHECKING:
    from feast import FeatureStore
    from feast.repo_config import RepoConfig

__all__ = [
    "DATA_DIR",
    "DEFINITIONS_MODULE",
    "REPO_TEMPLATE",
    "apply_repo",
    "build_repo_config",
    "data_time_range",
    "feast_objects",
    "materialize_repo",
    "open_store",
    "render_repo",
    "repo_yaml",
]

logger = logging.getLogger(__name__)

#: The packaged feature repo (declarations + default feature_store.yaml).
REPO_TEMPLATE = Path(__file__).parent / "repo"
DEFINITIONS_MODULE = "fedfraud.feature_store.repo.definitions"
#: Offline parquet, registry and SQLite online store live here, relative to the repo folder.
DATA_DIR = "data"
_COPIED = ("definitions.py", ".feastignore")


def repo_yaml(cfg: FeatureStoreConfig, profile: str | None = None) -> dict[str, Any]:
    """The ``feature_store.yaml`` mapping for ``profile`` (default: ``cfg.profile``); paths relative to the repo."""
    chosen = cfg.online_profile(profile)
    return {
        "project": cfg.project,
        "provider": "local",
        "registry": cfg.registry.render(),
        "online_store": chosen.online_store(),
        "offline_store": {"type": "file"},
        "entity_key_serialization_version": 3,
        "auth": {"type": "no_auth"},
    }


def build_repo_config(cfg: FeatureStoreConfig, repo_dir: Path, profile: str | None = None) -> RepoConfig:
    """A validated Feast ``RepoConfig`` for ``profile`` rooted at ``repo_dir`` (for ``FeatureStore(config=)``).

    ``${VAR}`` references (the Redis password) are expanded in memory, as Feast
    does when it loads ``feature_store.yaml``.
    """
    from feast.repo_config import RepoConfig

    mapping = yaml.safe_load(os.path.expandvars(yaml.safe_dump(repo_yaml(cfg, profile))))
    return RepoConfig(**mapping, repo_path=Path(repo_dir).resolve())


def _write_if_changed(path: Path, data: bytes) -> bool:
    """Replace ``path`` atomically, and only when its bytes differ.

    Every Serve replica and every bank opens the store: unchanged files are not rewritten, and a changed one is
    swapped in whole (``os.replace``), so a process reading the repo never sees a half-written file.
    """
    try:
        if path.read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return True


def render_repo(cfg: FeatureStoreConfig, repo_dir: Path | None = None, profile: str | None = None) -> Path:
    """Write ``feature_store.yaml`` for the profile and copy the declarations into ``repo_dir``; returns it.

    Files already up to date are left alone (see :func:`_write_if_changed`).
    """
    target = Path(repo_dir if repo_dir is not None else cfg.repo_dir)
    if target.resolve() == REPO_TEMPLATE.resolve():
        raise UserError(f"{target} is the packaged feature repo; render into a working folder instead")
    (target / DATA_DIR).mkdir(parents=True, exist_ok=True)
    for name in _COPIED:
        _write_if_changed(target / name, (REPO_TEMPLATE / name).read_bytes())
    build_repo_config(cfg, target, profile)  # validate before writing
    # RepoConfig.write_to_path dumps field names instead of the yaml keys, so write the mapping ourselves
    header = "# rendered by fedfraud (fedfraud.feature_store.feast_store.render_repo); the `feast` CLI works here\n"
    rendered = header + yaml.safe_dump(repo_yaml(cfg, profile), sort_keys=False)
    _write_if_changed(target / "feature_store.yaml", rendered.encode("utf-8"))
    return target


def open_store(cfg: FeatureStoreConfig, repo_dir: Path | None = None, profile: str | None = None) -> FeatureStore:
    """Render the repo for ``profile`` and open it as a Feast ``FeatureStore`` (nothing applied yet)."""
    from feast import FeatureStore

    target = render_repo(cfg, repo_dir, profile)
    if cfg.registry.type == "sql":  # Feast connects (and creates its tables) as the store opens
        _check_sql_registry(build_repo_config(cfg, target, profile), cfg.registry)
    store = FeatureStore(repo_path=str(target.resolve()))
    chosen = cfg.online_profile(profile)
    if isinstance(chosen, RedisProfile):
        _check_redis_store(store.config, chosen)
    return store


def _check_redis_store(config: RepoConfig, profile: RedisProfile) -> None:
    """Ping through a client built exactly as Feast builds it: a refused password fails here, in one line."""
    from feast.infra.online_stores.redis import RedisOnlineStore

    from fedfraud.feature_store.redis_check import check_redis

    profile.require_password()  # no password for a Redis beyond loopback: refused before Feast connects
    check_redis(lambda: RedisOnlineStore()._get_client(config.online_store), profile.where(), profile.password_env)


def _check_sql_registry(config: RepoConfig, registry: RegistryConfig) -> None:
    """Connect once to the SQL registry: a wrong password or an unreachable server fails here, in one line."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import SQLAlchemyError

    try:
        engine = create_engine(config.registry.path)
    except (SQLAlchemyError, ImportError) as exc:  # unknown dialect or missing driver
        raise UserError(f"Feast {registry.where()}: {exc}") from None
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise UserError(f"Feast {registry.where()} cannot be reached ({reason}); password from "
                        f"${registry.password_env}") from None
    finally:
        engine.dispose()


def feast_objects() -> list[Any]:
    """Every Feast object declared in ``definitions.py`` (entities, sources, views, services)."""
    from feast import Entity, FeatureService, FeatureView
    from feast.data_source import DataSource

    module = importlib.import_module(DEFINITIONS_MODULE)
    kinds = (Entity, DataSource, FeatureView, FeatureService)
    return [obj for obj in vars(module).values() if isinstance(obj, kinds)]


def apply_repo(store: FeatureStore) -> list[str]:
    """``feast apply`` of the declarations to ``store`` (registry + online tables); returns the names applied."""
    objects = feast_objects()
    store.apply(objects)
    names = sorted(f"{type(o).__name__}:{o.name}" for o in objects)
    logger.info("feast_apply project=%s objects=%d repo=%s", store.project, len(objects), store.repo_path)
    return names


def data_time_range(repo_dir: Path) -> tuple[datetime, datetime]:
    """Earliest and latest ``event_timestamp`` in the repo's offline parquet (UTC)."""
    import pyarrow.compute as pc

    lo: datetime | None = None
    hi: datetime | None = None
    files = sorted((Path(repo_dir) / DATA_DIR).glob("*.parquet"))
    for path in files:
        column = pq.read_table(path, columns=["event_timestamp"]).column("event_timestamp")
        if len(column) == 0:
            continue
        bounds = pc.min_max(column)
        a, b = bounds["min"].as_py(), bounds["max"].as_py()
        lo = a if lo is None else min(lo, a)
        hi = b if hi is None else max(hi, b)
    if lo is None or hi is None:
        where = Path(repo_dir) / DATA_DIR
        raise UserError(f"no offline feature rows under {where}; run `fedfraud features apply --data DIR`")
    return lo.astimezone(UTC), hi.astimezone(UTC)


def materialize_repo(store: FeatureStore, start: datetime | None = None, end: datetime | None = None) -> None:
    """Load the latest offline row of every entity into the online store (default: the whole data range)."""
    if start is None or end is None:
        lo, hi = data_time_range(Path(store.repo_path))
        start = start or lo - timedelta(seconds=1)
        end = end or hi + timedelta(seconds=1)
    logger.info("feast_materialize project=%s start=%s end=%s", store.project, start.isoformat(), end.isoformat())
    store.materialize(start_date=start, end_date=end)

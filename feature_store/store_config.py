"""Typed configuration of the Feast feature store: online-store profiles behind a ``type:`` key.

Composed into :class:`fedfraud.config.FedfraudConfig` as the ``features:``
section. A *profile* picks the online store; each profile is a small pydantic
model with ``extra="forbid"`` and one method that renders its part of
``feature_store.yaml``, so adding a backend is one class plus one entry in
:data:`PROFILES`. The registry (``features.registry``) is chosen apart from the
online store: a file next to the repo, or a SQL database (PostgreSQL) shared by
every replica and every bank's tools.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fedfraud.core.credentials import read_secret
from fedfraud.core.errors import UserError

__all__ = [
    "PROFILES",
    "FeatureStoreConfig",
    "OnlineProfile",
    "RedisProfile",
    "RegistryConfig",
    "SqliteProfile",
    "resolve_profile",
]


class OnlineProfile(BaseModel, ABC):
    """One online-store backend; renders the ``online_store`` entry of ``feature_store.yaml``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str

    @abstractmethod
    def online_store(self) -> dict[str, Any]:
        """The ``online_store:`` mapping of ``feature_store.yaml``."""


_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class RegistryConfig(BaseModel):
    """Where Feast keeps its registry (the applied entities, views and services).

    ``file`` is a file in the repo folder: fine on one machine, but each replica
    of a cluster would need its own copy baked in or mounted. ``sql`` puts it in
    a database that every replica and tool reads, so a ``feast apply`` is seen
    by all of them within ``cache_ttl_seconds``. The URL carries no password:
    the rendered ``feature_store.yaml`` says ``user:${VAR}@host`` and Feast
    expands the variable when it loads the file, as for the Redis password.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["file", "sql"] = Field("file", description="file (next to the repo) | sql (a shared database)")
    path: str = Field(
        "data/registry.db",
        min_length=1,
        description="file: path relative to the repo folder; sql: SQLAlchemy URL without a password, e.g. "
        "postgresql+psycopg://feast@db.example:5432/feast (driver: psycopg, installed with fedfraud)",
    )
    password_env: str = Field(
        "FEDFRAUD_FEAST_REGISTRY_PASSWORD", min_length=1, pattern=_ENV_NAME,
        description="sql: environment variable holding the database password (URL-safe characters, or "
        "percent-encoded); unset or empty: none (trust or peer authentication)",
    )
    cache_ttl_seconds: int = Field(
        60, ge=0, description="how long a replica serves its cached copy of the registry before re-reading it")

    @model_validator(mode="after")
    def _sql_url_without_secret(self) -> RegistryConfig:
        if self.type == "file":
            if "://" in self.path:
                raise ValueError("registry.type file takes a file path; a database URL needs registry.type: sql")
            return self
        parts = urlsplit(self.path)
        if "+" not in parts.scheme and parts.scheme not in {"sqlite", "postgresql", "mysql"}:
            raise ValueError(f"registry.path {self.path!r} is not a SQLAlchemy database URL")
        if parts.password is not None:
            raise ValueError("no password in registry.path: put it in the environment variable named by "
                             "registry.password_env (default FEDFRAUD_FEAST_REGISTRY_PASSWORD)")
        return self

    def password(self) -> str | None:
        """The database password from ``$password_env`` (None when unset or empty)."""
        return read_secret(self.password_env)

    def where(self) -> str:
        """The registry's location for messages (never a password)."""
        return f"{self.type} registry at {self.path}"

    def url_template(self) -> str:
        """The SQL URL as written to ``feature_store.yaml``: ``${password_env}`` in place of the password."""
        if self.type != "sql" or self.password() is None:
            return self.path
        parts = urlsplit(self.path)
        if not parts.username:
            raise UserError(f"${self.password_env} is set but registry.path names no user ({self.path})")
        netloc = f"{parts.username}:${{{self.password_env}}}@{parts.netloc.rpartition('@')[2]}"
        return parts._replace(netloc=netloc).geturl()

    def render(self) -> str | dict[str, Any]:
        """The ``registry:`` entry of ``feature_store.yaml``."""
        if self.type == "file":
            return self.path
        return {
            "registry_type": "sql",
            "path": self.url_template(),
            "cache_ttl_seconds": self.cache_ttl_seconds,
            # a replica's pooled connection may have been closed by the server or a proxy since its last read
            "sqlalchemy_config_kwargs": {"echo": False, "pool_pre_ping": True},
        }


class SqliteProfile(OnlineProfile):
    """Embedded default: one SQLite file in the repo's ``data/`` folder, no server."""

    type: Literal["sqlite"] = "sqlite"
    path: str = Field("data/online_store.db", description="online store file, relative to the repo folder")

    def online_store(self) -> dict[str, Any]:
        return {"type": "sqlite", "path": self.path}


class RedisProfile(OnlineProfile):
    """Redis online store (Feast's ``redis`` type); optionally a SQL (PostgreSQL) registry.

    The password is never in this section nor in the rendered ``feature_store.yaml``:
    the file says ``password=${FEDFRAUD_REDIS_PASSWORD}`` and Feast substitutes the
    variable when it loads the file (its loader expands environment variables), so
    the plain ``feast`` CLI works in the folder with the variable set.
    """

    type: Literal["redis"] = "redis"
    redis_type: Literal["redis", "redis_cluster", "redis_sentinel"] = Field(
        "redis", description="one server; a cluster (list several host:port); or Sentinel (list the sentinels, "
        "name the master in sentinel_master). Cluster and Sentinel use Feast's own reads and writes")
    connection_string: str = Field(
        "127.0.0.1:6379,db=0",
        description="Feast format host:port[,host:port...][,db=N][,redis-py option=value...]; no password= or ssl= "
        "here: see password_env and ssl",
    )
    sentinel_master: str = Field("mymaster", description="the Sentinel master's name (redis_sentinel only)")
    password_env: str = Field(
        "FEDFRAUD_REDIS_PASSWORD", min_length=1, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="environment variable holding the Redis password (AUTH); unset or empty: no AUTH",
    )
    ssl: bool = Field(False, description="TLS to Redis (Redis's tls-port)")
    ssl_ca_certs: str | None = Field(None, description="CA bundle that signed the Redis server's certificate (ssl)")
    key_ttl_seconds: int | None = Field(None, ge=1, description="expire a cardholder's keys after this long")
    skip_dedup: bool = Field(
        True,
        description=(
            "last writer wins, like SQLite. Feast's Redis dedup drops a write whose event time is not newer than the "
            "stored one, which would lose a late event or a second transaction in the same second; serving is the "
            "single writer per cardholder (Kafka partitions by key), so dedup buys nothing and costs a round trip"
        ),
    )
    @field_validator("connection_string")
    @classmethod
    def _no_secret_inline(cls, value: str) -> str:
        keys = {part.split("=", 1)[0].strip().lower() for part in value.split(",") if "=" in part}
        if "password" in keys:
            raise ValueError("no password= in connection_string: put the password in the environment variable "
                             "named by password_env (default FEDFRAUD_REDIS_PASSWORD)")
        if any(k.startswith("ssl") for k in keys):
            raise ValueError("no ssl= or ssl_ca_certs= in connection_string (nor any ssl_* option): use the ssl and "
                             "ssl_ca_certs settings; TLS always verifies the certificate and the host name")
        return value

    def password(self) -> str | None:
        """The Redis password from ``$password_env`` (None when unset or empty: no AUTH)."""
        return os.environ.get(self.password_env) or None

    def hosts(self) -> list[str]:
        """The host of every server in ``connection_string`` (the sentinels, for ``redis_sentinel``)."""
        return [p.strip().rpartition(":")[0] or p.strip() for p in self.connection_string.split(",")
                if p.strip() and "=" not in p]

    def require_password(self) -> str | None:
        """:meth:`password`, refused (one-line :class:`UserError`) when it is missing and a server is not on
        loopback; a loopback server without one is logged once (:func:`~fedfraud.feature_store.redis_check.
        require_password`).
        """
        from fedfraud.feature_store.redis_check import require_password

        password = self.password()
        require_password(self.hosts(), password, self.where(), self.password_env)
        return password

    def where(self) -> str:
        """The servers and db for messages (no secret is ever in ``connection_string``)."""
        return f"{self.connection_string} ({self.redis_type}{', TLS' if self.ssl else ''})"

    def online_store(self) -> dict[str, Any]:
        """The ``online_store:`` mapping; the password as a ``${VAR}`` reference Feast expands when it loads it."""
        connection = self.connection_string
        if self.password() is not None:
            connection += f",password=${{{self.password_env}}}"
        if self.ssl:  # Feast hands these to redis-py as keyword arguments: verify the certificate and the host name
            connection += (",ssl=true" + (f",ssl_ca_certs={self.ssl_ca_certs}" if self.ssl_ca_certs else "")
                           + ",ssl_cert_reqs=required,ssl_check_hostname=true")
        out: dict[str, Any] = {
            "type": "redis",
            "redis_type": self.redis_type,
            "connection_string": connection,
            "skip_dedup": self.skip_dedup,
        }
        if self.redis_type == "redis_sentinel":
            out["sentinel_master"] = self.sentinel_master
        if self.key_ttl_seconds is not None:
            out["key_ttl_seconds"] = self.key_ttl_seconds
        return out

    def address(self) -> tuple[str, int]:
        """Host and port of the first server in ``connection_string``."""
        node = next(p.strip() for p in self.connection_string.split(",") if "=" not in p)
        host, sep, port = node.rpartition(":")
        return (host, int(port)) if sep else (node, 6379)

    def client(self, db: int | None = None) -> Any:
        """A redis-py client of the server with this profile's credentials (``db`` overrides the string's), for
        tools that flush or probe a database; ``redis_type: redis`` only.
        """
        import redis

        if self.redis_type != "redis":
            raise UserError(f"a direct client needs redis_type: redis, not {self.redis_type}")
        options = dict(p.split("=", 1) for p in self.connection_string.split(",") if "=" in p)
        host, port = self.address()
        tls: dict[str, Any] = {"ssl_cert_reqs": "required", "ssl_check_hostname": True} if self.ssl else {}
        return redis.Redis(host=host, port=port, db=int(options.get("db", 0)) if db is None else db,
                           password=self.require_password(), ssl=self.ssl, ssl_ca_certs=self.ssl_ca_certs, **tls)


#: Profile name → model; the single place a ``profile:`` / ``--store`` name is resolved.
PROFILES: dict[str, type[OnlineProfile]] = {"sqlite": SqliteProfile, "redis": RedisProfile}


def resolve_profile(name: str) -> type[OnlineProfile]:
    """The profile class for ``name``; a one-line :class:`UserError` listing the valid names otherwise."""
    try:
        return PROFILES[name.strip().lower()]
    except KeyError:
        raise UserError(f"unknown feature store profile {name!r}; valid: {', '.join(sorted(PROFILES))}") from None


class FeatureStoreConfig(BaseModel):
    """Where the Feast repo is rendered, which online store and registry it uses, and the activity-feature knobs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str = Field("sqlite", description=f"online store profile: {' | '.join(sorted(PROFILES))}")
    project: str = Field("fedfraud", pattern=r"^[A-Za-z0-9_]+$", description="Feast project name")
    repo_dir: str = Field(
        "out/feature_repo",
        description="working Feast repo (feature_store.yaml, definitions.py, data/) is rendered here",
    )
    sqlite: SqliteProfile = Field(default_factory=SqliteProfile)
    redis: RedisProfile = Field(default_factory=RedisProfile)
    registry: RegistryConfig = Field(default_factory=RegistryConfig)
    location_cell_deg: float = Field(
        0.1, gt=0, le=10, description="activity's last_location_cell is the lat/lon grid cell of this size (degrees)"
    )

    @model_validator(mode="after")
    def _known_profile(self) -> FeatureStoreConfig:
        if self.profile.strip().lower() not in PROFILES:
            raise ValueError(f"unknown profile {self.profile!r}; valid: {', '.join(sorted(PROFILES))}")
        return self

    def online_profile(self, name: str | None = None) -> OnlineProfile:
        """The configured profile, or the one named (``--store``), with this config's settings."""
        key = (name or self.profile).strip().lower()
        resolve_profile(key)
        profile: OnlineProfile = getattr(self, key)  # every profile has a section named like it
        return profile

"""Typed configuration of the Feast feature store: online-store profiles behind a ``type:`` key.

Composed into :class:`fedfraud.config.FedfraudConfig` as the ``features:``
section. A *profile* picks the online store (and the registry that goes with
it); each profile is a small pydantic model with ``extra="forbid"`` and one
method that renders its part of ``feature_store.yaml``, so adding a backend is
one class plus one entry in :data:`PROFILES`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedfraud.errors import UserError

__all__ = [
    "PROFILES",
    "FeatureStoreConfig",
    "OnlineProfile",
    "RedisProfile",
    "SqliteProfile",
    "resolve_profile",
]


class OnlineProfile(BaseModel, ABC):
    """One online-store backend; renders the ``online_store`` and ``registry`` entries of ``feature_store.yaml``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str

    @abstractmethod
    def online_store(self) -> dict[str, Any]:
        """The ``online_store:`` mapping of ``feature_store.yaml``."""

    def registry(self) -> str | dict[str, Any]:
        """The ``registry:`` entry; a file next to the repo unless the profile says otherwise."""
        return "data/registry.db"


class SqliteProfile(OnlineProfile):
    """Embedded default: one SQLite file in the repo's ``data/`` folder, no server."""

    type: Literal["sqlite"] = "sqlite"
    path: str = Field("data/online_store.db", description="online store file, relative to the repo folder")

    def online_store(self) -> dict[str, Any]:
        return {"type": "sqlite", "path": self.path}


class RedisProfile(OnlineProfile):
    """Redis online store (Feast's ``redis`` type); optionally a SQL (PostgreSQL) registry."""

    type: Literal["redis"] = "redis"
    connection_string: str = Field(
        "127.0.0.1:6379,db=0", description="Feast format host:port[,db=N][,password=...][,ssl=true]"
    )
    key_ttl_seconds: int | None = Field(None, ge=1, description="expire a cardholder's keys after this long")
    skip_dedup: bool = Field(
        True,
        description=(
            "last writer wins, like SQLite. Feast's Redis dedup drops a write whose event time is not newer than the "
            "stored one, which would lose a late event or a second transaction in the same second; serving is the "
            "single writer per cardholder (Kafka partitions by key), so dedup buys nothing and costs a round trip"
        ),
    )
    registry_path: str | None = Field(
        None,
        description="SQL registry URL, e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test (needs psycopg); "
        "default: a registry file in the repo's data/ folder",
    )

    def online_store(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": "redis",
            "connection_string": self.connection_string,
            "skip_dedup": self.skip_dedup,
        }
        if self.key_ttl_seconds is not None:
            out["key_ttl_seconds"] = self.key_ttl_seconds
        return out

    def registry(self) -> str | dict[str, Any]:
        if self.registry_path is None:
            return super().registry()
        return {"registry_type": "sql", "path": self.registry_path, "cache_ttl_seconds": 60}


#: Profile name → model; the single place a ``profile:`` / ``--store`` name is resolved.
PROFILES: dict[str, type[OnlineProfile]] = {"sqlite": SqliteProfile, "redis": RedisProfile}


def resolve_profile(name: str) -> type[OnlineProfile]:
    """The profile class for ``name``; a one-line :class:`UserError` listing the valid names otherwise."""
    try:
        return PROFILES[name.strip().lower()]
    except KeyError:
        raise UserError(f"unknown feature store profile {name!r}; valid: {', '.join(sorted(PROFILES))}") from None


class FeatureStoreConfig(BaseModel):
    """Where the Feast repo is rendered, which online store it uses, and the activity-feature knobs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str = Field("sqlite", description=f"online store profile: {' | '.join(sorted(PROFILES))}")
    project: str = Field("fedfraud", pattern=r"^[A-Za-z0-9_]+$", description="Feast project name")
    repo_dir: str = Field(
        "out/feature_repo",
        description="working Feast repo (feature_store.yaml, definitions.py, data/) is rendered here",
    )
    sqlite: SqliteProfile = Field(default_factory=SqliteProfile)
    redis: RedisProfile = Field(default_factory=RedisProfile)
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

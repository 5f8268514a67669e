"""Feast's Redis online store, plus reading and writing several feature views in one pipeline.

Feast keeps every feature view of an entity in one Redis hash (key =
serialised entity key + project, fields = ``mmh3("<view>:<feature>")`` and
``_ts:<view>``; see Feast's ``docs/specs/online_store_format.md``). Its
``online_read`` / ``online_write_batch`` do one pipeline *per view*, so a
cardholder's three views cost three round trips to read and three to write.
This subclass issues one ``HMGET`` / ``HSET`` per entity for all views in a
single pipeline, in exactly Feast's format: ``get_online_features``,
``feast`` CLI and materialisation see the same data.

Writes here are last-writer-wins (``skip_dedup: true``, our profile's default);
with ``skip_dedup: false`` :class:`~fedfraud.feature_store.online.OnlineStateClient`
falls back to Feast's per-view writes, which compare event timestamps.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from feast import FeatureView
from feast.infra.online_stores.helpers import _mmh3
from feast.infra.online_stores.redis import RedisOnlineStore, RedisOnlineStoreConfig
from feast.protos.feast.types.Value_pb2 import Value as ValueProto
from feast.repo_config import RepoConfig
from google.protobuf.timestamp_pb2 import Timestamp

__all__ = ["MultiViewRedisOnlineStore"]

Row = tuple[Any, dict[str, ValueProto], datetime, datetime | None]


class MultiViewRedisOnlineStore(RedisOnlineStore):
    """:class:`RedisOnlineStore` with one-pipeline multi-view :meth:`read_views` / :meth:`write_views`."""

    def __init__(self) -> None:
        super().__init__()
        self._fields: dict[tuple[str, tuple[str, ...]], list[bytes | str]] = {}

    def _view_fields(self, table: FeatureView, features: Sequence[str]) -> list[bytes | str]:
        """Hash fields of ``features`` of a view followed by its ``_ts`` field (cached: mmh3 per call adds up)."""
        key = (table.name, tuple(features))
        cached = self._fields.get(key)
        if cached is None:
            cached = self._fields[key] = [*(_mmh3(f"{table.name}:{f}") for f in features), f"_ts:{table.name}"]
        return cached

    def read_views(
        self,
        config: RepoConfig,
        tables: Sequence[tuple[FeatureView, Sequence[str]]],
        redis_keys: Sequence[bytes],
    ) -> list[list[tuple[datetime | None, dict[str, ValueProto] | None]]]:
        """Rows of several (view, features) for many entity keys in one pipeline: ``[view][entity]``."""
        spans: list[tuple[FeatureView, list[str], int, int]] = []
        fields: list[bytes | str] = []
        for table, features in tables:
            names = list(features)
            view_fields = self._view_fields(table, names)
            spans.append((table, [*names, f"_ts:{table.name}"], len(fields), len(fields) + len(view_fields)))
            fields.extend(view_fields)
        client = self._get_client(config.online_store)
        with client.pipeline(transaction=False) as pipe:
            for key in redis_keys:
                pipe.hmget(key, fields)
            replies = pipe.execute()
        return [
            [self._get_features_for_entity(reply[a:b], table.name, names) for reply in replies]
            for table, names, a, b in spans
        ]

    def write_views(self, config: RepoConfig, rows: Sequence[tuple[FeatureView, Sequence[tuple[bytes, Row]]]]) -> None:
        """One ``HSET`` per entity key with the fields of every view given for it, in one pipeline."""
        store_cfg = config.online_store
        if not isinstance(store_cfg, RedisOnlineStoreConfig) or not store_cfg.skip_dedup:
            raise ValueError("write_views needs a redis online store with skip_dedup: true")
        merged: dict[bytes, dict[bytes | str, bytes]] = {}
        stamps: dict[datetime, bytes] = {}  # an entity's views share its event time: serialise each time once
        for table, view_rows in rows:
            for redis_key, (_, values, event_ts, _) in view_rows:
                stamp = stamps.get(event_ts)
                if stamp is None:
                    ts = Timestamp()
                    ts.FromDatetime(event_ts)
                    stamp = stamps[event_ts] = ts.SerializeToString()
                mapping = merged.setdefault(redis_key, {})
                mapping[f"_ts:{table.name}"] = stamp
                names = list(values)
                for field, name in zip(self._view_fields(table, names), names, strict=False):
                    mapping[field] = values[name].SerializeToString()
        client = self._get_client(store_cfg)
        with client.pipeline(transaction=False) as pipe:
            for redis_key, mapping in merged.items():
                pipe.hset(redis_key, mapping=mapping)  # type: ignore[arg-type]
                if store_cfg.key_ttl_seconds:
                    pipe.expire(name=redis_key, time=store_cfg.key_ttl_seconds)
            pipe.execute()

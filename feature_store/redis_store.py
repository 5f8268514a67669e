"""Feast's Redis online store, plus reading and writing several feature views in one pipeline.

Feast keeps every feature view of an entity in one Redis hash (key =
serialised entity key + project, fields = ``mmh3("<view>:<feature>")`` and
``_ts:<view>``; see Feast's ``docs/specs/online_store_format.md``). Its
``online_read`` / ``online_write_batch`` do one pipeline *per view*, so a
cardholder's three views cost three round trips to read and three to write.
This subclass issues one ``HMGET`` / ``HSET`` per entity for all views in a
single pipeline, in exactly Feast's format: ``get_online_features``,
``feast`` CLI and materialisation see the same data. Values cross this class as
Python values, encoded and decoded by :mod:`fedfraud.feature_store.feast_values`
without a ``Value`` object per field.

Writes here are last-writer-wins (``skip_dedup: true``, our profile's default);
with ``skip_dedup: false`` :class:`~fedfraud.feature_store.online.OnlineStateClient`
falls back to Feast's per-view writes, which compare event timestamps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from feast import FeatureView
from feast.infra.online_stores.helpers import _mmh3, compute_versioned_name
from feast.infra.online_stores.redis import RedisOnlineStore, RedisOnlineStoreConfig
from feast.repo_config import RepoConfig
from google.protobuf.timestamp_pb2 import Timestamp

from fedfraud.feature_store.feast_values import from_wire, value_kind, wire_encoder

__all__ = ["MultiViewRedisOnlineStore"]


class MultiViewRedisOnlineStore(RedisOnlineStore):
    """:class:`RedisOnlineStore` with one-pipeline multi-view :meth:`read_views` / :meth:`write_views`."""

    def __init__(self) -> None:
        super().__init__()
        self._fields: dict[tuple[str, tuple[str, ...]], list[bytes]] = {}
        self._encoders: dict[str, dict[str, tuple[bytes, Callable[[Any], bytes]]]] = {}

    def forget_views(self) -> None:
        """Drop the cached hash fields and encoders (after a ``feast apply`` changed the views)."""
        self._fields.clear()
        self._encoders.clear()

    @staticmethod
    def _stored_name(config: RepoConfig, table: FeatureView) -> str:
        """The view's name in the hash fields: with a ``_v<N>`` suffix when Feast versions online views."""
        return compute_versioned_name(table, config.registry.enable_online_feature_view_versioning)

    def _view_fields(self, name: str, features: Sequence[str]) -> list[bytes]:
        """Hash fields of ``features`` of the view stored as ``name`` (cached: mmh3 per call adds up)."""
        key = (name, tuple(features))
        cached = self._fields.get(key)
        if cached is None:
            cached = self._fields[key] = [_mmh3(f"{name}:{f}") for f in features]
        return cached

    def _view_encoders(self, name: str, table: FeatureView) -> dict[str, tuple[bytes, Callable[[Any], bytes]]]:
        """Feature name → (hash field, encoder by its declared dtype) of a view (cached)."""
        encoders = self._encoders.get(name)
        if encoders is None:
            names = [f.name for f in table.features]
            encoders = self._encoders[name] = {
                f.name: (field, wire_encoder(value_kind(f.dtype)))
                for f, field in zip(table.features, self._view_fields(name, names), strict=True)
            }
        return encoders

    def read_views(
        self,
        config: RepoConfig,
        tables: Sequence[tuple[FeatureView, Sequence[str]]],
        redis_keys: Sequence[bytes],
    ) -> list[list[dict[str, Any] | None]]:
        """Python values of several (view, features) for many entity keys in one pipeline: ``[view][entity]``.

        An entity none of whose fields of a view is stored (or all of them null) gets None for that view,
        as a first-time cardholder does on every store. Event timestamps
        (``_ts:<view>``) are not read: serving does not use them.
        """
        return self.read_view_groups(config, [(tables, redis_keys)])[0]

    def read_view_groups(
        self,
        config: RepoConfig,
        groups: Sequence[tuple[Sequence[tuple[FeatureView, Sequence[str]]], Sequence[bytes]]],
    ) -> list[list[list[dict[str, Any] | None]]]:
        """:meth:`read_views` of several (views, entity keys) groups in one pipeline: ``[group][view][entity]``.

        Why: serving reads the batch's cardholders and the merchant-risk rows of its merchants (other entities)
        in the same round trip.
        """
        plans = []
        for tables, keys in groups:
            spans: list[tuple[list[str], int, int]] = []
            fields: list[bytes] = []
            for table, features in tables:
                names = list(features)
                view_fields = self._view_fields(self._stored_name(config, table), names)
                spans.append((names, len(fields), len(fields) + len(view_fields)))
                fields.extend(view_fields)
            plans.append((spans, fields, keys))
        client = self._get_client(config.online_store)
        with client.pipeline(transaction=False) as pipe:
            for _, fields, keys in plans:
                for key in keys:
                    pipe.hmget(key, fields)
            replies = pipe.execute()
        out, at = [], 0
        for spans, _, keys in plans:
            mine, at = replies[at:at + len(keys)], at + len(keys)
            out.append([[_decoded(names, reply[a:b]) for reply in mine] for names, a, b in spans])
        return out

    def write_views(
        self, config: RepoConfig, rows: Sequence[tuple[FeatureView, Sequence[tuple[bytes, dict[str, Any], datetime]]]]
    ) -> None:
        """One ``HSET`` per entity key with the fields of every view given for it, in one pipeline.

        ``rows`` are (view, [(redis key, feature name → Python value, event time)]); values are encoded by the
        view's declared dtypes (:func:`~fedfraud.feature_store.feast_values.to_wire`).
        """
        store_cfg = config.online_store
        if not isinstance(store_cfg, RedisOnlineStoreConfig) or not store_cfg.skip_dedup:
            raise ValueError("write_views needs a redis online store with skip_dedup: true")
        merged: dict[bytes, dict[bytes | str, bytes]] = {}
        stamps: dict[datetime, bytes] = {}  # an entity's views share its event time: serialise each time once
        for table, view_rows in rows:
            name = self._stored_name(config, table)
            encoders = self._view_encoders(name, table)
            ts_field = f"_ts:{name}"
            for redis_key, values, event_ts in view_rows:
                stamp = stamps.get(event_ts)
                if stamp is None:
                    ts = Timestamp()
                    ts.FromDatetime(event_ts)
                    stamp = stamps[event_ts] = ts.SerializeToString()
                mapping = merged.setdefault(redis_key, {})
                mapping[ts_field] = stamp
                for feature, value in values.items():
                    try:
                        field, encode = encoders[feature]
                    except KeyError:
                        raise ValueError(f"feature view {table.name} has no feature {feature!r}") from None
                    mapping[field] = encode(value)
        client = self._get_client(store_cfg)
        with client.pipeline(transaction=False) as pipe:
            for redis_key, mapping in merged.items():
                pipe.hset(redis_key, mapping=mapping)
                if store_cfg.key_ttl_seconds:
                    pipe.expire(name=redis_key, time=store_cfg.key_ttl_seconds)
            pipe.execute()


def _decoded(names: Sequence[str], raws: Sequence[bytes | None]) -> dict[str, Any] | None:
    """Feature name → Python value of one entity's fields of one view; None when none is stored."""
    if not any(raws):
        return None
    return {name: from_wire(raw) for name, raw in zip(names, raws, strict=True)}

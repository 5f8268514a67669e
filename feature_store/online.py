"""Batched online access to cardholder states for streaming scoring: read many, update, push once.

Per micro-batch, serving's anomaly stage (:class:`fedfraud.serving.anomaly_stage.AnomalyStage`, the one place
that loop is written) calls :meth:`OnlineStateClient.read_states` (one batched read of the ego-graph blob,
activity, latest T' and q_t of many cardholders), :meth:`CardholderState.apply` per transaction and
:meth:`OnlineStateClient.push` (one write of the three cardholder views and the merchant view).

Why not ``FeatureStore.get_online_features`` / ``FeatureStore.push``: they
rebuild request plans and convert through pandas/arrow on every call, which
costs milliseconds per 64 rows (``fedfraud bench features --store`` measures
both). This client resolves the feature views once and deals in Python values. On SQLite (or any other
store) it calls the online store's own ``online_read`` / ``online_write_batch`` (Feast's ``OnlineStore``
interface, what ``get_online_features`` and ``push`` end in) with protos it builds by the views' dtypes; on
Redis it reads and writes every view of a batch in one pipeline each way, encoding values straight to
Feast's bytes (:mod:`~fedfraud.feature_store.redis_store`, :mod:`~fedfraud.feature_store.feast_values`).
Rows are bit-identical to what the SDK writes. The feature lists are those of the applied views, so
the repo's ``definitions.py`` is the one declaration of a cardholder's fields; the versioned services
(``anomaly_scoring_v1``, ``fraud_scoring_v1``) are how the plain SDK reads the same rows, and
``tests/integration/test_feature_store_online.py`` reads what this client wrote through them.

A first-time cardholder gets an empty state; a corrupt or truncated ego-graph
blob is logged and rebuilt from empty (``rebuilt=True``), never raised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime, UTC
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedfraud.feature_store.activity import Activity
from fedfraud.feature_store.cardholder import CardholderState, PreparedBatch
from fedfraud.feature_store.config import EgoGraphConfig
from fedfraud.feature_store.egograph import CorruptStateError, EgoGraphState
from fedfraud.feature_store.feast_values import from_proto, from_wire, to_proto, value_kind, wire_encoder
from fedfraud.feature_store.store_config import FeatureStoreConfig

if TYPE_CHECKING:
    from feast import FeatureStore, FeatureView
    from feast.infra.online_stores.online_store import OnlineStore
    from feast.infra.online_stores.sqlite import SqliteOnlineStore
    from feast.protos.feast.types.EntityKey_pb2 import EntityKey
    from feast.protos.feast.types.Value_pb2 import Value
    from feast.repo_config import RepoConfig

    from fedfraud.feature_store.redis_store import MultiViewRedisOnlineStore

__all__ = ["CARDHOLDER_VIEWS", "HIN2VEC_VIEW", "MERCHANT_RISK_VIEW", "MERCHANT_VIEW", "Hin2VecRow", "OnlineStateClient",
           "RiskRow"]

logger = logging.getLogger(__name__)

#: Cardholder feature views written by one push. Their fields are declared once, in the repo's definitions.py
#: (``cardholder_activity``'s are :class:`~fedfraud.feature_store.activity.Activity`'s, checked by a test); the
#: client reads each view's feature list from the applied registry.
CARDHOLDER_VIEWS: tuple[str, ...] = ("cardholder_ego_state", "cardholder_time", "cardholder_activity")
MERCHANT_VIEW = "merchant_location"
#: The daily merchant-risk release and the bank's own counts, per (bank, merchant bucket).
MERCHANT_RISK_VIEW = "merchant_risk"
#: The latest G-HIN2Vec embedding per cardholder, written by a scorer whose fraud model reads it.
HIN2VEC_VIEW = "cardholder_hin2vec"
#: A bank's private demographics per cardholder (issue 39), read with the states when a model needs them.
DEMOGRAPHICS_VIEW = "cardholder_demographics"


def _from_us(us: int) -> datetime:
    return datetime.fromtimestamp(us // 1_000_000, tz=UTC).replace(microsecond=us % 1_000_000)


#: A Feast entity of this module: a card token, (bank, merchant key) of ``merchant_location`` (a keyed hash,
#: :func:`fedfraud.feature_store.cardholder.merchant_key`) or (bank, merchant bucket) of ``merchant_risk``.
Entity = str | tuple[int, str] | tuple[int, int]
#: A ``merchant_risk`` row: release day, the bank's own columns, the federation's columns (None: no row yet).
RiskRow = dict[str, Any] | None
#: A ``cardholder_hin2vec`` row: (card token, embedding ``[dim]``, hin2vec model tag, state version, last seen µs).
Hin2VecRow = tuple[str, Any, str, int, int]
#: Rows of one view: (entity, feature name → Python value, event time, created time).
ViewRows = list[tuple[Entity, dict[str, Any], datetime, datetime]]
#: Python values of one view per entity, None for an entity the store has no row of.
ViewValues = list[dict[str, Any] | None]


class _ViewIO:
    """Per-view reads and writes through Feast's ``OnlineStore`` interface (any online store).

    Values cross this interface as Python values; this generic path converts them to and from ``Value``
    protos by the views' declared dtypes (:mod:`~fedfraud.feature_store.feast_values`).
    """

    def __init__(self, online: OnlineStore, config: RepoConfig) -> None:
        self.online = online
        self.config = config
        self._kinds: dict[str, dict[str, str]] = {}
        self._keys: dict[Entity, bytes] = {}

    def forget_views(self) -> None:
        """Drop what was cached about the views (after a ``feast apply`` changed them)."""
        self._kinds.clear()

    #: Entities whose serialized keys are kept (a bounded cache: cleared whole when it would overflow).
    _KEY_CACHE = 1 << 17

    def _cached_keys(self, entities: Sequence[Entity],
                     build: Callable[[list[Entity]], Sequence[bytes]]) -> list[bytes]:
        """The store's key bytes of each entity, ``build`` run once per entity not seen before: a hot card's key
        is serialized once, not once per micro-batch.
        """
        cache = self._keys
        missing = list(dict.fromkeys(e for e in entities if e not in cache))
        if missing:
            if len(cache) + len(missing) > self._KEY_CACHE:
                cache.clear()  # the batch's already-cached entities go too: build them all again
                missing = list(dict.fromkeys(entities))
            cache.update(zip(missing, build(missing), strict=True))
        return [cache[e] for e in entities]

    def read(self, tables: Sequence[tuple[FeatureView, Sequence[str]]], entities: Sequence[Entity]) -> list[ViewValues]:
        keys = _entity_keys(entities)
        return [
            [
                None if values is None else {k: from_proto(v) for k, v in values.items()}
                for _, values in self.online.online_read(self.config, table, keys, list(features))
            ]
            for table, features in tables
        ]

    def read_groups(
        self, groups: Sequence[tuple[Sequence[tuple[FeatureView, Sequence[str]]], Sequence[Entity]]]
    ) -> list[list[ViewValues]]:
        """:meth:`read` of several (views, entities) groups; one round trip where the store allows (Redis)."""
        return [self.read(tables, entities) for tables, entities in groups]

    def write(self, rows: Sequence[tuple[FeatureView, ViewRows]]) -> None:
        for table, view_rows in rows:
            kinds = self._kinds.get(table.name)
            if kinds is None:
                kinds = self._kinds[table.name] = {f.name: value_kind(f.dtype) for f in table.features}
            keys = _entity_keys([entity for entity, *_ in view_rows])
            data: list[tuple[EntityKey, dict[str, Value], datetime, datetime | None]] = [
                (key, {name: to_proto(kinds[name], v) for name, v in values.items()}, ts, created)
                for key, (_, values, ts, created) in zip(keys, view_rows, strict=True)
            ]
            if data:
                self.online.online_write_batch(self.config, table, data, None)


class _RedisViewIO(_ViewIO):
    """All views of a batch, cardholders and merchants, in one Redis pipeline each way (:mod:`.redis_store`)."""

    def __init__(self, online: MultiViewRedisOnlineStore, config: RepoConfig) -> None:
        super().__init__(online, config)
        self.multi = online

    def forget_views(self) -> None:
        super().forget_views()
        self.multi.forget_views()

    def _redis_keys(self, entities: Sequence[Entity]) -> list[bytes]:
        return self._cached_keys(
            entities, lambda missing: self.multi._generate_redis_keys_for_entities(self.config, _entity_keys(missing)))

    def read(self, tables: Sequence[tuple[FeatureView, Sequence[str]]], entities: Sequence[Entity]) -> list[ViewValues]:
        return self.multi.read_views(self.config, tables, self._redis_keys(entities))

    def read_groups(
        self, groups: Sequence[tuple[Sequence[tuple[FeatureView, Sequence[str]]], Sequence[Entity]]]
    ) -> list[list[ViewValues]]:
        return self.multi.read_view_groups(self.config, [(t, self._redis_keys(e)) for t, e in groups])

    def write(self, rows: Sequence[tuple[FeatureView, ViewRows]]) -> None:
        merged = []
        for table, view_rows in rows:
            keys = self._redis_keys([entity for entity, *_ in view_rows])
            merged.append((table, [(k, v, ts) for k, (_, v, ts, _) in zip(keys, view_rows, strict=True)]))
        self.multi.write_views(self.config, merged)


class _SqliteViewIO(_ViewIO):
    """All views of a batch in one SQLite transaction, on a WAL journal, in Feast's tables and row format.

    Feast's SQLite store commits each view's ``online_write_batch`` on its own, and with the default rollback
    journal every commit syncs the journal and the database: four views were four syncs per micro-batch. Here
    one transaction holds every view of the batch, and one commit (or one rollback) ends it. WAL lets readers
    of other processes go on while a replica writes; ``synchronous=NORMAL``, as serving's SQLite KV store, syncs
    at checkpoints instead of at every commit.

    Feast's ``online_write_batch`` and ``online_read`` also build a ``Value`` proto per feature and serialise
    each entity key on every call, then run one ``execute`` per feature (issue 42: about 16 per transaction,
    the largest CPU section of a replica on SQLite). Where the store's layout is Feast's plain one (no
    ``value_num`` or vector column), this class writes the very rows Feast writes (same serialised key,
    feature name, ``Value`` bytes (:func:`~fedfraud.feature_store.feast_values.to_wire`), ``value_text`` and
    timestamps, same upsert) with one ``executemany`` per view, reads them with Feast's query and decodes the
    bytes with :func:`~fedfraud.feature_store.feast_values.from_wire`, as the Redis path does; entity keys are
    serialised once per process (``tests/integration/test_feature_store_online.py`` reads the rows back
    through the SDK). Any other layout goes through Feast's own methods inside the same one transaction.
    """

    def __init__(self, online: SqliteOnlineStore, config: RepoConfig) -> None:
        super().__init__(online, config)
        self._conn = online._get_conn(config)  # Feast's SqliteOnlineStore keeps one connection per store
        mode = str(self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]).lower()
        if mode == "wal":
            # the durability of serving's SQLite KV store (score rings, fraud states): no fsync per commit, so a
            # micro-batch no longer waits on the disk (issue 42). A process crash loses nothing; an OS crash or a
            # power loss may roll back the last commits (the file stays consistent), and the Kafka offsets of
            # those batches may already be committed, so their transactions are missing from the ego graphs
            self._conn.execute("PRAGMA synchronous=NORMAL")
        else:  # without WAL, NORMAL could corrupt the file on a power loss: keep SQLite's default (FULL)
            logger.warning("SQLite online store %s: journal mode %s, not WAL; keeping synchronous=FULL",
                        config.online_store, mode)
        store = config.online_store
        self._plain = not (getattr(store, "vector_enabled", False)
                           or getattr(store, "enable_openai_compatible_store", False))
        self._tables: dict[str, tuple[str, dict[str, tuple[Any, Any]]]] = {}

    def forget_views(self) -> None:
        super().forget_views()
        self._tables.clear()

    def _key_bytes(self, entities: Sequence[Entity]) -> list[bytes]:
        """Feast's ``serialize_entity_key`` of each entity, computed once per entity."""
        from feast.infra.key_encoding_utils import serialize_entity_key

        version = self.config.entity_key_serialization_version
        return self._cached_keys(entities, lambda missing: [
            serialize_entity_key(key, entity_key_serialization_version=version) for key in _entity_keys(missing)])

    def _table(self, table: FeatureView) -> tuple[str, dict[str, tuple[Any, Any]]]:
        """The quoted SQLite table of ``table`` and, per feature, its wire encoder and its ``value_text`` (None:
        Feast leaves the column null for that kind, ``extract_text_and_num``).
        """
        known = self._tables.get(table.name)
        if known is None:
            from feast.infra.online_stores.sqlite import _quote_id, _table_id

            name = _quote_id(_table_id(self.config.project, table,
                                       self.config.registry.enable_online_feature_view_versioning))
            features = {}
            for f in table.features:
                kind = value_kind(f.dtype)
                features[f.name] = (wire_encoder(kind), _TEXT.get(kind))
            known = self._tables[table.name] = (name, features)
        return known

    def read(self, tables: Sequence[tuple[FeatureView, Sequence[str]]], entities: Sequence[Entity]) -> list[ViewValues]:
        if not self._plain:
            return super().read(tables, entities)
        keys = self._key_bytes(entities)
        marks = ",".join("?" * len(keys))
        out: list[ViewValues] = []
        for table, _features in tables:  # like Feast's online_read, every stored feature of the row comes back
            if not keys:
                out.append([])
                continue
            name, _ = self._table(table)
            found: dict[bytes, dict[str, Any]] = {}
            for key, feature, raw in self._conn.execute(
                    f"SELECT entity_key, feature_name, value FROM {name} WHERE entity_key IN ({marks})", keys):
                found.setdefault(key, {})[feature] = from_wire(raw)
            out.append([found.get(k) for k in keys])
        return out

    def write(self, rows: Sequence[tuple[FeatureView, ViewRows]]) -> None:
        online: Any = self.online
        online._conn = _OneTransaction(self._conn)
        try:
            with self._conn:  # commits once at the end, rolls every view back if one fails
                if self._plain:
                    self._write_rows(rows)
                else:
                    super().write(rows)
        finally:
            online._conn = self._conn

    def _write_rows(self, rows: Sequence[tuple[FeatureView, ViewRows]]) -> None:
        """Feast's rows of each view (its ``online_write_batch`` without ``value_num`` or vectors), one
        ``executemany`` per view.
        """
        from feast.utils import to_naive_utc

        for table, view_rows in rows:
            if not view_rows:
                continue
            name, features = self._table(table)
            keys = self._key_bytes([entity for entity, *_ in view_rows])
            data = []
            for key, (_, values, ts, created) in zip(keys, view_rows, strict=True):
                event, made = to_naive_utc(ts), None if created is None else to_naive_utc(created)
                for feature, value in values.items():
                    encode, text = features[feature]
                    raw = encode(value)
                    shown = None if value is None or text is None else text(value)
                    data.append((key, feature, raw, shown, event, made))
            self._conn.executemany(
                f"INSERT INTO {name} (entity_key, feature_name, value, value_text, event_ts, created_ts) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(entity_key, feature_name) DO UPDATE SET "
                "value = excluded.value, value_text = excluded.value_text, event_ts = excluded.event_ts, "
                "created_ts = excluded.created_ts;", data)


#: Feast's ``value_text`` of a set ``Value`` of each kind (``extract_text_and_num``: ``str`` of what the proto holds).
_TEXT: dict[str, Any] = {"string_val": str, "int64_val": lambda v: str(int(v)), "double_val": lambda v: str(float(v))}


class _OneTransaction:
    """A SQLite connection whose ``with`` blocks neither commit nor roll back (the caller's block does)."""

    def __init__(self, conn: Any) -> None:
        self._wrapped = conn

    def __enter__(self) -> _OneTransaction:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)


def _view_io(config: RepoConfig) -> _ViewIO:
    """The fastest reader/writer the configured online store allows."""
    from feast.infra.online_stores.helpers import get_online_store_from_config
    from feast.infra.online_stores.redis import RedisOnlineStoreConfig, RedisType

    store_cfg = config.online_store
    if (
        isinstance(store_cfg, RedisOnlineStoreConfig)
        and store_cfg.skip_dedup
        and store_cfg.redis_type == RedisType.redis
        and str(store_cfg.client.value) == "redis"
    ):
        from fedfraud.feature_store.redis_store import MultiViewRedisOnlineStore

        return _RedisViewIO(MultiViewRedisOnlineStore(), config)
    from feast.infra.online_stores.sqlite import SqliteOnlineStore

    online = get_online_store_from_config(store_cfg)
    if isinstance(online, SqliteOnlineStore):
        return _SqliteViewIO(online, config)
    return _ViewIO(online, config)


def _entity_keys(entities: Sequence[Entity]) -> list[EntityKey]:
    """Feast entity keys: ``cardholder`` for a pseudonym, ``(bank, merchant)`` for a merchant tuple."""
    from feast.protos.feast.types.EntityKey_pb2 import EntityKey
    from feast.protos.feast.types.Value_pb2 import Value

    def key(e: Entity) -> EntityKey:
        if isinstance(e, str):
            return EntityKey(join_keys=["cardholder"], entity_values=[Value(string_val=e)])
        if isinstance(e[1], str):
            return EntityKey(join_keys=["bank", "merchant"], entity_values=[Value(int64_val=e[0]),
                                                                            Value(string_val=e[1])])
        return EntityKey(join_keys=["bank", "merchant_bucket"], entity_values=[Value(int64_val=e[0]),
                                                                                Value(int64_val=int(e[1]))])

    return [key(e) for e in entities]


class OnlineStateClient:
    """Batched reads and pushes of cardholder states through a Feast online store (SQLite or Redis)."""

    def __init__(self, store: FeatureStore, ego_cfg: EgoGraphConfig, cell_deg: float = 0.1) -> None:
        self.store = store
        self.ego_cfg = ego_cfg
        self.cell_deg = cell_deg
        self._io = _view_io(store.config)
        self._views: dict[str, FeatureView] = {}
        self.refresh()

    @classmethod
    def open(
        cls,
        cfg: FeatureStoreConfig,
        ego_cfg: EgoGraphConfig,
        repo_dir: Path | None = None,
        profile: str | None = None,
    ) -> OnlineStateClient:
        """Client on the rendered repo of ``profile`` (must have been applied: ``fedfraud features apply``)."""
        from fedfraud.feature_store.feast_store import open_store

        return cls(open_store(cfg, repo_dir, profile), ego_cfg, cfg.location_cell_deg)

    def refresh(self) -> None:
        """Re-read the feature views from the registry (after a ``feast apply``)."""
        from fedfraud.core.errors import UserError

        try:
            for name in (*CARDHOLDER_VIEWS, MERCHANT_VIEW, MERCHANT_RISK_VIEW):
                self._views[name] = self.store.get_feature_view(name)
        except Exception as exc:  # FeatureViewNotFoundException and registry-missing errors
            raise UserError(
                f"feature repo {self.store.repo_path} is not applied ({exc.__class__.__name__}); "
                "run `fedfraud features apply`"
            ) from None
        for optional in (HIN2VEC_VIEW, DEMOGRAPHICS_VIEW):  # a repo applied before these views existed still serves
            try:  # every model that does not read them
                self._views[optional] = self.store.get_feature_view(optional)
            except Exception:  # FeatureViewNotFoundException
                self._views.pop(optional, None)
        self._io.forget_views()
        self._cardholder_tables = [
            (self._views[name], tuple(f.name for f in self._views[name].features)) for name in CARDHOLDER_VIEWS
        ]

    # ------------------------------------------------------------------ read
    def read_states(self, cardholders: Sequence[str]) -> list[CardholderState]:
        """States of many cardholders (pseudonyms) in one batched read; unknown ones come back empty."""
        return self.read_batch(cardholders)[0]

    def read_batch(self, cardholders: Sequence[str], bank: int = 0, buckets: Sequence[int] = (),
                   demographics: bool = False) -> tuple[list[CardholderState], list[RiskRow]]:
        """States of many cardholders and the ``merchant_risk`` rows of ``bank`` at ``buckets``, in one read; with
        ``demographics``, each state's ``cardholder_demographics`` row too (``CardholderState.demographics``).

        Why together: the fraud model's merchant-risk and demographic columns then cost no extra round trip, and
        every read sees the latest release the daily job wrote (no restart, no cache to invalidate).
        """
        tables = self._cardholder_tables + ([self._demographics_table()] if demographics else [])
        if not buckets:
            return self._states(cardholders, self._io.read(tables, cardholders)), []
        risk_view = self._views[MERCHANT_RISK_VIEW]
        (ego_time_act, (risk,)) = self._io.read_groups([
            (tables, cardholders),
            ([(risk_view, ("release_day", "merchant_bank", "merchant_fed"))], [(bank, int(b)) for b in buckets]),
        ])
        return self._states(cardholders, ego_time_act), risk

    def _demographics_table(self) -> tuple[FeatureView, tuple[str, ...]]:
        """The applied ``cardholder_demographics`` view and its fields; a one-line error when the repo predates it."""
        from fedfraud.core.errors import UserError
        from fedfraud.feature_store.demographics import DEMOGRAPHIC_FIELDS

        view = self._views.get(DEMOGRAPHICS_VIEW)
        if view is None:
            raise UserError(f"feature repo {self.store.repo_path} has no view {DEMOGRAPHICS_VIEW}: run "
                            "`fedfraud features apply --data DIR` to serve a model with demographic columns")
        return view, DEMOGRAPHIC_FIELDS

    def _states(self, cardholders: Sequence[str], rows: list[ViewValues]) -> list[CardholderState]:
        ego_rows, time_rows, act_rows = rows[:3]
        demo_rows = rows[3] if len(rows) > 3 else [None] * len(cardholders)
        out: list[CardholderState] = []
        for holder, ego_row, time_row, act_row, demo_row in zip(cardholders, ego_rows, time_rows, act_rows, demo_rows,
                                                                strict=True):
            state = CardholderState.empty(holder, self.ego_cfg)
            blob = ego_row.get("ego_state") if ego_row else None
            if blob is not None:
                state.found = True
                try:
                    state.ego = EgoGraphState.from_bytes(blob, self.ego_cfg)
                except CorruptStateError as exc:
                    logger.warning(
                        "corrupt_state cardholder=%s bytes=%d reason=%s; rebuilt empty", holder, len(blob), exc
                    )
                    state.rebuilt = True
            if ego_row and ego_row.get("q_t") is not None:
                state.q_t = ego_row["q_t"]
            if time_row:
                state.time_embedding = time_row.get("time_embedding")
                state.epsilon = time_row.get("epsilon")
            if act_row:  # activity is its own view: a corrupt ego blob does not invalidate it
                state.activity = Activity.from_features(act_row)
            state.demographics = dict(demo_row) if demo_row else None
            out.append(state)
        return out

    # ------------------------------------------------------------------ write
    def _cardholder_rows(self, states: Sequence[CardholderState]) -> list[tuple[FeatureView, ViewRows]]:
        now = datetime.now(UTC)
        ego_rows: ViewRows = []
        time_rows: ViewRows = []
        act_rows: ViewRows = []
        for s in states:
            act = s.activity
            ts = _from_us(act.last_seen_us) if act.tx_count else now
            ego = {"ego_state": s.ego.to_bytes(), "q_t": s.q_t, "state_version": s.version}
            ego_rows.append((s.cardholder, ego, ts, now))
            tim: dict[str, Any] = {}
            if s.time_embedding is not None:
                tim["time_embedding"] = s.time_embedding
            if s.epsilon is not None:
                tim["epsilon"] = s.epsilon
            if tim:
                time_rows.append((s.cardholder, tim, ts, now))
            act_rows.append((s.cardholder, act.to_features(), ts, now))
        views = self._views
        return [
            (views["cardholder_ego_state"], ego_rows),
            (views["cardholder_time"], time_rows),
            (views["cardholder_activity"], act_rows),
        ]

    def push_states(self, states: Sequence[CardholderState]) -> None:
        """Write the states back in one push (the three ``cardholder_push`` views), event time = last_seen."""
        if states:
            self._io.write(self._cardholder_rows(states))

    def _merchant_rows(self, bank: int, batch: PreparedBatch, rows: Sequence[int]) -> ViewRows:
        """``merchant_location`` rows of the latest of ``rows`` per merchant (rows are in event-time order)."""
        latest: dict[str, int] = {}
        for i in rows:  # the last one wins, like materialisation
            latest[batch.merchant_key(i)] = i
        now = datetime.now(UTC)
        return [
            (
                (bank, merchant),
                {"location_embedding": batch.features.location[i], "merchant_bucket": int(batch.features.merchant[i])},
                _from_us(batch.ts_us[i]),
                now,
            )
            for merchant, i in latest.items()
        ]

    def push_merchants(self, bank: int, batch: PreparedBatch, rows: Sequence[int]) -> None:
        """Write the noised location of the latest of ``rows`` per merchant of ``batch`` (``merchant_location``)."""
        merchants = self._merchant_rows(bank, batch, rows)
        if merchants:
            self._io.write([(self._views[MERCHANT_VIEW], merchants)])

    def push(self, states: Sequence[CardholderState], bank: int, batch: PreparedBatch, rows: Sequence[int],
             hin2vec: Sequence[Hin2VecRow] = ()) -> None:
        """:meth:`push_states` and :meth:`push_merchants` in one write (one pipeline on Redis): serving's hot path;
        with ``hin2vec``, the cardholders' latest G-HIN2Vec embeddings (``cardholder_hin2vec``) in the same write.
        """
        views = self._cardholder_rows(states) if states else []
        merchants = self._merchant_rows(bank, batch, rows)
        if merchants:
            views.append((self._views[MERCHANT_VIEW], merchants))
        if hin2vec:
            views.append((self.hin2vec_view(), self._hin2vec_rows(hin2vec)))
        if views:
            self._io.write(views)

    def hin2vec_view(self) -> FeatureView:
        """The applied ``cardholder_hin2vec`` view; a one-line error when the repo predates it."""
        from fedfraud.core.errors import UserError

        view = self._views.get(HIN2VEC_VIEW)
        if view is None:
            raise UserError(f"feature repo {self.store.repo_path} has no {HIN2VEC_VIEW} view: run "
                            "`fedfraud features apply` to serve a fraud model with hin2vec columns")
        return view

    @staticmethod
    def _hin2vec_rows(rows: Sequence[Hin2VecRow]) -> ViewRows:
        now = datetime.now(UTC)
        return [(holder, {"hin2vec": vector, "hin2vec_model": tag, "state_version": int(version)},
                 _from_us(last_us) if last_us else now, now)
                for holder, vector, tag, version, last_us in rows]

    def push_merchant_risk(self, bank: int, release_day: int, buckets: Sequence[int], own: Any, fed: Any) -> None:
        """Write ``merchant_risk`` rows of ``bank`` for release ``release_day``: per bucket, the bank's own columns
        (row ``i`` of ``own``) and the federation's (row ``i`` of ``fed``); event time = the end of that day.
        """
        ts, now = _from_us((int(release_day) + 1) * 86_400_000_000 - 1), datetime.now(UTC)
        rows: ViewRows = [
            ((bank, int(b)), {"release_day": int(release_day), "merchant_bank": own[i], "merchant_fed": fed[i]},
             ts, now)
            for i, b in enumerate(buckets)
        ]
        view = self._views[MERCHANT_RISK_VIEW]
        for start in range(0, len(rows), 4096):  # bounded transactions / pipelines
            self._io.write([(view, rows[start:start + 4096])])
        logger.info("merchant_risk_pushed bank=%d release_day=%d rows=%d", bank, release_day, len(rows))

    def read_merchants(self, bank: int, merchants: Sequence[str]) -> list[dict[str, Any] | None]:
        """``merchant_location`` features of many merchants of ``bank`` in one read (None when unknown).

        ``merchants`` are store keys (:func:`fedfraud.feature_store.cardholder.merchant_key`), never names.
        """
        view = self._views[MERCHANT_VIEW]
        (rows,) = self._io.read([(view, [f.name for f in view.features])], [(bank, m) for m in merchants])
        return rows

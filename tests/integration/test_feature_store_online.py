"""Real Feast apply → materialize → online read → push cycle on SQLite and on the running Redis.

No mocks: each profile gets its own rendered repo in a temp folder; Redis uses
db 15 and a per-run project whose keys are torn down afterwards.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedfraud.config import FedfraudConfig
from fedfraud.feature_store.cardholder import prepare_batch
from fedfraud.feature_store.egograph import EgoGraphState
from fedfraud.feature_store.offline import CARDHOLDER_FILE, bank_tables, write_offline
from fedfraud.feature_store.privacy import PrivateFeaturizer
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.feature_store.layout import read_bank
from fedfraud.training.data.synthetic import generate_dataset

from tests.prerequisites import require_redis

pytestmark = pytest.mark.integration

REDIS_URL = "127.0.0.1:6379,db=15"
MATERIALIZED_BANK, STREAMED_BANK = 0, 1


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fs-data")
    generate_dataset(out, GeneratorConfig(banks=2, cardholders=60, days=14, seed=3), raw_csv=False, progress=False)
    return out


@pytest.fixture(scope="module", params=["sqlite", "redis"])
def built(request: pytest.FixtureRequest, dataset: Path, tmp_path_factory: pytest.TempPathFactory):
    """Offline tables of bank 0 written, `feast apply` + materialize into the profile's online store."""
    from fedfraud.feature_store.feast_store import apply_repo, materialize_repo, open_store
    from fedfraud.feature_store.online import OnlineStateClient

    profile = request.param
    if profile == "redis":
        require_redis()
    base = FedfraudConfig()
    features = base.features.model_copy(
        update={
            "project": f"fedfraud_test_{os.getpid()}",
            "redis": base.features.redis.model_copy(update={"connection_string": REDIS_URL}),
        }
    )
    cfg = base.model_copy(update={"features": features})
    repo = tmp_path_factory.mktemp(f"fs-repo-{profile}")
    write_offline(
        dataset,
        repo,
        cfg.encoder,
        cfg.privacy,
        cfg.egograph,
        features.location_cell_deg,
        banks=[MATERIALIZED_BANK],
        progress=False,
    )
    store = open_store(features, repo, profile)
    apply_repo(store)
    materialize_repo(store)
    client = OnlineStateClient(store, cfg.egograph, features.location_cell_deg)
    yield cfg, store, client
    store.teardown()


def _offline(dataset: Path, cfg: FedfraudConfig, bank: int):
    featurizer = PrivateFeaturizer.for_bank(cfg.encoder, cfg.privacy, bank)
    batch = prepare_batch(read_bank(dataset, bank), featurizer)
    return featurizer, bank_tables(batch, bank, cfg.egograph, cfg.features.location_cell_deg)


def test_one_declaration_of_the_cardholder_fields(built, dataset: Path) -> None:
    """The repo's views are the one declaration: offline columns, Activity and the online client agree with it."""
    from fedfraud.feature_store.activity import ACTIVITY_FEATURES
    from fedfraud.feature_store.online import CARDHOLDER_VIEWS

    cfg, store, client = built
    declared = {name: [f.name for f in store.get_feature_view(name).features] for name in CARDHOLDER_VIEWS}
    assert declared["cardholder_activity"] == list(ACTIVITY_FEATURES)
    assert [list(features) for _, features in client._cardholder_tables] == list(declared.values())
    _, tables = _offline(dataset, cfg, MATERIALIZED_BANK)
    keys = ["cardholder", "event_timestamp", "created"]
    assert sorted(tables.cardholder.column_names) == sorted(keys + [f for fs in declared.values() for f in fs])


def test_materialized_states_read_back_identical(built, dataset: Path) -> None:
    cfg, store, client = built
    _, tables = _offline(dataset, cfg, MATERIALIZED_BANK)
    holders = sorted(tables.states)
    got = client.read_states(holders)
    assert all(s.found and not s.rebuilt for s in got)
    for s in got:
        want = tables.states[s.cardholder]
        assert s.ego.to_bytes() == want.ego.to_bytes()
        assert s.activity == want.activity
        np.testing.assert_array_equal(s.time_embedding, want.time_embedding)
        assert s.q_t.shape == (0,)
    # the plain SDK sees the same rows through the versioned service
    sdk = store.get_online_features(
        features=store.get_feature_service("anomaly_scoring_v1"), entity_rows=[{"cardholder": holders[0]}]
    ).to_dict()
    assert sdk["ego_state"][0] == tables.states[holders[0]].ego.to_bytes()
    assert sdk["state_version"][0] == tables.states[holders[0]].version


def test_push_round_trip_and_sdk_compat(built) -> None:
    cfg, store, client = built
    holders = [f"push-{i}" for i in range(3)]
    states = client.read_states(holders)
    assert [s.found for s in states] == [False] * 3  # first transaction: empty, no error
    for k, s in enumerate(states):
        s.ego.update(
            key=100 + k, merchant=7, lat=40.0, lon=-74.0, ts_us=1_767_225_600_000_000 + k, amount=12.5, mcc="home"
        )
        s.activity.update(1_767_225_600_000_000 + k, 12.5 * (k + 1), 40.0, -74.0, "grocery_pos", 0.1)
        s.q_t = np.arange(4, dtype=np.float32) + k
    client.push_states(states)
    back = client.read_states(holders)
    for s, b in zip(states, back, strict=True):
        assert b.found and b.ego == s.ego and b.activity == s.activity
        np.testing.assert_array_equal(b.q_t, s.q_t)
    sdk = store.get_online_features(
        features=["cardholder_ego_state:state_version", "cardholder_activity:amount_sum"],
        entity_rows=[{"cardholder": h} for h in holders],
    ).to_dict()
    assert sdk["state_version"] == [1, 1, 1]
    assert sdk["amount_sum"] == [12.5, 25.0, 37.5]


def _touched_states(client, names: list[str], key: int, ts_us: int, amount: float) -> list:
    """The states of ``names``, each given one transaction, an embedding, a time embedding and an ε (every kind of
    stored value)."""
    states = client.read_states(names)
    for k, s in enumerate(states):
        s.ego.update(key=key + k, merchant=3, lat=41.5, lon=-73.25, ts_us=ts_us + k, amount=amount, mcc="travel")
        s.activity.update(ts_us + k, amount + k, 41.5, -73.25, "travel", 0.1)
        s.q_t = np.linspace(-1, 1, 5, dtype=np.float32) * (k + 1)
        s.time_embedding = np.array([0.1, -2.5, 3e-8], dtype=np.float32)
        s.epsilon = 0.75 + k
    return states


@pytest.mark.parametrize("built", ["redis"], indirect=True)  # the Redis writer only
def test_redis_hash_bytes_are_what_the_sdk_push_writes(built) -> None:
    """Serving's Redis writer encodes values itself: the stored hash is byte for byte the SDK push's."""
    from feast.data_source import PushMode

    from fedfraud.bench.store import _push_frame

    _, store, client = built
    ours, sdk = ["bytes-ours-0", "bytes-ours-1"], ["bytes-sdk-0", "bytes-sdk-1"]
    states = _touched_states(client, ours, key=9, ts_us=1_767_225_600_000_123, amount=7.25)
    client.push_states(states)
    for s, name in zip(states, sdk, strict=True):
        s.cardholder = name
    store.push("cardholder_push", _push_frame(states), to=PushMode.ONLINE)
    # a merchant row, written by serving's writer and by the SDK
    when = pd.Timestamp("2026-01-02 03:04:05.678901", tz="UTC")
    location = np.array([0.25, -1.5, 7e-3, 0.0], dtype=np.float32)
    merchant = store.get_feature_view("merchant_location")
    client._io.write([(merchant, [((4, "bytes-m-ours"), {"location_embedding": location, "merchant_bucket": 77},
                                   when.to_pydatetime(), when.to_pydatetime())])])
    store.write_to_online_store("merchant_location", pd.DataFrame(
        {"bank": [4], "merchant": ["bytes-m-sdk"], "event_timestamp": [when], "created": [when],
         "location_embedding": [location], "merchant_bucket": [77]}))

    redis = client._io.multi._get_client(store.config.online_store)
    pairs = [*zip(client._io._redis_keys(ours), client._io._redis_keys(sdk), [3 + (3 + 2 + 13)] * 2, strict=True),
             (*client._io._redis_keys([(4, "bytes-m-ours"), (4, "bytes-m-sdk")]), 1 + 2)]
    for a, b, n_fields in pairs:  # n_fields: a _ts field per view and every feature of the views
        written, pushed = redis.hgetall(a), redis.hgetall(b)
        assert len(written) == n_fields
        assert written == pushed


@pytest.mark.parametrize("built", ["sqlite"], indirect=True)  # the SQLite writer only
def test_sqlite_writes_a_batch_of_every_view_in_one_transaction(built) -> None:
    """Serving's SQLite writes: Feast's upsert for every view, one commit per batch (not one per view)."""
    _, store, client = built
    conn = client._io._conn
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    try:
        states = client.read_states([f"tx-{i}" for i in range(3)])
        for k, s in enumerate(states):
            s.activity.update(1_767_225_600_000_000 + k, 5.0, 40.0, -74.0, "grocery_pos", 0.1)
        statements.clear()
        client.push_states(states)
    finally:
        conn.set_trace_callback(None)
    upserts = [q for q in statements if q.lstrip().upper().startswith("INSERT")]
    assert len({q.split("(")[0] for q in upserts}) >= 2, "a batch writes several views"
    assert sum(q.strip().upper() == "COMMIT" for q in statements) == 1
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL: no fsync per micro-batch
    sdk = store.get_online_features(features=["cardholder_activity:amount_sum"],
                                    entity_rows=[{"cardholder": "tx-2"}]).to_dict()
    assert sdk["amount_sum"] == [5.0]  # Feast's SDK reads what the one transaction wrote


@pytest.mark.parametrize("built", ["sqlite"], indirect=True)  # the SQLite writer only
def test_sqlite_rows_are_what_feasts_online_write_batch_writes(built) -> None:
    """Serving's SQLite writer skips Feast's per-feature protos and executes: every stored column (value bytes,
    value_text, timestamps) is what Feast's own ``online_write_batch`` stores for the same rows, and the reader
    returns what Feast's ``online_read`` decodes.
    """
    from fedfraud.feature_store.online import _ViewIO

    _, store, client = built
    io = client._io
    states = _touched_states(client, ["rows-ours-0", "rows-ours-1"], key=5, ts_us=1_767_225_600_000_321,
                             amount=9.75)
    rows = client._cardholder_rows(states)
    when = pd.Timestamp("2026-01-02 03:04:05.678901", tz="UTC").to_pydatetime()
    rows.append((store.get_feature_view("merchant_location"),
                 [((4, "rows-m-ours"), {"location_embedding": np.array([0.25, -1.5], dtype=np.float32),
                                        "merchant_bucket": 77}, when, when)]))
    io.write(rows)
    renamed = [(view, [(e.replace("ours", "feast") if isinstance(e, str) else (e[0], "rows-m-feast"), v, ts, made)
                       for e, v, ts, made in view_rows]) for view, view_rows in rows]
    _ViewIO.write(io, renamed)  # Feast's online_write_batch, value protos and all
    for (view, ours), (_, feast) in zip(rows, renamed, strict=True):
        table, _ = io._table(view)
        for a, b in zip(io._key_bytes([e for e, *_ in ours]), io._key_bytes([e for e, *_ in feast]), strict=True):
            query = f"SELECT feature_name, value, value_text, event_ts, created_ts FROM {table} WHERE entity_key = ? "\
                    "ORDER BY feature_name"
            written, stored = io._conn.execute(query, (a,)).fetchall(), io._conn.execute(query, (b,)).fetchall()
            assert written and written == stored
        features = [(view, [f.name for f in view.features])]
        entities = [e for e, *_ in ours]
        mine = io.read(features, entities)[0]
        theirs = _ViewIO.read(io, features, entities)[0]
        for m, t in zip(mine, theirs, strict=True):
            assert m is not None and m.keys() == t.keys()
            for name in m:
                np.testing.assert_array_equal(m[name], t[name])


@pytest.mark.parametrize("blob", [b"garbage bytes, not a state", b"truncated"])
def test_corrupt_blob_is_rebuilt_not_raised(built, blob: bytes, caplog: pytest.LogCaptureFixture) -> None:
    cfg, store, client = built
    holder = f"corrupt-{len(blob)}"
    good = EgoGraphState(cfg.egograph)
    good.update(key=1, merchant=2, lat=1.0, lon=2.0, ts_us=1_000_000, amount=3.0, mcc="home")
    damaged = blob if blob != b"truncated" else good.to_bytes()[:-7]
    frame = pd.DataFrame(
        {
            "cardholder": [holder],
            "event_timestamp": [pd.Timestamp("2026-01-02", tz="UTC")],
            "created": [pd.Timestamp("2026-01-02", tz="UTC")],
            "ego_state": [damaged],
            "q_t": [np.zeros(0, dtype=np.float32)],
            "state_version": [5],
        }
    )
    store.write_to_online_store("cardholder_ego_state", frame)  # through the real store, via the SDK
    with caplog.at_level(logging.WARNING, logger="fedfraud.feature_store.online"):
        (state,) = client.read_states([holder])
    assert state.found and state.rebuilt
    assert state.ego == EgoGraphState(cfg.egograph)
    assert any("corrupt_state" in r.getMessage() for r in caplog.records)


def _serving_anomaly_stage(cfg: FedfraudConfig, client, featurizer: PrivateFeaturizer, bank: int, tmp: Path):
    """Serving's own anomaly stage, built as :class:`fedfraud.serving.hotpath.HotPath` builds it, on this module's
    store: the registry's GNN (small, fresh weights: the states do not depend on them) and a SQLite scores ring."""
    import torch

    from fedfraud.serving.kvstore import SqliteKV
    from fedfraud.serving.anomaly_stage import AnomalyStage, load_anomaly_scorer
    from fedfraud.training.anomaly.config import AnomalyConfig
    from fedfraud.training.anomaly.model import AnomalyModel
    from fedfraud.training.anomaly.scorer import publish_anomaly_model
    from fedfraud.training.registry import ModelRegistry

    torch.manual_seed(0)
    acfg = AnomalyConfig(layers=2, hidden=16, disc_hidden=16)
    model = AnomalyModel(acfg, cfg.encoder, cfg.egograph.max_nodes)
    registry = ModelRegistry(tmp / "registry")
    publish_anomaly_model(registry, model.state_dict(), anomaly_cfg=acfg, encoder_cfg=cfg.encoder,
                          ego_cfg=cfg.egograph, config={}, metrics={}, privacy={}, card="skew test")
    return AnomalyStage(client, featurizer, SqliteKV(tmp / "scores.db"), load_anomaly_scorer(registry), bank,
                        cfg.features.location_cell_deg, cfg.egograph.dedupe_ring)


def test_streaming_matches_offline(built, dataset: Path, tmp_path: Path) -> None:
    """No training–serving skew: micro-batches through serving's anomaly stage (the path a replica runs on each
    Kafka micro-batch and each ``POST /score``) leave the states the offline computation builds."""
    cfg, store, client = built
    featurizer, offline = _offline(dataset, cfg, STREAMED_BANK)
    frame = read_bank(dataset, STREAMED_BANK)
    first = client.read_states(sorted(offline.states))
    assert not any(s.found for s in first)  # bank 1 was never materialized: streaming starts from empty
    stage = _serving_anomaly_stage(cfg, client, featurizer, STREAMED_BANK, tmp_path)
    for start in range(0, len(frame), 64):
        part = frame.iloc[start : start + 64]
        work, scored = stage.score(part, np.zeros(len(part), dtype=np.int64))
        stage.write(work)
        assert not scored.redelivered.any()
        if start == 128:  # at-least-once delivery: the same micro-batch again is a no-op (dedupe ring)
            work, again = stage.score(part, np.zeros(len(part), dtype=np.int64))
            stage.write(work)
            assert again.redelivered.all()
            np.testing.assert_array_equal(again.anomaly_score, scored.anomaly_score)  # the ring's scores

    online = {s.cardholder: s for s in client.read_states(sorted(offline.states))}
    for holder, want in offline.states.items():
        got = online[holder]
        assert got.ego.to_bytes() == want.ego.to_bytes(), holder
        assert got.activity == want.activity
        np.testing.assert_array_equal(got.time_embedding, want.time_embedding)
        assert got.epsilon == want.epsilon

    merchant = offline.merchant.to_pandas()
    latest = merchant.sort_values("created").groupby("merchant").tail(1).set_index("merchant")
    names = sorted(latest.index)
    rows = client.read_merchants(STREAMED_BANK, names)
    for name, row in zip(names, rows, strict=True):
        assert row is not None
        np.testing.assert_array_equal(row["location_embedding"], latest.loc[name, "location_embedding"])
        assert row["merchant_bucket"] == latest.loc[name, "merchant_bucket"]


def test_unknown_entities_read_as_none(built) -> None:
    _, _, client = built
    assert client.read_merchants(STREAMED_BANK, ["never-seen-merchant"]) == [None]
    (state,) = client.read_states(["never-seen-cardholder"])
    assert not state.found and state.activity.tx_count == 0 and state.time_embedding is None


def test_offline_table_has_state_on_last_row_only(built, dataset: Path) -> None:
    import pyarrow.parquet as pq

    _, store, _ = built
    table = pq.read_table(Path(store.repo_path) / "data" / CARDHOLDER_FILE).to_pandas()
    last = table.sort_values(["event_timestamp", "created"]).groupby("cardholder").tail(1)
    assert last["ego_state"].notna().all()
    assert table["ego_state"].notna().sum() == table["cardholder"].nunique()

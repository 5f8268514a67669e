import functools
import struct
import zlib

import numpy as np
import pandas as pd
import pytest
import torch
from torch_geometric.data import Batch, Data

from fedfraud.feature_store.config import EgoGraphConfig, EncoderConfig, PrivacyConfig
from fedfraud.feature_store.egograph import (
    CorruptStateError,
    EgoGraphState,
    _graph,
    active_cardholders,
    build_snapshot_pairs,
)
from fedfraud.feature_store.encoders import merchant_hash
from fedfraud.feature_store.privacy import PrivateFeaturizer
from fedfraud.feature_store.schema import frame_to_transactions
from fedfraud.feature_store.layout import split_of

ENC, PRIV = EncoderConfig(), PrivacyConfig()
FEAT = PrivateFeaturizer(ENC, PRIV, b"bank-test-secret")
T0 = 1_735_689_600 * 10**6  # 2025-01-01 UTC in µs
H = 3600 * 10**6
A, B, C, D = (int(m) for m in merchant_hash(["A", "B", "C", "D"]))
GRAPH_KEYS = ("x", "merchant", "edge_index", "edge_attr", "history")


def _apply(state, stream):
    """stream: (key, merchant, hours after T0)."""
    return [state.update(k, m, 40.0 + k * 0.01, -74.0, T0 + int(h * H), 10.0 + k, "grocery_pos") for k, m, h in stream]


def _edges(state):
    return list(zip(state.edge_src, state.edge_dst, strict=True))


def test_edges_only_within_window_and_self_loops():
    s = EgoGraphState(EgoGraphConfig())
    _apply(s, [(1, A, 0), (2, B, 1), (3, C, 4), (4, C, 4.5), (5, A, 5), (6, B, 7.01)])
    assert _edges(s) == [(A, B), (C, C), (C, A)]
    data = s.to_data(FEAT, 1.0)
    assert data.edge_index.tolist() == [[0, 2, 2], [1, 2, 0]]
    assert data.x.shape == (3, ENC.dim) and data.edge_attr.shape == (3, ENC.dim)
    assert data.x.dtype == torch.float32 and data.edge_index.dtype == torch.long
    assert data.merchant.tolist() == [m % ENC.merchant_buckets for m in (A, B, C)]
    assert s.n_transactions == 6 and s.node_visits == [2, 2, 2]


def test_late_event_updates_node_without_edge():
    s = EgoGraphState(EgoGraphConfig())
    _apply(s, [(1, A, 1), (2, B, 1.5), (3, C, 1.2)])
    assert _edges(s) == [(A, B)] and s.last_ts == T0 + int(1.5 * H) and s.num_nodes == 3


def test_node_eviction_lru_drops_edges():
    s = EgoGraphState(EgoGraphConfig(max_nodes=3))
    _apply(s, [(1, A, 0), (2, B, 0.5), (3, A, 1), (4, C, 1.5), (5, D, 2)])
    # B is least recently visited (0.5 h): evicted with edges A→B and B→A
    assert s.node_merchant == [A, C, D]
    assert _edges(s) == [(A, C), (C, D)]
    assert s.to_data(FEAT, 1.0).edge_index.tolist() == [[0, 1], [1, 2]]


def test_edge_bound_keeps_most_recent():
    s = EgoGraphState(EgoGraphConfig(max_edges=2))
    _apply(s, [(1, A, 0), (2, B, 0.1), (3, C, 0.2), (4, D, 0.3)])
    assert _edges(s) == [(B, C), (C, D)]


def test_horizon_forgets_stale_nodes_and_edges():
    s = EgoGraphState(EgoGraphConfig(horizon_days=1))
    _apply(s, [(1, A, 0), (2, B, 1), (3, C, 30), (4, C, 30.5)])
    assert s.node_merchant == [C] and _edges(s) == [(C, C)]


def test_redelivery_is_idempotent():
    s = EgoGraphState(EgoGraphConfig(dedupe_ring=2))
    assert _apply(s, [(1, A, 0), (2, B, 1)]) == [True, True]
    blob = s.to_bytes()
    assert _apply(s, [(2, B, 1), (1, A, 0)]) == [False, False]
    assert s.to_bytes() == blob
    assert _apply(s, [(3, C, 1.5), (4, C, 1.6), (1, A, 2)]) == [True, True, True]  # 1 fell out of the ring


def test_bytes_round_trip_and_size():
    cfg = EgoGraphConfig()
    s = EgoGraphState(cfg)
    rng = np.random.default_rng(0)
    merchants = merchant_hash([f"m{i}" for i in range(80)])
    for i in range(500):  # 80 merchants: evictions
        m = int(merchants[rng.integers(0, 80)])
        s.update(i, m, rng.uniform(30, 45), rng.uniform(-120, -70), T0 + i * H // 3, rng.uniform(1, 500), "travel")
    for i in range(500, 600):  # then only known merchants: the edge list fills up
        s.update(i, s.node_merchant[int(rng.integers(0, s.num_nodes))], 40.0, -74.0, T0 + i * H // 3, 12.5, "home")
    assert s.num_nodes == cfg.max_nodes and s.num_edges == cfg.max_edges
    blob = s.to_bytes()
    back = EgoGraphState.from_bytes(blob, cfg)
    assert back == s and back.to_bytes() == blob
    for key in GRAPH_KEYS:
        assert torch.equal(s.to_data(FEAT, 2.0)[key], back.to_data(FEAT, 2.0)[key])
    assert len(blob) == EgoGraphState.max_serialized_bytes(cfg) < 4096
    empty = EgoGraphState(cfg)
    assert EgoGraphState.from_bytes(empty.to_bytes(), cfg) == empty


def test_corrupt_or_truncated_blob_raises():
    cfg = EgoGraphConfig()
    s = EgoGraphState(cfg)
    _apply(s, [(1, A, 0), (2, B, 1)])
    blob = s.to_bytes()
    flipped = bytearray(blob)
    flipped[20] ^= 0xFF
    for bad in (b"", blob[:10], blob[:-1], bytes(flipped), blob + b"\0"):
        with pytest.raises(CorruptStateError):
            EgoGraphState.from_bytes(bad, cfg)

    def resealed(payload: bytes) -> bytes:
        return payload + struct.pack("<I", zlib.crc32(payload))

    with pytest.raises(CorruptStateError, match="magic"):
        EgoGraphState.from_bytes(resealed(b"XXXX" + blob[4:-4]), cfg)
    with pytest.raises(CorruptStateError, match="version"):
        EgoGraphState.from_bytes(resealed(blob[:4] + b"\x09" + blob[5:-4]), cfg)


def test_empty_state_gives_valid_zero_node_graph():
    data = EgoGraphState(EgoGraphConfig()).to_data(FEAT, 1.0)
    assert data.num_nodes == 0 and data.x.shape == (0, ENC.dim)
    assert data.edge_index.shape == (2, 0) and data.edge_attr.shape == (0, ENC.dim)
    data.validate(raise_on_error=True)


def _stream_frame():
    rows = []
    rng = np.random.default_rng(5)
    for c in range(3):
        t = T0 // 10**6
        for i in range(25):
            t += int(rng.choice([600, 3000, 9000, 40_000]))
            m = int(rng.integers(0, 6))
            rows.append(
                (
                    f"c{c}-t{i}",
                    f"card{c}",
                    f"merchant{c}-{m}",
                    t,
                    40 + m * 0.1 + rng.normal(0, 0.01),
                    -75.0 + m * 0.1,
                    i == 20,
                )
            )
    rows.append(("lonely-1", "card-inactive", "merchantX", T0 // 10**6, 40.0, -75.0, False))
    rows.append(("lonely-2", "card-inactive", "merchantX", T0 // 10**6 + 9 * 86_400 * 30, 40.0, -75.0, False))
    frame = pd.DataFrame(
        rows, columns=["transaction_id", "cardholder_id", "merchant_id", "ts", "lat", "lon", "is_fraud"]
    )
    frame["timestamp"] = pd.to_datetime(frame.pop("ts"), unit="s", utc=True).astype("datetime64[us, UTC]")
    frame["amount"] = np.round(np.random.default_rng(5).lognormal(3.0, 1.0, len(frame)), 2)
    frame["mcc"] = np.where(np.arange(len(frame)) % 3 == 0, "shopping_net", "5411")
    frame["geo_source"] = "exact"
    frame["is_fraud"] = frame["is_fraud"].astype("boolean")
    return frame.sample(frac=1.0, random_state=1).reset_index(drop=True)  # order must not matter


def test_active_cardholders_filter():
    assert set(active_cardholders(_stream_frame(), 3.0)) == {"card0", "card1", "card2"}


@pytest.mark.parametrize(
    "feat",
    [FEAT, PrivateFeaturizer(EncoderConfig(variant="multiscale"), PRIV, b"bank-test-secret")],
    ids=["thesis", "multiscale"],
)
def test_batch_equals_incremental_with_round_trips(feat):
    cfg = EgoGraphConfig(max_nodes=4, max_edges=6)
    frame = _stream_frame()
    pairs = build_snapshot_pairs(frame, feat, cfg, split_of=functools.partial(split_of, val_fraction=0.2))
    assert len(pairs) == 3 * 24  # first transaction of each cardholder has no G_{t-1}
    by_tx = {p.transaction_id: p for p in pairs}
    assert sum(bool(p.is_fraud) for p in pairs) == 3

    for holder, rows in frame.groupby("cardholder_id"):
        if holder == "card-inactive":
            continue
        rows = rows.sort_values(["timestamp", "transaction_id"])
        eps = float(feat.epsilon([holder])[0])
        blob = EgoGraphState(cfg).to_bytes()
        previous = None
        for tx in frame_to_transactions(rows):
            state = EgoGraphState.from_bytes(blob, cfg)  # serving: load, apply, store
            assert state.apply(tx, feat)
            blob = state.to_bytes()
            current = EgoGraphState.from_bytes(blob, cfg).to_data(feat, eps)
            if previous is not None:
                pair = by_tx[tx.transaction_id]
                assert pair.split in ("train", "val", "test") and pair.cardholder != holder
                # the newest event and the history before it: identical in the batch and the serving path
                assert np.array_equal(pair.event, state.last_event) and np.array_equal(pair.prior, state.prior)
                for key in GRAPH_KEYS:
                    assert torch.equal(pair.current[key], current[key]), key
                    assert torch.equal(pair.previous[key], previous[key]), key
            previous = current
            assert not state.apply(tx, feat)  # redelivery


    # consecutive pairs share G_t as the next G_{t-1} (same object, not a rebuild)
    ordered = [p for p in pairs if p.cardholder == pairs[0].cardholder]
    assert all(a.current is b.previous for a, b in zip(ordered, ordered[1:], strict=False))


def test_fast_graph_matches_keyword_constructor():
    x, ei = torch.rand(3, 8), torch.tensor([[0, 1], [1, 2]])
    ea, m = torch.rand(2, 8), torch.tensor([5, 6, 7])
    hist = torch.rand(1, 5)
    fast, slow = _graph(x, ei, ea, m, hist), Data(x=x, edge_index=ei, edge_attr=ea, merchant=m, history=hist)
    assert type(fast) is Data and fast.keys() == slow.keys() and fast.num_nodes == slow.num_nodes == 3
    assert all(fast[k] is slow[k] for k in GRAPH_KEYS)
    fast.validate(raise_on_error=True)
    empty = _graph(
        torch.zeros(0, 8), torch.zeros(2, 0, dtype=torch.long), torch.zeros(0, 8), torch.zeros(0).long(), hist
    )
    assert empty.num_nodes == 0
    batch = Batch.from_data_list([fast, slow])
    assert batch.num_nodes == 6 and batch.edge_index.shape == (2, 4)


def test_graph_carries_no_raw_values():
    frame = _stream_frame()
    pair = build_snapshot_pairs(frame, FEAT, EgoGraphConfig())[-1]
    assert set(pair.current.keys()) == {"x", "merchant", "edge_index", "edge_attr", "history"}
    raw = np.concatenate(
        [frame["lat"], frame["lon"], frame["timestamp"].astype("int64") // 10**6, frame["amount"]]
    )
    for key in ("x", "edge_attr", "history"):
        assert not np.isin(pair.current[key].numpy().astype(np.float64), raw).any()


@pytest.mark.parametrize("pooling", ["topk", "sag"])
def test_collate_graphs_matches_pyg_batch(pooling):
    """The scoring path's direct concatenation builds PyG's batch inputs and the same embeddings, a graph
    without edges among them (scoring never embeds a 0-node graph; PyG's collate cannot mix one with others)."""
    from fedfraud.training.anomaly.config import AnomalyConfig
    from fedfraud.training.anomaly.model import AnomalyModel, collate_graphs

    graphs = []
    for stream in ([(1, A, 0)], [(1, A, 0), (2, B, 1), (3, A, 2), (4, C, 3)], [(5, D, 0), (6, B, 5)]):
        state = EgoGraphState(EgoGraphConfig())
        _apply(state, stream)
        graphs.append(state.to_data(FEAT, 1.0))
    ours, pyg = collate_graphs(graphs), Batch.from_data_list(graphs)
    for key in (*GRAPH_KEYS, "batch"):
        assert torch.equal(getattr(ours, key), getattr(pyg, key)), key
    assert ours.num_graphs == pyg.num_graphs == 3
    torch.manual_seed(0)
    model = AnomalyModel(AnomalyConfig(pooling=pooling), ENC, EgoGraphConfig().max_nodes).eval()
    with torch.no_grad():
        assert torch.allclose(model.embed(ours).q, model.embed(pyg).q, atol=1e-6)


@pytest.mark.parametrize("mechanism", ["calibrated", "thesis"])
def test_collate_views_builds_what_collate_graphs_builds(mechanism):
    """Serving's batched build (views, one L'/T' lookup for all nodes and edges) gives the model input that one
    ``to_data`` per graph and ``collate_graphs`` give, value for value, with a different budget per graph, through
    the featurizer and through serving's row cache (seeded with some of the rows, so hits and misses mix)."""
    from fedfraud.serving.anomaly_cache import CachedFeatures
    from fedfraud.training.anomaly.model import collate_graphs, collate_views

    feat = PrivateFeaturizer(ENC, PrivacyConfig(mechanism=mechanism), b"bank-test-secret")
    states, eps = [], (1.0, 2.5, 0.3)
    for stream in ([(1, A, 0)], [(1, A, 0), (2, B, 1), (3, A, 2), (4, C, 3)], [(5, D, 0), (6, B, 5), (7, B, 5.5)]):
        state = EgoGraphState(EgoGraphConfig())
        _apply(state, stream)
        states.append(state)
    want = collate_graphs([s.to_data(feat, e) for s, e in zip(states, eps, strict=True)])
    cached = CachedFeatures(feat)
    cached._loc.put([(states[1].node_key[0], eps[1])], feat.location(  # one row already cached, the rest computed
        np.array(states[1].node_lat[:1]), np.array(states[1].node_lon[:1]), np.array(states[1].node_key[:1],
                                                                                     dtype=np.uint64), eps[1]))
    for source in (feat, cached):
        got = collate_views([s.view(e) for s, e in zip(states, eps, strict=True)], source, want.history)
        for key in (*GRAPH_KEYS, "batch"):
            assert torch.equal(getattr(got, key), getattr(want, key)), (source, key)
        assert got.num_graphs == want.num_graphs == 3

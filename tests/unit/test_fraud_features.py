import math

import numpy as np
import pandas as pd
import pytest

from fedfraud.feature_store.config import EncoderConfig, PrivacyConfig
from fedfraud.feature_store.privacy import PrivateFeaturizer
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.training.data.synthetic import generate_frame
from fedfraud.training.fraud.config import FraudConfig
from fedfraud.training.fraud.dataset import fraud_split
from fedfraud.training.fraud.features import (
    ANOMALY_FEATURE,
    PREVIOUS_FEATURES,
    TRANSITION_FEATURE,
    CategoryTransitions,
    CorruptFraudStateError,
    FraudFeatures,
    FraudFeatureState,
    FraudInput,
    build_features,
    feature_names,
    fit_transitions,
    fraud_inputs,
    mcc_code,
    with_transitions,
)

CFG = FraudConfig()
ENC, PRIV = EncoderConfig(), PrivacyConfig()
NAMES = feature_names(CFG)


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    f, _ = generate_frame(GeneratorConfig(banks=1, cardholders=12, days=12, seed=3, fraud_rate=0.02))
    return f.drop(columns=["bank", "scenario", "holder"]).reset_index(drop=True)


def _tx(ts_s, amount, merchant, loc, mcc="grocery_pos", anomaly=math.nan):
    vec = np.asarray(loc, dtype=np.float32)
    return FraudInput(int(ts_s * 1_000_000), amount, mcc, merchant, vec, vec, anomaly)


def test_names_and_hand_computed_rows():
    assert NAMES[-1] == ANOMALY_FEATURE and "tx_count_1h" in NAMES and "amount_7d" in NAMES
    col = {n: i for i, n in enumerate(NAMES)}
    st = FraudFeatureState(CFG, 4)
    a = st.update(_tx(0, 10.0, 1, [1, 0, 0, 0]))
    b = st.update(_tx(1800, 20.0, 2, [1, 0, 0, 0]))
    c = st.update(_tx(7200, 40.0, 1, [0, 1, 0, 0], anomaly=0.25))
    assert a[col["n_prior"]] == 0 and math.isnan(a[col["log_gap_s"]]) and math.isnan(a[col["loc_dist_mean"]])
    assert a[col["merchant_new"]] == 1 and b[col["merchant_new"]] == 1 and c[col["merchant_new"]] == 0
    assert c[col["merchant_visits"]] == 1 and c[col["n_prior"]] == 2
    assert b[col["log_gap_s"]] == pytest.approx(math.log1p(1800))
    # 1 h window at t=7200 s holds only itself; 24 h holds all three
    assert (c[col["tx_count_1h"]], c[col["amount_1h"]]) == (1, 40)
    assert (c[col["tx_count_24h"]], c[col["amount_24h"]]) == (3, 70)
    assert (b[col["tx_count_1h"]], b[col["amount_1h"]]) == (2, 30)
    # same location -> distance 0; orthogonal to the mean [1,0,0,0] -> 1
    assert b[col["loc_dist_mean"]] == pytest.approx(0.0) and c[col["loc_dist_mean"]] == pytest.approx(1.0)
    assert c[col["amount_to_mean"]] == pytest.approx(40 / (15 + 1))
    logs = np.log1p([10.0, 20.0])
    assert c[col["amount_log_z"]] == pytest.approx((math.log1p(40) - logs.mean()) / max(logs.std(), 0.1), rel=1e-5)
    assert c[col["hour_utc"]] == 2 and c[col[ANOMALY_FEATURE]] == 0.25


def test_state_is_bounded_and_round_trips():
    cfg = FraudConfig(max_history=8, max_merchants=8)
    st = FraudFeatureState(cfg, 4)
    for i in range(50):
        st.update(_tx(i * 60, 1.0 + i, i, [1, i % 3, 0, 0]))
    assert len(st.vel_ts) == 8 and len(st.merchants) == 8
    blob = st.to_bytes()
    again = FraudFeatureState.from_bytes(blob, cfg, dim=4)
    assert again == st
    nxt = _tx(3001, 5.0, 3, [0, 0, 1, 0])
    assert np.array_equal(again.update(nxt), st.update(nxt), equal_nan=True)
    with pytest.raises(CorruptFraudStateError, match="checksum"):
        FraudFeatureState.from_bytes(blob[:-1] + bytes([blob[-1] ^ 1]), cfg)
    with pytest.raises(CorruptFraudStateError, match="dim"):
        FraudFeatureState.from_bytes(blob, cfg, dim=8)
    with pytest.raises(CorruptFraudStateError, match="truncated"):
        FraudFeatureState.from_bytes(blob[:5], cfg)


def test_offline_equals_online(frame):
    """Batch features == one transaction at a time through a serialised state store (serving's path), the
    previous-transaction columns included, with the table fitted on the training rows.
    """
    featurizer = PrivateFeaturizer.for_bank(ENC, PRIV, 0)
    rng = np.random.default_rng(0)
    anomaly = np.where(rng.random(len(frame)) < 0.8, rng.random(len(frame)), np.nan)
    private_all = featurizer.transform(frame)
    split = fraud_split(frame["cardholder_id"], 0.3)
    table = fit_transitions(frame, private_all.cardholder, split == "train")
    offline = build_features(frame, private_all, CFG, anomaly, split, transitions=table)
    assert offline.transitions is table and set(PREVIOUS_FEATURES) < set(offline.names)
    surprise = offline.X[:, NAMES.index(TRANSITION_FEATURE)]
    assert np.isfinite(surprise).sum() == len(frame) - frame["cardholder_id"].nunique()  # all but first rows

    store: dict[str, bytes] = {}  # the online store keeps bytes, never live objects
    online = np.empty_like(offline.X)
    arrival = np.lexsort((frame["transaction_id"].to_numpy(), frame["timestamp"].to_numpy()))
    for i in arrival:
        one = frame.iloc[[i]]
        private = featurizer.transform(one)  # per-message featurization, as serving does
        (tx,) = fraud_inputs(one, private, anomaly[[i]])
        key = private.cardholder[0]
        blob = store.get(key)
        state = FraudFeatureState.from_bytes(blob, CFG, ENC.dim) if blob else FraudFeatureState(CFG, ENC.dim)
        online[i] = state.update(tx, table)
        store[key] = state.to_bytes()
    assert np.array_equal(offline.X, online, equal_nan=True)
    assert offline.has_labels and offline.label.sum() == frame["is_fraud"].sum()


def test_batch_continues_from_states(frame):
    """Warming serving from history then continuing gives the same rows as one pass."""
    featurizer = PrivateFeaturizer.for_bank(ENC, PRIV, 0)
    whole = build_features(frame, featurizer.transform(frame), CFG)
    cut = frame["timestamp"].quantile(0.5)
    first, second = frame[frame["timestamp"] <= cut], frame[frame["timestamp"] > cut]
    states: dict = {}
    build_features(first, featurizer.transform(first), CFG, states=states)
    rest = build_features(second, featurizer.transform(second), CFG, states=states)
    assert np.array_equal(whole.X[(frame["timestamp"] > cut).to_numpy()], rest.X, equal_nan=True)


def test_unlabelled_rows_and_splits(frame, tmp_path):
    featurizer = PrivateFeaturizer.for_bank(ENC, PRIV, 0)
    unlabelled = frame.drop(columns=["is_fraud"])
    split = fraud_split(unlabelled["cardholder_id"], 0.3)
    private = featurizer.transform(unlabelled)
    feats = build_features(unlabelled, private, CFG, split=split,
                           transitions=fit_transitions(unlabelled, private.cardholder, split == "train"))
    assert not feats.has_labels and np.isnan(feats.label).all()
    # a cardholder is in exactly one split
    per_holder = pd.Series(split).groupby(unlabelled["cardholder_id"].to_numpy()).nunique()
    assert (per_holder == 1).all() and set(split) <= {"train", "valid", "test"}
    feats.save(str(tmp_path / "f.npz"))
    back = FraudFeatures.load(str(tmp_path / "f.npz"))
    assert np.array_equal(back.X, feats.X, equal_nan=True) and back.names == feats.names
    assert (back.split == feats.split).all() and (back.cardholder == feats.cardholder).all()
    assert feats.transitions is not None and back.transitions == feats.transitions


def test_previous_transaction_features_by_hand():
    table = CategoryTransitions({(int(mcc_code("grocery_pos")), int(mcc_code("grocery_pos"))): 8,
                                 (int(mcc_code("grocery_pos")), int(mcc_code("shopping_net"))): 1})
    col = {n: i for i, n in enumerate(NAMES)}
    st = FraudFeatureState(CFG, 4)
    a = st.update(_tx(0, 10.0, 1, [1, 0, 0, 0]), table)
    b = st.update(_tx(60, 21.0, 1, [1, 0, 0, 0]), table)
    c = st.update(_tx(90, 5.0, 2, [1, 0, 0, 0], mcc="shopping_net"), table)
    d = st.update(_tx(95, 5.0, 2, [1, 0, 0, 0], mcc="travel"), table)
    assert all(math.isnan(a[col[n]]) for n in PREVIOUS_FEATURES)
    assert b[col["prev_mcc_code"]] == mcc_code("grocery_pos") and c[col["prev_mcc_code"]] == mcc_code("grocery_pos")
    assert b[col["amount_to_prev"]] == pytest.approx(21 / 11) and c[col["amount_to_prev"]] == pytest.approx(5 / 22)
    # 2 categories seen + 1 unseen, add-one smoothing: P(same | grocery) = 9/12, P(shopping | grocery) = 2/12
    assert b[col[TRANSITION_FEATURE]] == pytest.approx(-math.log(9 / 12))
    assert c[col[TRANSITION_FEATURE]] == pytest.approx(-math.log(2 / 12))
    assert d[col[TRANSITION_FEATURE]] == pytest.approx(-math.log(1 / 3))  # never seen after shopping_net: 1/(0+3)
    assert math.isnan(FraudFeatureState(CFG, 4).update(_tx(0, 1.0, 1, [1, 0, 0, 0]))[col[TRANSITION_FEATURE]])
    assert CategoryTransitions.from_json(table.to_json()) == table
    off = FraudConfig(previous_transaction_features=False)
    assert not set(PREVIOUS_FEATURES) & set(feature_names(off))
    assert len(FraudFeatureState(off, 4).update(_tx(0, 1.0, 1, [1, 0, 0, 0]))) == len(feature_names(off))


def test_previous_transaction_features_are_causal(frame):
    """A row's previous-transaction features use only its cardholder's earlier rows: cutting or rewriting the
    future changes no earlier row, and the transition table only counts training rows.
    """
    featurizer = PrivateFeaturizer.for_bank(ENC, PRIV, 0)
    private = featurizer.transform(frame)
    split = fraud_split(frame["cardholder_id"], 0.3)
    table = fit_transitions(frame, private.cardholder, split == "train")
    cols = [NAMES.index(n) for n in PREVIOUS_FEATURES]
    whole = build_features(frame, private, CFG, None, split, transitions=table).X[:, cols]
    cut = frame["timestamp"].quantile(0.6)
    past = (frame["timestamp"] <= cut).to_numpy()
    future = frame.copy()
    future.loc[~past, "mcc"] = "travel"
    future.loc[~past, "amount"] = 9999.0
    for changed, rows in ((frame[past], slice(None)), (future, past)):
        again = build_features(changed, featurizer.transform(changed), CFG, None, transitions=table).X[:, cols]
        assert np.array_equal(whole[past], again[rows], equal_nan=True)
    # the rows right after the cut do see the rewrite: the check can fail
    after = build_features(future, featurizer.transform(future), CFG, None, transitions=table).X[:, cols]
    assert not np.array_equal(whole[~past], after[~past], equal_nan=True)
    # held-out cardholders' categories never enter the table
    held_out = frame.copy()
    held_out.loc[split != "train", "mcc"] = "travel"
    assert fit_transitions(held_out, private.cardholder, split == "train") == table
    assert fit_transitions(frame, private.cardholder, np.ones(len(frame), dtype=bool)) != table


def test_a_challenger_table_recomputes_only_the_surprise(frame):
    featurizer = PrivateFeaturizer.for_bank(ENC, PRIV, 0)
    private = featurizer.transform(frame)
    split = fraud_split(frame["cardholder_id"], 0.3)
    mine = fit_transitions(frame, private.cardholder, split == "train")
    theirs = fit_transitions(frame, private.cardholder, split != "train")
    X_mine = build_features(frame, private, CFG, None, transitions=mine).X
    X_theirs = build_features(frame, private, CFG, None, transitions=theirs).X
    assert not np.array_equal(X_mine, X_theirs, equal_nan=True)
    assert np.array_equal(with_transitions(X_mine, NAMES, theirs), X_theirs, equal_nan=True)


def test_a_version_1_state_still_loads(frame):
    """A state serving wrote before the previous-transaction fields loads, those fields unknown (NaN)."""
    import struct
    import zlib

    st = FraudFeatureState(CFG, 4)
    for i in range(5):
        st.update(_tx(i * 60, 3.0 + i, i, [1, i, 0, 0]))
    blob = st.to_bytes()
    v1_header = struct.Struct("<4sBHIqdddHH")
    payload = blob[:-4]
    head = bytearray(payload[: v1_header.size])
    head[4] = 1  # version byte
    v1 = bytes(head) + payload[v1_header.size + 16:]
    v1 += struct.pack("<I", zlib.crc32(v1))
    old = FraudFeatureState.from_bytes(v1, CFG, 4)
    assert old.count == st.count and old.vel_ts == st.vel_ts and old.merchants == st.merchants
    assert math.isnan(old.prev_mcc) and math.isnan(old.prev_amount)
    assert not math.isnan(st.prev_mcc) and FraudFeatureState.from_bytes(blob, CFG, 4) == st
    row = old.update(_tx(400, 1.0, 1, [1, 0, 0, 0]))
    assert all(math.isnan(row[NAMES.index(n)]) for n in PREVIOUS_FEATURES) and row[NAMES.index("n_prior")] == 5

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
    CorruptFraudStateError,
    FraudFeatures,
    FraudFeatureState,
    FraudInput,
    build_features,
    feature_names,
    fraud_inputs,
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
    """Batch features == one transaction at a time through a serialised state store (serving's path)."""
    featurizer = PrivateFeaturizer.for_bank(ENC, PRIV, 0)
    rng = np.random.default_rng(0)
    anomaly = np.where(rng.random(len(frame)) < 0.8, rng.random(len(frame)), np.nan)
    offline = build_features(frame, featurizer.transform(frame), CFG, anomaly)

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
        online[i] = state.update(tx)
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
    feats = build_features(unlabelled, featurizer.transform(unlabelled), CFG, split=split)
    assert not feats.has_labels and np.isnan(feats.label).all()
    # a cardholder is in exactly one split
    per_holder = pd.Series(split).groupby(unlabelled["cardholder_id"].to_numpy()).nunique()
    assert (per_holder == 1).all() and set(split) <= {"train", "valid", "test"}
    feats.save(str(tmp_path / "f.npz"))
    back = FraudFeatures.load(str(tmp_path / "f.npz"))
    assert np.array_equal(back.X, feats.X, equal_nan=True) and back.names == feats.names
    assert (back.split == feats.split).all() and (back.cardholder == feats.cardholder).all()

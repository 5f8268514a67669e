import math
from dataclasses import fields

import numpy as np
import pandas as pd
import pytest

from fedfraud.feature_store.config import EncoderConfig, PrivacyConfig
from fedfraud.feature_store.encoders import encode_location, encode_time
from fedfraud.feature_store.privacy import (
    SECRET_ENV,
    PrivateFeatures,
    PrivateFeaturizer,
    bank_secret,
    cardholder_epsilon,
    gaussian_noise,
    mu_gdp,
    noise_keys,
    private_shuffle,
    pseudonymize,
    shuffle_permutation,
    shuffle_seed,
)

ENC, PRIV = EncoderConfig(), PrivacyConfig()
SECRET = b"bank-0-secret"


def _frame(n=50, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "transaction_id": [f"tx{i}" for i in range(n)],
            "cardholder_id": [f"4000123412341{i % 7:03d}" for i in range(n)],
            "merchant_id": [f"fraud_Shop {i % 11}" for i in range(n)],
            "timestamp": pd.to_datetime(1_735_689_600 + rng.integers(0, 10**7, n), unit="s", utc=True).astype(
                "datetime64[us, UTC]"
            ),
            "amount": rng.uniform(1, 100, n).round(2),
            "lat": rng.uniform(25, 48, n),
            "lon": rng.uniform(-124, -67, n),
            "mcc": "5411",
            "is_fraud": False,
            "geo_source": "exact",
        }
    )


@pytest.mark.parametrize("enc", [ENC, EncoderConfig(variant="multiscale")], ids=["thesis", "multiscale"])
def test_offline_and_online_features_bit_identical(enc):
    feat = PrivateFeaturizer(enc, PRIV, SECRET)
    frame = _frame()
    offline = feat.transform(frame)
    i = 17
    row = frame.iloc[i]
    key = feat.noise_keys([row.transaction_id])
    eps = feat.epsilon([row.cardholder_id])
    online_loc = feat.location(np.array([row.lat]), np.array([row.lon]), key, eps)
    online_time = feat.time(frame["timestamp"].iloc[i : i + 1], key, eps)
    assert np.array_equal(offline.location[i : i + 1], online_loc)
    assert np.array_equal(offline.time[i : i + 1], online_time)
    # a second featurizer (e.g. another process) with the same secret agrees too
    again = PrivateFeaturizer(enc, PRIV, SECRET).transform(frame.iloc[::-1].reset_index(drop=True))
    assert np.array_equal(again.location[::-1], offline.location)
    assert np.array_equal(again.time[::-1], offline.time)
    # POSIX seconds (serving) and the tz-aware column (offline) give the same T'
    secs = frame["timestamp"].astype("int64").to_numpy() // 10**6
    assert np.array_equal(feat.time(secs, offline.keys, offline.epsilon), offline.time)


def test_different_transaction_or_secret_gives_different_noise():
    keys = noise_keys(["a", "b"], SECRET)
    other = noise_keys(["a"], b"another bank")
    assert keys[0] != keys[1] and keys[0] != other[0]
    z = gaussian_noise(np.concatenate([keys, other]), 1, 128)
    assert not np.allclose(z[0], z[1]) and not np.allclose(z[0], z[2])
    # channels are independent
    assert not np.allclose(gaussian_noise(keys[:1], 1, 128), gaussian_noise(keys[:1], 2, 128))


def test_gaussian_noise_is_standard_normal():
    z = gaussian_noise(np.arange(2000, dtype=np.uint64), 1, 128)
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1.0) < 0.01
    assert abs(np.corrcoef(z[:, 0], z[:, 64])[0, 1]) < 0.06  # Box–Muller pair is uncorrelated


def test_more_epsilon_less_noise():
    v = encode_location(np.full(2000, 40.0), np.full(2000, -74.0), ENC)
    keys = np.arange(2000, dtype=np.uint64)
    perm = shuffle_permutation(shuffle_seed(PRIV), ENC.dim)
    clean = v[:, perm]
    err = []
    for eps in (0.01, 0.1, 1.0, 10.0):
        noisy = private_shuffle(v, np.full(2000, eps), PRIV.delta, keys, perm)
        err.append(float(np.abs(noisy - clean).mean()))
    assert err == sorted(err, reverse=True) and err[-1] < err[0] / 10
    # variance reading: std = sqrt(delta/eps) before clipping, measured on an interior coordinate
    mid = np.zeros((4000, ENC.dim))
    noisy = private_shuffle(mid, np.full(4000, 0.04), 1e-4, np.arange(4000, dtype=np.uint64), perm)
    assert abs(noisy.std() - math.sqrt(1e-4 / 0.04)) < 0.002


def test_private_shuffle_range_and_permutation():
    perm = shuffle_permutation(shuffle_seed(PRIV), 16)
    assert sorted(perm.tolist()) == list(range(16)) and not np.array_equal(perm, np.arange(16))
    assert np.array_equal(perm, shuffle_permutation(shuffle_seed(PRIV), 16))
    v = np.linspace(-1, 1, 16)[None, :].repeat(3, axis=0)
    out = private_shuffle(v, np.array([0.01, 0.01, 0.01]), 0.5, np.arange(3, dtype=np.uint64), perm)
    assert out.dtype == np.float32 and np.all(np.abs(out) <= 1.0)
    zero_noise = private_shuffle(v, np.ones(3), 0.0, np.arange(3, dtype=np.uint64), perm)
    assert np.array_equal(zero_noise, v[:, perm].astype(np.float32))
    with pytest.raises(ValueError):
        private_shuffle(v, np.zeros(3), 0.1, np.arange(3, dtype=np.uint64), perm)


def test_cardholder_epsilon_deterministic_in_range():
    ids = [str(i) for i in range(5000)]
    eps = cardholder_epsilon(ids, SECRET, PRIV)
    assert np.array_equal(eps, cardholder_epsilon(ids, SECRET, PRIV))
    assert eps.min() >= PRIV.epsilon_min and eps.max() <= PRIV.epsilon_max
    assert abs(eps.mean() - (PRIV.epsilon_min + PRIV.epsilon_max) / 2) < 0.2


def test_bank_secret_env_and_simulation(monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    assert bank_secret(PRIV, 0) != bank_secret(PRIV, 1)
    assert bank_secret(PRIV, 0) == bank_secret(PRIV, 0)
    simulated = bank_secret(PRIV, 0)
    monkeypatch.setenv(SECRET_ENV, "production secret")
    production = bank_secret(PRIV, 0)
    assert production == bank_secret(PRIV, 3) != simulated  # one bank per process: the id is not used
    assert len(production) == 32


def test_mu_gdp_hand_computed():
    # eps = 0 for all: q = 1/2 each; n = 3 → sum - max = 1 → mu = sqrt(2)
    assert mu_gdp([0.0, 0.0, 0.0], 0.0) == pytest.approx(math.sqrt(2))
    # eps = ln 3: q = 1/4; n = 5 → 1 → sqrt(2)
    assert mu_gdp(np.full(5, math.log(3)), 0.0) == pytest.approx(math.sqrt(2))
    # delta 0.5, eps 0: q = 1/4 each; n = 3 → 0.5 → mu = 2
    assert mu_gdp([0.0, 0.0, 0.0], 0.5) == pytest.approx(2.0)
    # mixed: eps (0, ln 3, ln 3), delta (0, 0, 0.2) → q = (0.5, 0.25, 0.2) → 0.45
    assert mu_gdp([0.0, math.log(3), math.log(3)], np.array([0.0, 0.0, 0.2])) == pytest.approx(math.sqrt(2 / 0.45))
    # more reports → more amplification → smaller mu; bigger eps → bigger mu
    assert mu_gdp(np.ones(128), 1e-4) < mu_gdp(np.ones(16), 1e-4) < mu_gdp(np.full(16, 3.0), 1e-4)
    assert mu_gdp([1.0], 1e-4) == math.inf
    assert mu_gdp(np.full(4, 1e6), 0.0) == math.inf  # no overflow, q underflows to 0
    with pytest.raises(ValueError):
        mu_gdp([], 0.0)


def test_private_features_checks_shapes():
    feats = PrivateFeaturizer(ENC, PRIV, SECRET).transform(_frame(5))
    with pytest.raises(ValueError):
        PrivateFeatures(**{**feats.__dict__, "location": feats.location[:3]})
    with pytest.raises(ValueError):
        PrivateFeatures(**{**feats.__dict__, "merchant": feats.merchant.astype(np.int32)})
    assert len(feats) == 5


def test_no_raw_data_in_outputs():
    frame = _frame(40)
    feat = PrivateFeaturizer(ENC, PRIV, SECRET)
    out = feat.transform(frame)
    names = {f.name for f in fields(out)}
    assert names.isdisjoint({"lat", "lon", "timestamp", "cardholder_id", "transaction_id", "merchant_id"})
    raw_numbers = np.concatenate(
        [
            frame["lat"].to_numpy(),
            frame["lon"].to_numpy(),
            frame["timestamp"].astype("int64").to_numpy().astype(np.float64),
            (frame["timestamp"].astype("int64").to_numpy() // 10**6).astype(np.float64),
        ]
    )
    for name in names - {"cardholder"}:
        values = np.asarray(getattr(out, name)).astype(np.float64).ravel()
        assert not np.isin(values, raw_numbers).any(), name
    raw_ids = set(frame["cardholder_id"]) | set(frame["transaction_id"])
    for pseudo in out.cardholder:
        assert not any(raw in pseudo for raw in raw_ids)
    assert set(out.cardholder) == set(pseudonymize(frame["cardholder_id"].unique(), SECRET))
    # noised outputs differ from the clean encodings (even after un-shuffling)
    inv = np.argsort(feat.permutation)
    clean_loc = encode_location(frame["lat"], frame["lon"], ENC)
    clean_time = encode_time(frame["timestamp"].astype("int64").to_numpy() // 10**6, ENC)
    assert not np.array_equal(out.location[:, inv], clean_loc)
    assert not np.array_equal(out.time[:, inv], clean_time)
    assert "secret" not in repr(feat) and SECRET.decode() not in repr(feat)

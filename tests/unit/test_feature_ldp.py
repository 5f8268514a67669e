"""The calibrated feature mechanism: planar Laplace on coordinates, randomized response on the hour."""

import math

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError
from scipy import stats

from fedfraud.feature_store.config import EncoderConfig, PrivacyConfig
from fedfraud.feature_store.encoders import encode_location, encode_time
from fedfraud.feature_store.privacy import (
    KM_PER_DEGREE,
    PrivateFeaturizer,
    feature_ldp_card,
    noise_keys,
    planar_laplace,
    randomized_hour,
)

KEYS = noise_keys([f"tx{i}" for i in range(20_000)], b"bank-secret")
CALIBRATED = PrivacyConfig(mechanism="calibrated", geo_epsilon_per_km=0.5, hour_epsilon=1.5)


def test_planar_laplace_radius_is_gamma_two_and_bearing_uniform():
    eps = 0.5
    lat, lon = np.full(len(KEYS), 40.0), np.full(len(KEYS), -100.0)
    out_lat, out_lon = planar_laplace(lat, lon, KEYS, eps)
    dy = (out_lat - lat) * KM_PER_DEGREE
    dx = (out_lon - lon) * KM_PER_DEGREE * math.cos(math.radians(40.0))
    radius = np.hypot(dx, dy)
    # density ∝ e^(−ε r) in the plane ⇔ radius ~ Gamma(2, 1/ε), bearing ~ U(0, 2π)
    assert stats.kstest(radius, stats.gamma(a=2, scale=1 / eps).cdf).pvalue > 1e-3
    assert radius.mean() == pytest.approx(2 / eps, rel=0.03)
    assert stats.kstest((np.arctan2(dy, dx) + np.pi) / (2 * np.pi), "uniform").pvalue > 1e-3
    again = planar_laplace(lat, lon, KEYS, eps)  # the same transaction always gets the same noise
    assert np.array_equal(again[0], out_lat) and np.array_equal(again[1], out_lon)


def test_planar_laplace_is_eps_d_indistinguishable_on_a_grid():
    """Empirical ratio of output probabilities for two inputs d km apart stays within e^(ε·d) (plus sampling error)."""
    eps, d = 0.2, 5.0
    a_lat, a_lon = planar_laplace(np.full(len(KEYS), 40.0), np.full(len(KEYS), -100.0), KEYS, eps)
    shift = d / KM_PER_DEGREE
    b_lat, b_lon = planar_laplace(np.full(len(KEYS), 40.0 + shift), np.full(len(KEYS), -100.0), KEYS[::-1], eps)
    bins = [np.linspace(39.7, 40.4, 8), np.linspace(-100.4, -99.6, 8)]
    pa, _, _ = np.histogram2d(a_lat, a_lon, bins=bins)
    pb, _, _ = np.histogram2d(b_lat, b_lon, bins=bins)
    full = (pa > 200) & (pb > 200)
    assert full.sum() > 10
    ratio = np.maximum(pa[full] / pb[full], pb[full] / pa[full])
    assert ratio.max() < math.exp(eps * d) * 1.3


def test_randomized_response_keeps_the_hour_with_the_stated_probability():
    eps = 1.5
    hours = np.arange(len(KEYS)) % 24
    out = randomized_hour(hours, KEYS, eps)
    keep = math.exp(eps) / (math.exp(eps) + 23)
    assert (out == hours).mean() == pytest.approx(keep, abs=0.015)
    moved = out[out != hours]
    counts = np.bincount((moved - hours[out != hours]) % 24, minlength=24)
    assert counts[0] == 0 and stats.chisquare(counts[1:]).pvalue > 1e-3  # the other 23 hours equally likely
    # the likelihood ratio of any output between two true hours is e^ε at most
    assert keep / ((1 - keep) / 23) == pytest.approx(math.exp(eps))
    with pytest.raises(ValueError, match="0..23"):
        randomized_hour(np.array([24]), KEYS[:1], eps)


def test_calibrated_featurizer_noises_inputs_before_encoding():
    enc = EncoderConfig()
    f = PrivateFeaturizer.for_bank(enc, CALIBRATED, 0)
    n = 200
    lat, lon = np.linspace(30, 45, n), np.linspace(-120, -75, n)
    keys = f.noise_keys([f"t{i}" for i in range(n)])
    loc = f.location(lat, lon, keys, 1.0)
    assert loc.dtype == np.float32 and loc.shape == (n, enc.dim)
    assert np.array_equal(loc, encode_location(*planar_laplace(lat, lon, keys, 0.5), enc))
    assert not np.allclose(loc, encode_location(lat, lon, enc))
    # one row alone gives the same bits as in the batch (offline training == online serving)
    assert np.array_equal(f.location(lat[7:8], lon[7:8], keys[7:8], 1.0), loc[7:8])
    ts = pd.Timestamp("2026-03-14 15:42:07", tz="UTC").value // 10**9
    same_hour_other_day = ts + 3 * 86_400 + 600
    t1 = f.time(np.array([ts]), keys[:1], 1.0)
    t2 = f.time(np.array([same_hour_other_day]), keys[:1], 1.0)
    assert np.array_equal(t1, t2)  # T' carries only the (randomized) hour
    hour = randomized_hour(np.array([15]), keys[:1], 1.5)[0]
    assert np.array_equal(t1, encode_time(np.array([hour * 3600]), enc))


def test_calibrated_is_the_default_and_cards_say_which():
    assert PrivacyConfig().mechanism == "calibrated"  # the thesis shuffle hides nothing from an inversion
    thesis, cal = feature_ldp_card(PrivacyConfig(mechanism="thesis")), feature_ldp_card(CALIBRATED)
    assert thesis["formal_guarantee"].startswith("none")
    assert cal["epsilon_geo_per_km_per_report"] == 0.5 and cal["epsilon_hour_per_report"] == 1.5
    assert "n x epsilon_hour" in cal["composition"]
    with pytest.raises(ValidationError, match="thesis"):
        PrivacyConfig(mechanism="gaussian")


def test_a_model_is_scored_only_with_the_feature_mechanism_it_was_trained_on():
    from fedfraud.core.errors import UserError
    from fedfraud.feature_store.privacy import check_feature_mechanism

    thesis_card = {"feature_ldp": feature_ldp_card(PrivacyConfig(mechanism="thesis"))}
    check_feature_mechanism("anomaly:v1", thesis_card, PrivacyConfig(mechanism="thesis"))
    with pytest.raises(UserError, match="trained on `thesis` features but privacy.mechanism is `calibrated`"):
        check_feature_mechanism("anomaly:v1", thesis_card, PrivacyConfig())
    check_feature_mechanism("anomaly:v0", {}, PrivacyConfig())  # a card from before the field: a warning only

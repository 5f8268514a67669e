"""`fedfraud bench attacks` section 4: the nearest-neighbour decode of (noised) embeddings, its bootstrap, and the
section's markdown and switches."""

import numpy as np
import pandas as pd
import pytest

from fedfraud.training.bootstrap import bootstrap_statistics
from fedfraud.bench.inversion import (
    GRID_DEG, decode_locations_grid, decode_times, inversion_bound, nearest,
)
from fedfraud.feature_store.config import EncoderConfig, PrivacyConfig
from fedfraud.feature_store.encoders import encode_location, encode_time
from fedfraud.feature_store.geo import haversine_km
from fedfraud.feature_store.privacy import PrivateFeaturizer

ENC = EncoderConfig()
PRIV = PrivacyConfig(mechanism="thesis", secret_seed="test-inversion")
BOX = (30.0, 45.0, -100.0, -80.0)


def _featurizer():
    return PrivateFeaturizer(ENC, PRIV, b"one bank's secret")


def _released(f):
    return lambda a, b: encode_location(a, b, ENC)[:, f.permutation]


def test_nearest_finds_the_closest_candidate():
    cands = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 5.0]], dtype=np.float32)
    np.testing.assert_array_equal(nearest(np.array([[0.9, 0.1], [0.1, 4.0], [-1.0, -1.0]]), cands, chunk=2),
                                  [1, 2, 0])


def test_clean_decode_of_places_on_the_grid_is_exact():
    rng = np.random.default_rng(1)
    lat = BOX[0] + rng.integers(0, 300, 200) * GRID_DEG
    lon = BOX[2] + rng.integers(0, 400, 200) * GRID_DEG
    got = decode_locations_grid(encode_location(lat, lon, ENC), lambda a, b: encode_location(a, b, ENC), BOX)
    assert haversine_km(lat, lon, *got).max() < 0.01


def test_noised_location_error_grows_as_epsilon_shrinks_and_time_decodes_within_the_fine_step():
    rng = np.random.default_rng(0)
    n = 300
    lat, lon = rng.uniform(BOX[0], BOX[1], n), rng.uniform(BOX[2], BOX[3], n)
    f = _featurizer()
    keys = f.noise_keys([f"t{i}" for i in range(n)])
    err = {eps: haversine_km(lat, lon, *decode_locations_grid(f.location(lat, lon, keys, eps), _released(f), BOX))
           for eps in (10.0, 1.0, 0.1)}
    means = [err[e].mean() for e in (10.0, 1.0, 0.1)]
    assert means[0] < means[1] < means[2]
    assert means[0] < 3.9  # off-grid places: the clean-ish decode is off by the 0.05° quantization only
    secs = rng.integers(1_640_995_200, 1_640_995_200 + 180 * 86_400, n)
    got = decode_times(f.time(secs, keys, 10.0), lambda s: encode_time(s, ENC)[:, f.permutation],
                       (int(secs.min()), int(secs.max())))
    assert np.abs(got - secs).max() <= 30


def test_bootstrap_statistics_contain_the_point_estimate_and_resample_whole_groups():
    rng = np.random.default_rng(2)
    group = np.repeat(np.arange(50), 20)
    v = rng.exponential(5.0, group.size)
    got = bootstrap_statistics({"v": v, "const": np.full(group.size, 3.0)}, group,
                               {"median": np.median, "mean": np.mean}, resamples=200)
    for s in ("median", "mean"):
        i = got["v"][s]
        assert i.low <= i.value <= i.high and i.low < i.high
    assert got["v"]["mean"].value == pytest.approx(v.mean())
    assert got["const"]["median"].low == got["const"]["median"].high == 3.0


def test_inversion_bound_on_a_small_federation_recovers_clean_places_and_beats_the_baseline():
    rng = np.random.default_rng(3)
    n = 400
    frame = pd.DataFrame({
        "transaction_id": [f"t{i}" for i in range(n)],
        "cardholder_id": [f"c{i % 40}" for i in range(n)],
        "merchant_id": [f"m{i % 30}" for i in range(n)],
        "timestamp": pd.to_datetime(rng.integers(1_640_995_200, 1_640_995_200 + 30 * 86_400, n), unit="s", utc=True),
        "lat": np.round(rng.uniform(BOX[0], BOX[1], n), 2),
        "lon": np.round(rng.uniform(BOX[2], BOX[3], n), 2),
        "bank": np.arange(n) % 2,
    })
    got = inversion_bound(frame, ENC, PRIV, resamples=50)
    assert (got.rows, got.cardholders, got.banks) == (n, 40, 2)
    clean = next(v for k, v in got.location.items() if k.startswith("clean") and "every true place" in k)
    base = next(v for k, v in got.location.items() if k.startswith("no-information"))
    assert clean["median km"].value == 0.0 and clean["≤ 1 km"].value == 1.0
    assert base["median km"].low > 100.0
    floor = next(v for k, v in got.location.items() if "ε = 0.01" in k and "grid" in k)
    clean_grid = next(v for k, v in got.location.items() if k.startswith("clean") and "grid" in k)
    assert floor["median km"].value > clean_grid["median km"].value
    assert got.time[next(k for k in got.time if k.startswith("clean"))]["hour-of-day accuracy"].value > 0.95
    md = "\n".join(got.to_markdown_lines())
    assert "no-information baseline" in md and "calibrated mechanism" in md and "(configured)" in md


def test_markdown_of_an_inversion_only_run_and_contradicting_switches(tmp_path, capsys):
    from fedfraud.bench.attacks import AttacksBench
    from fedfraud.bench.inversion import InversionBound
    from fedfraud.cli.app import main

    md = AttacksBench("x.csv", {}, inversion=InversionBound(rows=10, cardholders=2, banks=1, policy="P"),
                      inversion_only=True).to_markdown()
    assert "### 4. What a perfect inversion" in md and "--inversion-only" in md and "ε policy: P" in md
    assert "### 1." not in md
    assert main(["bench", "attacks", "--data", str(tmp_path), "--inversion-only", "--no-inversion"]) == 2
    assert "contradict" in capsys.readouterr().err.strip().splitlines()[-1]

"""PSI and the sliding drift window (fedfraud.training.retrain.drift)."""

from __future__ import annotations

import numpy as np
import pytest

from fedfraud.training.retrain.drift import DriftMonitor, DriftReference, psi


def _reference(rng: np.random.Generator, n: int = 5000) -> tuple[DriftReference, np.ndarray]:
    X = np.column_stack([rng.lognormal(3, 1, n), rng.normal(0, 1, n)])
    X[rng.random(n) < 0.1, 1] = np.nan  # a missing anomaly score is a state of its own
    return DriftReference.from_matrix(["amount", "anomaly_score"], X), X


def test_same_distribution_is_stable_and_a_shift_is_not():
    rng = np.random.default_rng(0)
    ref, _ = _reference(rng)
    monitor = DriftMonitor(ref, window_rows=2000, min_rows=500)
    same = np.column_stack([rng.lognormal(3, 1, 2000), rng.normal(0, 1, 2000)])
    same[rng.random(2000) < 0.1, 1] = np.nan
    monitor.observe(same)
    stable = monitor.psi()
    assert stable["amount"] < 0.05 and stable["anomaly_score"] < 0.05
    shifted = np.column_stack([rng.lognormal(4.5, 1, 2000), rng.normal(0, 1, 2000)])  # amounts ×4.5
    for _ in range(3):
        monitor.observe(shifted)
    moved = monitor.psi()
    assert moved["amount"] > 0.25 and moved["anomaly_score"] > 0.25  # the NaN bin emptied: that is drift too
    assert monitor.rows == 2000  # the window dropped the old batches


def test_psi_is_withheld_until_min_rows_and_matches_the_formula():
    rng = np.random.default_rng(1)
    ref, _ = _reference(rng)
    monitor = DriftMonitor(ref, window_rows=1000, min_rows=500)
    monitor.observe(np.column_stack([rng.lognormal(3, 1, 100), rng.normal(0, 1, 100)]))
    assert monitor.psi() == {}
    e, a = np.array([0.5, 0.5]), np.array([0.9, 0.1])
    assert psi(e, a) == pytest.approx(0.4 * np.log(0.9 / 0.5) + (-0.4) * np.log(0.1 / 0.5))


def test_reference_round_trips_through_json():
    ref, X = _reference(np.random.default_rng(2))
    back = DriftReference.from_json(ref.to_json())
    assert back.names == ref.names and back.rows == ref.rows
    for a, b in zip(back.counts(X), ref.counts(X), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError):
        DriftReference.from_matrix(["a"], X)

"""One interval module (:mod:`fedfraud.training.bootstrap`): the merged code gives the numbers the copies gave.

Three copies of "point and 2.5 / 97.5 % quantiles of the finite draws" (the fraud studies' seed-averaged
``interval``, the anomaly benches' ``bootstrap_by_group``, hin2vec's ``paired_intervals``) are now
:func:`percentile_interval`; the two ``Interval`` classes (``point`` with ``fmt``, ``value`` with ``str``) are one.
The old formulas are written out here as they were, and the new code must give exactly their numbers and text.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedfraud.training.bootstrap import (
    Interval,
    bootstrap_by_group,
    bootstrap_counts,
    bootstrap_statistics,
    interval,
    percentile_interval,
)


def _draws(seed: int, n: int, nan_share: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    d = rng.normal(0.8, 0.05, n)
    d[rng.random(n) < nan_share] = np.nan  # replicates that drew no fraud
    return d


def _bench_copy(value: float, samples: list[float]) -> tuple[float, float, float]:
    """``fedfraud.bench.harness.bootstrap_by_group``'s inner ``interval``, as it was."""
    arr = np.asarray([x for x in samples if np.isfinite(x)])
    if not arr.size:
        return value, float("nan"), float("nan")
    return value, float(np.quantile(arr, 0.025)), float(np.quantile(arr, 0.975))


def _hin2vec_copy(point: float, draws: np.ndarray) -> tuple[float, float, float]:
    """``fedfraud.bench.hin2vec._interval``, as it was."""
    draws = draws[np.isfinite(draws)]
    if not draws.size:
        return point, float("nan"), float("nan")
    lo, hi = np.quantile(draws, [0.025, 0.975])
    return point, float(lo), float(hi)


def _fraud_copy(point_by_seed: list[float], boot_by_seed: np.ndarray) -> tuple[float, float, float]:
    """``fedfraud.training.fraud.bootstrap.interval``, as it was."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        boot = np.nanmean(np.asarray(boot_by_seed, dtype=np.float64), axis=0)
    boot = boot[np.isfinite(boot)]
    finite = np.asarray(point_by_seed, dtype=np.float64)
    point = float(np.mean(finite[np.isfinite(finite)])) if np.isfinite(finite).any() else float("nan")
    if boot.size == 0:
        return point, float("nan"), float("nan")
    low, high = np.quantile(boot, [0.025, 0.975])
    return point, float(low), float(high)


def _same(got: Interval, want: tuple[float, float, float]) -> None:
    assert np.array_equal([got.value, got.low, got.high], want, equal_nan=True)  # exactly, not approximately


@pytest.mark.parametrize(("seed", "n", "nan_share"), [(0, 500, 0.0), (1, 1000, 0.1), (2, 37, 0.5), (3, 20, 1.0)])
def test_the_one_percentile_interval_gives_the_numbers_of_every_former_copy(seed: int, n: int,
                                                                            nan_share: float) -> None:
    d = _draws(seed, n, nan_share)
    _same(percentile_interval(0.81, list(d)), _bench_copy(0.81, list(d)))
    _same(percentile_interval(0.81, d), _hin2vec_copy(0.81, d))
    boot = np.stack([d, _draws(seed + 10, n, nan_share)])
    _same(interval([0.8, float("nan"), 0.82], boot), _fraud_copy([0.8, float("nan"), 0.82], boot))


def test_the_one_interval_class_prints_as_both_former_classes_did() -> None:
    i = Interval(0.123456, -0.0125, 0.3)
    assert str(i) == f"{i.value:.3f} [{i.low:.3f}, {i.high:.3f}]" == "0.123 [-0.013, 0.300]"  # the benches' str
    assert i.fmt(100, 2, True) == "+12.35 [-1.25, +30.00]"  # the fraud studies' fmt
    assert not i.excludes_zero and Interval(0.1, 0.01, 0.2).excludes_zero


def test_both_bootstraps_draw_the_same_cardholders_for_the_same_seed() -> None:
    """The weights path (:func:`bootstrap_counts`) and the drawn-rows path (:func:`bootstrap_statistics`) resample
    the same cardholders from the same seed, so a statistic computed either way is the same number."""
    rng = np.random.default_rng(7)
    holders = rng.integers(0, 40, 400)
    amount = rng.gamma(2.0, 30.0, 400)
    _, codes = np.unique(holders, return_inverse=True)
    counts = bootstrap_counts(int(codes.max()) + 1, 200, seed=3)
    weighted = np.array([np.average(amount, weights=c[codes]) for c in counts])
    drawn = bootstrap_statistics({"amount": amount}, holders, {"mean": np.mean}, resamples=200, seed=3)
    got = drawn["amount"]["mean"]
    assert got.low == pytest.approx(float(np.quantile(weighted, 0.025)), rel=1e-12)
    assert got.high == pytest.approx(float(np.quantile(weighted, 0.975)), rel=1e-12)


def test_the_ranking_bootstrap_is_paired_and_drops_unscored_rows() -> None:
    rng = np.random.default_rng(5)
    holders = rng.integers(0, 60, 600)
    label = rng.random(600) < 0.1
    good = label + rng.normal(0, 0.5, 600)
    noise = rng.normal(0, 1, 600)
    noise[:5] = np.nan  # a detector that could not score five rows: every detector loses them
    table = bootstrap_by_group(label, {"good": good, "noise": noise}, holders, resamples=200, seed=1,
                               pairs=(("good", "noise"),))
    assert table["good"]["roc_auc"].low > table["noise"]["roc_auc"].high
    diff = table["good − noise"]["roc_auc"]
    assert diff.value == pytest.approx(table["good"]["roc_auc"].value - table["noise"]["roc_auc"].value)
    assert diff.excludes_zero

"""Federated merchant risk (issue 35): causality, the per-cardholder bound, the release as the sum of the banks'
vectors, the statistics on a hand-made example, and the backtest's private releases (seeded, calibrated per release).
"""

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

from fedfraud.training.merchant_risk.backtest import PrivateRelease, private_fed_columns
from fedfraud.training.merchant_risk.config import MerchantNoiseConfig, MerchantRiskConfig
from fedfraud.training.merchant_risk.dp import noise_for_epsilon, release_epsilon
from fedfraud.training.merchant_risk.release import private_release
from fedfraud.training.merchant_risk.stats import (
    DAY_S,
    RATES,
    STATS,
    BankActivity,
    bank_vector,
    daily_merchant_features,
    federation_release,
    merchant_feature_names,
    release_columns,
    release_feature_names,
    release_vector,
    risk_columns,
)

DAY0 = 19_000  # 2022-01-08: any UTC day index
CFG = MerchantRiskConfig(window_days=(4, 9), label_delay_days=3, cpp_days=4, max_merchants=3, buckets=64,
                         release_window_days=(4, 9), released_stats=("labelled", "frauds", "sole_frauds"),
                         release_max_merchants=2, release_average=1)


def _activity(seed: int, holders: int = 40, days: int = 30, n: int = 1500, buckets: int = 64) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "holder": rng.integers(0, holders, n).astype(str),
        "merchant": rng.integers(0, buckets * 4, n).astype(np.uint64),
        "ts": (DAY0 * DAY_S + rng.integers(0, days * DAY_S, n)).astype(np.int64),
        "label": (rng.random(n) < 0.15).astype(np.float32),
    })


def _of(frame: pd.DataFrame, cfg: MerchantRiskConfig = CFG) -> BankActivity:
    return BankActivity.of(frame["holder"], frame["merchant"].to_numpy(), frame["ts"].to_numpy(),
                           frame["label"].to_numpy(), cfg.buckets)


def _banks(frame: pd.DataFrame, n_banks: int = 3) -> dict[int, pd.DataFrame]:
    bank = frame["holder"].astype(int) % n_banks  # one cardholder, one bank
    return {b: frame[bank == b].reset_index(drop=True) for b in range(n_banks)}


def _features(frames: dict[int, pd.DataFrame], cfg: MerchantRiskConfig = CFG, **kw):
    return daily_merchant_features({b: _of(f, cfg) for b, f in frames.items()}, cfg, **kw)


def test_a_label_that_comes_back_after_the_feature_time_never_changes_the_feature():
    frames = _banks(_activity(1))
    base = _features(frames)
    for d in (DAY0 + 6, DAY0 + 12, DAY0 + 20):
        late, known = {}, {}
        for b, f in frames.items():
            arrives = f["ts"] + CFG.label_delay_days * DAY_S
            # release d - 1 is made at the start of day d: labels arriving after that are flipped
            late[b] = f.assign(label=np.where(arrives > d * DAY_S, 1 - f["label"], f["label"]).astype(np.float32))
            known[b] = f.assign(label=np.where(arrives <= d * DAY_S, 1 - f["label"], f["label"]).astype(np.float32))
        flipped_late, flipped_known = _features(late), _features(known)
        changed = False
        for b, f in frames.items():
            today = ((f["ts"] // DAY_S) == d).to_numpy()
            assert today.any()
            for scope in ("bank", "fed"):
                np.testing.assert_array_equal(flipped_late[b].of(scope)[today], base[b].of(scope)[today])
                changed |= not np.array_equal(flipped_known[b].of(scope)[today], base[b].of(scope)[today],
                                              equal_nan=True)
        assert changed, "flipping labels that had come back must change some feature (the test is not vacuous)"


def test_features_of_day_d_use_the_releases_up_to_d_minus_1_only():
    frames = _banks(_activity(2))
    releases: dict[int, np.ndarray] = {}
    full = _features(frames, on_release=lambda day, release: releases.__setitem__(day, release.copy()))
    d = DAY0 + 15
    for b, f in frames.items():
        today = np.flatnonzero(((f["ts"] // DAY_S) == d).to_numpy())
        act = _of(f)
        bucket = np.empty(len(act), dtype=np.int64)
        bucket[act.row] = act.bucket  # per row of f
        np.testing.assert_array_equal(full[b].fed[today], release_columns([releases[d - 1]], bucket[today], CFG))
        np.testing.assert_array_equal(full[b].bank[today], risk_columns(bank_vector(act, d - 1, CFG), bucket[today]))
        # the future and the rest of day d do not matter: keep the past and one transaction of day d
        target = today[0]
        past = (f["ts"] // DAY_S) < d
        cut = {k: g[(g["ts"] // DAY_S) < d] for k, g in frames.items()}
        cut[b] = pd.concat([f[past], f.iloc[[target]]], ignore_index=True)
        alone = _features(cut)
        for scope in ("bank", "fed"):
            np.testing.assert_array_equal(alone[b].of(scope)[-1], full[b].of(scope)[target])
    assert min(releases) == DAY0 - 1 and not releases[DAY0 - 1].any()  # nothing is known before the first day


def _heavy_and_others(k: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Others' random activity, and one cardholder who visits 5k merchants several times each, a third of it fraud."""
    rng = np.random.default_rng(3)
    others = _activity(3)
    heavy = pd.DataFrame({
        "holder": "heavy", "merchant": np.repeat(np.arange(5 * k), 4).astype(np.uint64),
        "ts": DAY0 * DAY_S + rng.integers(0, 12 * DAY_S, 20 * k),
        "label": (rng.random(20 * k) < 0.33).astype(np.float32),
    })
    return others, pd.concat([others, heavy], ignore_index=True)


@pytest.mark.parametrize("cap", [1, 2])
def test_one_cardholder_changes_a_bank_vector_by_at_most_the_bound(cap):
    cfg = CFG.model_copy(update={"per_merchant_cap": cap})
    others, both = _heavy_and_others(cfg.max_merchants)
    for day in (DAY0 + 5, DAY0 + 8, DAY0 + 11):
        diff = bank_vector(_of(both, cfg), day, cfg) - bank_vector(_of(others, cfg), day, cfg)
        assert diff.min() >= 0 and diff.max() <= cap
        for w in range(len(cfg.window_days)):
            block = diff[w * len(STATS):(w + 1) * len(STATS)]
            assert np.count_nonzero(block.any(axis=0)) <= cfg.max_merchants
            assert block[STATS.index("cardholders")].sum() == cfg.max_merchants  # the bound binds
            assert block[STATS.index("sole_frauds")].sum() <= 1
            flags = [STATS.index("cardholders"), STATS.index("sole_frauds"), STATS.index("cpp")]
            assert block[flags].max() <= 1


@pytest.mark.parametrize("released", [("frauds",), ("labelled", "frauds", "sole_frauds"), STATS])
@pytest.mark.parametrize("cap", [1, 2])
def test_one_cardholder_changes_the_release_vector_by_at_most_its_sensitivity(released, cap):
    cfg = CFG.model_copy(update={"per_merchant_cap": cap, "released_stats": released})
    others, both = _heavy_and_others(cfg.max_merchants)
    binds = False
    for day in (DAY0 + 5, DAY0 + 8, DAY0 + 11):
        diff = release_vector(_of(both, cfg), day, cfg) - release_vector(_of(others, cfg), day, cfg)
        assert diff.shape == (len(cfg.release_window_days) * len(released), cfg.buckets)
        assert diff.min() >= 0
        assert np.abs(diff).sum() <= cfg.sensitivity_l1()
        assert np.sqrt((diff.astype(float) ** 2).sum()) <= cfg.sensitivity_l2() + 1e-9
        for w in range(len(cfg.release_window_days)):
            block = diff[w * len(released):(w + 1) * len(released)]
            assert 0 < np.count_nonzero(block.any(axis=0)) <= cfg.release_max_merchants
        binds |= np.abs(diff).sum() == cfg.sensitivity_l1()
    if cap == 1 and "sole_frauds" not in released:  # sole_frauds needs all frauds at one merchant
        assert binds, "the heavy cardholder reaches the bound: the test is not vacuous"


def test_the_default_release_has_unit_sensitivity_and_the_bank_keeps_the_rest():
    cfg = MerchantRiskConfig()
    assert cfg.released_stats == ("frauds",) and cfg.sensitivity_l1() == 1 and cfg.sensitivity_l2() == 1.0
    wide = cfg.model_copy(update={"released_stats": STATS, "release_window_days": (10, 21),
                                  "release_max_merchants": 10})
    assert wide.sensitivity_l2() == pytest.approx(math.sqrt(2 * (10 * 5 + 1)))  # what releasing everything costs


def test_the_release_is_the_sum_of_the_banks_vectors_and_equals_one_bank_holding_everyone():
    frame = _activity(4)
    frames = _banks(frame, 4)
    everyone = _of(frame)
    for day in (DAY0 + 3, DAY0 + 10, DAY0 + 25):
        vectors = [release_vector(_of(f), day, CFG) for f in frames.values()]
        release = federation_release(vectors)
        np.testing.assert_array_equal(release, np.sum(vectors, axis=0))
        # each cardholder is in one bank and bounded on its own: the sum is what one bank of all would count
        np.testing.assert_array_equal(release, release_vector(everyone, day, CFG))
        assert release.shape == (len(CFG.release_window_days) * len(CFG.released_stats), CFG.buckets)
    feats = _features(frames)
    one = daily_merchant_features({0: everyone}, CFG)[0]
    for b, f in frames.items():
        rows = f.merge(frame.reset_index(), on=["holder", "merchant", "ts", "label"], how="left")["index"]
        np.testing.assert_array_equal(feats[b].fed, one.fed[rows.to_numpy()])
    with pytest.raises(ValueError, match="differ in shape"):
        federation_release([vectors[0], vectors[0][:2]])


def test_statistics_on_a_hand_made_example():
    cfg = MerchantRiskConfig(window_days=(5,), label_delay_days=2, cpp_days=3, max_merchants=4, buckets=16)
    t = DAY0 * DAY_S
    frame = pd.DataFrame({  # (holder, bucket, time in days, fraud)
        "holder": ["a", "a", "b", "b", "b"],
        "merchant": np.array([1, 2, 2, 3, 1], dtype=np.uint64),
        "ts": [t + int(0.5 * DAY_S), t + int(1.5 * DAY_S), t + int(1.6 * DAY_S), t + int(1.7 * DAY_S),
               t + int(0.2 * DAY_S)],
        "label": np.array([0, 1, 1, 1, 0], dtype=np.float32),
    })
    act = _of(frame, cfg)
    s = {name: i for i, name in enumerate(STATS)}
    early = bank_vector(act, DAY0 + 2, cfg)  # made at the end of day 2: day-1 labels (t + 2 d > 3 d) not back yet
    assert early[s["transactions"], 2] == 2 and early[s["cardholders"], 1] == 2
    assert early[s["labelled"]].sum() == 2 and early[s["frauds"]].sum() == 0 and early[s["cpp"]].sum() == 0
    v = bank_vector(act, DAY0 + 3, cfg)
    assert v[s["labelled"]].sum() == 5
    assert v[s["frauds"], 2] == 2 and v[s["frauds"], 3] == 1
    assert v[s["sole_frauds"], 2] == 1 and v[s["sole_frauds"], 3] == 0  # b's frauds are at two merchants
    assert v[s["cpp"], 1] == 2  # both visited bucket 1 before a fraud on their card within 3 days
    assert v[s["cpp"], 2] == 1 and v[s["cpp"], 3] == 0  # a fraud strictly after b's visit at 2 (at 3, 0.1 d later)
    cols = risk_columns(v, np.array([2, 5]))
    names = merchant_feature_names("bank", cfg.window_days)
    assert len(names) == cols.shape[1] == len(STATS) + len(RATES)
    assert cols[0, names.index("merchant_bank_fraud_rate_5d")] == 1.0
    assert np.isnan(cols[1, names.index("merchant_bank_fraud_rate_5d")])  # nobody there: no rate
    # the default release: frauds only, one bucket per cardholder (b's frauds at 2 and 3 count once)
    one = cfg.model_copy(update={"release_window_days": (5,)})
    r = release_vector(act, DAY0 + 3, one)
    assert r.shape == (1, 16) and r.sum() == 2 and r[0, 2] >= 1
    assert release_feature_names(one) == ("merchant_fed_frauds_5d",)
    assert bank_vector(act, DAY0 + 6, cfg)[:, 1].sum() == 0  # day 0 has left the 5-day window


def test_config_refuses_unordered_windows_and_activity_refuses_unsorted_rows():
    with pytest.raises(ValueError):
        MerchantRiskConfig(window_days=(21, 10))
    act = _of(_activity(5))
    with pytest.raises(ValueError, match="sorted"):
        dataclasses.replace(act, ts_s=act.ts_s[::-1].copy())


def test_private_rows_read_private_release_of_the_day_before_reproducibly_and_a_huge_epsilon_is_the_clear_sum():
    frames = _banks(_activity(6))
    acts = {b: _of(f) for b, f in frames.items()}
    clear = daily_merchant_features(acts, CFG)
    p1 = PrivateRelease.calibrated(1.0, CFG, len(acts), seed=5)
    delta = MerchantNoiseConfig().delta
    l1, l2 = float(CFG.sensitivity_l1()), CFG.sensitivity_l2()
    assert p1.delta == delta and p1.plan.noise_std == noise_for_epsilon(1.0, 1, delta, l1, l2)
    assert release_epsilon(p1.plan.noise_std, 1, delta, l1, l2) <= 1.0
    first = private_fed_columns(acts, CFG, (p1,))[p1.variant]
    again = private_fed_columns(acts, CFG, (PrivateRelease.calibrated(1.0, CFG, len(acts), seed=5),))[p1.variant]
    other = private_fed_columns(acts, CFG, (dataclasses.replace(p1, seed=6),))[p1.variant]
    p3 = PrivateRelease.calibrated(3.0, CFG, len(acts), seed=5)
    both = private_fed_columns(acts, CFG, (p3, p1))  # another row beside it does not change a row's noise
    for b in acts:
        np.testing.assert_array_equal(first[b], again[b])
        np.testing.assert_array_equal(first[b], both[p1.variant][b])
        assert not np.array_equal(first[b], other[b], equal_nan=True)
        assert not np.array_equal(first[b], clear[b].fed, equal_nan=True)
        assert not np.array_equal(first[b], both[p3.variant][b], equal_nan=True)
    # the rows of day d read the private release of day d − 1 of the banks' vectors, drawn from the day's generator
    d = DAY0 + 15
    vectors = [release_vector(acts[b], d - 1, CFG) for b in sorted(acts)]
    release = private_release(vectors, p1.plan, p1.rng(d - 1))
    for b, f in frames.items():
        today = np.flatnonzero(((f["ts"] // DAY_S) == d).to_numpy())
        bucket = np.empty(len(acts[b]), dtype=np.int64)
        bucket[acts[b].row] = acts[b].bucket
        np.testing.assert_array_equal(first[b][today], release_columns([release], bucket[today], CFG))
    huge = PrivateRelease.calibrated(1e8, CFG, len(acts), seed=5)
    near = private_fed_columns(acts, CFG, (huge,))[huge.variant]
    for b in acts:
        same = (near[b] == clear[b].fed) | (np.isnan(near[b]) & np.isnan(clear[b].fed))
        assert same.mean() > 0.999
    with pytest.raises(ValueError, match="clear row"):
        PrivateRelease.calibrated(math.inf, CFG, 3)


def test_federation_features_average_the_latest_releases_at_no_privacy_cost():
    frames = _banks(_activity(7))
    acts = {b: _of(f) for b, f in frames.items()}
    cfg = CFG.model_copy(update={"release_average": 3})
    releases: dict[int, np.ndarray] = {}
    cols = daily_merchant_features(acts, cfg, on_release=lambda day, r: releases.__setitem__(day, r.copy()))
    d = DAY0 + 12
    for b, f in frames.items():
        today = np.flatnonzero(((f["ts"] // DAY_S) == d).to_numpy())
        bucket = np.empty(len(acts[b]), dtype=np.int64)
        bucket[acts[b].row] = acts[b].bucket
        mean = np.mean([releases[d - 3], releases[d - 2], releases[d - 1]], axis=0)
        np.testing.assert_allclose(cols[b].fed[today][:, 1], mean[1, bucket[today]], rtol=1e-6)  # frauds, 4 d
        assert cols[b].fed.shape[1] == len(release_feature_names(cfg))
    # the mean is of releases already made: the accountant charges one release per day whatever N is
    assert CFG.sensitivity_l2() == cfg.sensitivity_l2()

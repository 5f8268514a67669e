"""Cross-fitting, the controls, the cardholder bootstrap and unequal bank shares."""

import numpy as np
import pandas as pd
import pytest

from fedfraud.cli.app import main
from fedfraud.training.data.config import IngestConfig
from fedfraud.training.data.partition import share_banks
from fedfraud.training.bootstrap import RankedScores, bootstrap_counts, interval, weighted_metrics
from fedfraud.training.fraud.metrics import classification_metrics
from fedfraud.training.fraud.stacking import (
    cardholder_folds,
    crossfit_anomaly_scores,
    permuted_within_bank,
    spend_ratio_score,
)


def _frames(seed: int = 0) -> dict[int, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    out = {}
    for b, holders in ((0, 30), (1, 12)):
        n = holders * 8
        out[b] = pd.DataFrame({
            "cardholder_id": [f"b{b}-c{i % holders}" for i in range(n)],
            "timestamp": pd.Timestamp("2026-01-01", tz="UTC") + pd.to_timedelta(rng.integers(0, 10**6, n), unit="s"),
            "amount": rng.gamma(2.0, 30.0, n).round(2),
        })
    return out


def test_crossfit_never_scores_a_row_with_a_model_that_saw_its_cardholder():
    frames = _frames()
    folds = cardholder_folds({b: f["cardholder_id"].to_numpy() for b, f in frames.items()}, k=4, seed=3)
    calls = []

    def fit_and_score(train, score):
        """A real (tiny) model: the median amount of the training rows; score = amount / median."""
        seen = {c for f in train.values() for c in f["cardholder_id"]}
        median = float(np.median(np.concatenate([f["amount"].to_numpy() for f in train.values()])))
        calls.append((seen, {c for f in score.values() for c in f["cardholder_id"]}, median))
        return {b: f["amount"].to_numpy() / median for b, f in score.items()}

    scores = crossfit_anomaly_scores(frames, folds, fit_and_score)
    assert len(calls) == 4 and set(folds.values()) == {0, 1, 2, 3}
    for seen, scored, _ in calls:
        assert scored and not (seen & scored)  # the model never trained on a cardholder it scores
        assert len(seen | scored) == len(folds)  # and trained on every other cardholder
    for b, f in frames.items():
        assert scores[b].shape == (len(f),) and np.isfinite(scores[b]).all()
        # each row's score came from the call that scored its cardholder's fold
        for i, (holder, amount) in enumerate(zip(f["cardholder_id"], f["amount"], strict=True)):
            (median,) = [m for _, scored, m in calls if holder in scored]
            assert scores[b][i] == pytest.approx(amount / median)
    with pytest.raises(ValueError, match="no fold"):
        crossfit_anomaly_scores(frames, {"b0-c0": 0}, fit_and_score)


def test_folds_are_stable_and_seeded():
    ids = np.array([f"c{i}" for i in range(200)])
    a, b = cardholder_folds(ids, 5, seed=1), cardholder_folds(ids[::-1], 5, seed=1)
    assert a == b and set(a.values()) == set(range(5))
    assert a != cardholder_folds(ids, 5, seed=2)


def test_permuted_control_keeps_each_banks_values():
    scores = {0: np.arange(50.0), 1: np.arange(10.0) + 100}
    perm = permuted_within_bank(scores, seed=0)
    for b in scores:
        assert sorted(perm[b]) == sorted(scores[b]) and not np.array_equal(perm[b], scores[b])


def test_spend_ratio_is_causal_and_hand_computed():
    t0 = pd.Timestamp("2026-01-01", tz="UTC")
    frame = pd.DataFrame({
        "cardholder_id": ["a", "a", "b", "a", "a"],
        "timestamp": [t0 + pd.Timedelta(hours=h) for h in (0, 1, 0, 48, 49)],
        "amount": [10.0, 20.0, 5.0, 40.0, 100.0],
    })
    s = spend_ratio_score(frame)
    # a: 24 h spends 10, 30, 40, 140; medians of earlier ones: -, 10, 20, 30
    assert np.isnan(s[0]) and np.isnan(s[2])
    assert s[1] == pytest.approx(30 / 11) and s[3] == pytest.approx(40 / 21) and s[4] == pytest.approx(140 / 31)
    changed = frame.assign(amount=[10.0, 20.0, 5.0, 40.0, 9999.0])  # the future does not change the past
    assert np.array_equal(spend_ratio_score(changed)[:4], s[:4], equal_nan=True)


def test_weighted_metrics_equal_plain_metrics_and_duplication():
    rng = np.random.default_rng(0)
    y = rng.random(400) < 0.1
    s = np.round(rng.random(400) + 0.4 * y, 2)
    ranked = RankedScores.of(y, s, 0.7)
    got = weighted_metrics(ranked, np.ones(400), 0.05)
    want = classification_metrics(y, s, 0.7, 0.05)
    assert got["pr_auc"] == pytest.approx(want.pr_auc)
    assert got["recall_at_fpr"] == pytest.approx(want.recall_at_fpr) and got["f1"] == pytest.approx(want.f1)
    w = rng.integers(0, 3, 400).astype(float)  # weight k == the row repeated k times
    rep = np.repeat(np.arange(400), w.astype(int))
    dup = classification_metrics(y[rep], s[rep], 0.7, 0.05)
    got_w = weighted_metrics(ranked, w, 0.05)
    assert got_w["pr_auc"] == pytest.approx(dup.pr_auc) and got_w["f1"] == pytest.approx(dup.f1)
    assert got_w["recall_at_fpr"] == pytest.approx(dup.recall_at_fpr)


def test_bootstrap_counts_and_interval():
    counts = bootstrap_counts(30, 200, seed=1)
    assert counts.shape == (200, 30) and (counts.sum(axis=1) == 30).all()
    iv = interval([0.5, 0.7], np.vstack([np.linspace(0, 1, 101), np.linspace(0, 1, 101)]))
    assert iv.value == pytest.approx(0.6) and iv.low == pytest.approx(0.025) and iv.high == pytest.approx(0.975)
    assert iv.excludes_zero and not interval([0.0], np.array([[-1.0, 1.0]])).excludes_zero


def test_bank_shares_partition():
    ids = pd.Series([f"card-{i}" for i in range(20_000)])
    shares = (0.3, 0.25, 0.2, 0.2, 0.05)
    banks = share_banks(ids, shares)
    assert np.allclose(np.bincount(banks, minlength=5) / len(ids), shares, atol=0.01)
    assert np.array_equal(share_banks(ids[::-1].reset_index(drop=True), shares), banks[::-1])  # per cardholder
    with pytest.raises(ValueError, match="sum to 1"):
        IngestConfig(banks=2, bank_shares=(0.5, 0.6))
    with pytest.raises(ValueError, match="entries"):
        IngestConfig(banks=3, bank_shares=(0.5, 0.5))


def test_bad_bank_shares_is_one_line_error(tmp_path, capsys):
    csv = tmp_path / "x.csv"
    csv.write_text("a,b\n1,2\n", encoding="utf-8")
    assert main(["ingest", str(csv), "--out", str(tmp_path / "o"), "--bank-shares", "0.5,x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --bank-shares")

"""``fedfraud eval backtest`` (issue 35) on a tiny synthetic frame with a compromised-merchant scenario: the replay
writes one score per replayed transaction and variant, trains on labels as they had arrived, and reports per bank
and per scenario. The federated variants run the real histogram federation (one process per bank).
"""

import contextlib
import io

import numpy as np
import pandas as pd
import pytest

from fedfraud.cli.app import main
from fedfraud.feature_store.config import EncoderConfig, PrivacyConfig
from fedfraud.feature_store.encoders import timestamps_us
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.training.data.synthetic import RAW_CSV, generate_dataset, generate_frame
from fedfraud.training.fraud.config import FraudConfig
from fedfraud.training.merchant_risk.backtest import VARIANTS, backtest_frames, prepare_backtest
from fedfraud.training.merchant_risk.config import MerchantRiskConfig

pytestmark = pytest.mark.integration

GEN = GeneratorConfig(banks=2, cardholders=80, days=30, seed=3, fraud_rate=0.03)
CUT, DELAY = "2026-01-20", 2


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("backtest")
    generate_dataset(root / "data", GEN, raw_csv=True, progress=False)
    frame, _ = generate_frame(GEN)
    assert (frame["scenario"] == "compromised_merchant").any()
    scenarios = root / "scenarios.csv"
    pd.DataFrame({"trans_num": frame["transaction_id"],
                  "scenario": np.where(frame["is_fraud"], frame["scenario"], "0")}).to_csv(scenarios, index=False)
    return {"root": root, "csv": root / "data" / RAW_CSV, "scenarios": scenarios, "frame": frame}


PRIVATE = ("fl+merchant-fed ε=1", "fl+merchant-fed ε=1e+08")


@pytest.fixture(scope="module")
def replay(world):
    """One ``eval backtest`` through the CLI for both tests below (one histogram federation, not two): the
    compromised-merchant scenario labels, 7-day releases and three private rows (a repeated ε is one row). 60 trees:
    with 20, the clear model of this tiny world splits on no merchant column, and the ε = 1 row differed from it
    only because its noisy training releases happened to be used."""
    out = world["root"] / "out"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["--log-level", "WARNING", "--set", "fraud.num_boost_round=60", "--set",
                     "fraud.threshold_bins=200", "eval", "backtest", "--csv", str(world["csv"]), "--format", "sparkov",
                     "--banks", "2", "--train-until", CUT, "--labels-delay-days", str(DELAY), "--scenarios",
                     str(world["scenarios"]), "--window-days", "3,7", "--release-window-days", "7", "--reps", "50",
                     "--epsilon", "1", "--epsilon", "1e8", "--epsilon", "1", "--out", str(out)])
    assert code == 0, printed.getvalue()[-2000:]
    return {"out": out, "printed": printed.getvalue(),
            "scores": pd.read_csv(out / "scores.csv", dtype={"transaction_id": str})}


def test_backtest_writes_every_variant_for_every_replayed_transaction(world, replay):
    out, scores = replay["out"], replay["scores"]
    assert list(scores.columns) == ["transaction_id", "variant", "fraud_score"]
    assert list(scores["variant"].unique()) == [*VARIANTS, *PRIVATE]  # a repeated ε is one row
    frame = world["frame"]
    replayed = set(frame.loc[frame["timestamp"] >= pd.Timestamp(CUT, tz="UTC"), "transaction_id"])
    for _, rows in scores.groupby("variant"):
        assert set(rows["transaction_id"]) == replayed and rows["transaction_id"].is_unique
    assert scores["fraud_score"].between(0, 1).all()
    printed = replay["printed"]
    for heading in ("**pooled**", "**bank 0**", "**bank 1**", "**compromised_merchant**",
                    "fl+merchant-fed − fl+merchant-bank (paired)", "histogram federation", "DP and SecAgg are OFF"):
        assert heading in printed
    assert (out / "report.md").read_text(encoding="utf-8") in printed
    releases = pd.read_csv(out / "merchant_releases.csv")
    assert {"release_day", "bucket", "frauds_7d"} <= set(releases.columns)  # the release: frauds only
    assert (releases["release_day"] < CUT).any() and (releases["frauds_7d"] > 0).all()


def test_epsilon_adds_private_rows_and_a_huge_epsilon_scores_as_the_clear_row(replay):
    wide = replay["scores"].pivot(index="transaction_id", columns="variant", values="fraud_score")
    assert not wide.isna().any().any()
    clear, huge, one = wide["fl+merchant-fed"], wide[PRIVATE[1]], wide[PRIVATE[0]]
    assert np.isclose(huge, clear, atol=1e-6).mean() > 0.99  # σ ≈ 0.002: the release is (nearly) the clear sum
    assert not np.allclose(clear, wide["fl"])  # the model reads the merchant columns, or no ε could show
    assert not np.allclose(one, clear)
    printed = replay["printed"]
    for text in ("**Private release**", "ε over the replayed period", "fl+merchant-fed ε=1 − fl+merchant-fed (paired)",
                 "DP and SecAgg are OFF for fl+merchant-fed"):
        assert text in printed
    row = next(line for line in printed.splitlines() if line.startswith("| fl+merchant-fed ε=1 |"))
    sigma, _, eps, eps_test = (cell.strip() for cell in row.split("|")[2:6])
    assert float(eps) == 1 and float(sigma) > 0 and float(eps_test) > 1  # composed over the replayed days


def test_training_uses_only_labels_that_had_come_back_and_the_stand_in_says_so(world):
    frame = world["frame"]
    frames = {int(b): g.drop(columns=["bank", "scenario", "holder"]).reset_index(drop=True)
              for b, g in frame.groupby("bank")}
    fc = FraudConfig(num_boost_round=10)
    data = prepare_backtest(frames, CUT, DELAY, fc, EncoderConfig(), PrivacyConfig(), 1 << 10, progress=False)
    cut_s = int(pd.Timestamp(CUT, tz="UTC").timestamp())
    for b, f in frames.items():
        ts = timestamps_us(f["timestamp"]) // 1_000_000
        fit, split = data.fit[b], data.base[b].split
        assert fit.any() and np.all(ts[fit] + DELAY * 86_400 <= cut_s)
        assert np.all((split == "test") == (ts >= cut_s))
        late = (ts < cut_s) & (ts + DELAY * 86_400 > cut_s)
        assert late.any() and not fit[late].any()  # before the cut but not yet labelled: never trained on
    scen = frame.set_index("transaction_id")["scenario"].where(frame.set_index("transaction_id")["is_fraud"])
    report = backtest_frames(frames, CUT, fc, EncoderConfig(), PrivacyConfig(),
                             MerchantRiskConfig(window_days=(3, 7), label_delay_days=DELAY, buckets=1 << 10),
                             scenarios=scen, trainer="central", reps=50, progress=False)
    assert "CENTRALIZED" in str(report.info["trainer"]) and "stand-in" in report.to_markdown()
    assert set(report.scores["variant"]) == set(VARIANTS)
    assert "compromised_merchant" in report.groups

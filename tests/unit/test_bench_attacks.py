"""`fedfraud bench attacks`: the membership attack's counting and direction, TV, and one-line CLI errors."""

import math

import numpy as np
import pandas as pd
import pytest

from fedfraud.bench.attacks import _tv, binned, membership_inference
from fedfraud.cli.app import main


def test_membership_auc_counts_scored_cardholders_and_lower_loss_means_member():
    rng = np.random.default_rng(0)
    n = 200
    split = np.where(np.arange(n) < 120, "train", np.where(np.arange(n) < 150, "val", "test"))
    leaky = np.where(split == "train", 0.2, 0.8) + rng.normal(0, 0.01, n)  # members have a lower loss
    blind = rng.random(n)
    leaky[[0, 150]] = np.nan  # one member and one non-member without a score: dropped from every column
    per = pd.DataFrame({"split": split, "leaky": leaky, "blind": blind}, index=[f"c{i}" for i in range(n)])
    got = {r.setting: r for r in membership_inference(per, {"leaky": (math.inf, {}), "blind": (1.0, {})}, 200)}
    assert (got["leaky"].members, got["leaky"].non_members) == (119, 79)
    assert (got["blind"].members, got["blind"].non_members) == (119, 79)
    assert got["leaky"].auc.value == 1.0 and got["leaky"].member_score < got["leaky"].non_member_score
    assert got["blind"].auc.low < 0.5 < got["blind"].auc.high


def test_tv_and_bins():
    assert _tv(np.array([1, 0]), np.array([0, 5])) == 1.0
    assert _tv(np.array([2, 2]), np.array([1, 1])) == 0.0
    cuts = np.array([1.0, 2.0, 3.0], dtype=np.float32)  # upper bounds; beyond the last goes to the last bin
    np.testing.assert_array_equal(binned(np.array([0.5, 1.0, 2.5, 9.0, np.nan]), cuts), [1, 1, 2])


@pytest.mark.parametrize(("args", "message"), [
    (["--epsilon", "0"], "--epsilon must be > 0"),
    ([], "give exactly one of --csv FILE or --data DIR"),
])
def test_bad_arguments_give_one_line(tmp_path, capsys, args, message):
    assert main(["bench", "attacks", *args, *(["--data", str(tmp_path)] if args else [])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and message in err[-1]


def test_markdown_without_histograms_says_so_and_keeps_the_membership_table():
    from fedfraud.bench.attacks import AttacksBench, MembershipResult
    from fedfraud.training.bootstrap import Interval

    run = MembershipResult("DP off", math.inf, {"dp": "off"}, Interval(0.51, 0.47, 0.55), 60, 40, 0.7, 0.71)
    md = AttacksBench("x.csv", {"rounds": 1, "max-train-pairs": 100, "dp-delta": 1e-5}, membership=[run]).to_markdown()
    assert "Not run (`--no-histograms`)." in md and "| DP off | off |" in md and "0.510 [0.470, 0.550] | 60 / 40" in md
    assert "no-information baseline (a coin)" in md

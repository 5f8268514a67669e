"""`fedfraud bench privacy`: the default-ε rule (validation only), the table, and one-line CLI errors."""

import math

import pytest

from fedfraud.training.bootstrap import Interval
from fedfraud.bench.privacy import PrivacyBench, PrivacyRun
from fedfraud.cli.app import main


def _bench(val_aucs: dict[float, tuple[float, float, float]], baseline: float) -> PrivacyBench:
    runs, val = [], {}
    for eps, (v, lo, hi) in val_aucs.items():
        card = {"dp": "off"} if math.isinf(eps) else {
            "dp": "on", "epsilon": eps, "noise_multiplier": 1.0, "noise_std": [0.2]}
        run = PrivacyRun(eps, card, 60.0, None)  # type: ignore[arg-type]
        runs.append(run)
        val[run.name] = {"roc_auc": Interval(v, lo, hi), "pr_auc": Interval(0.1, 0.05, 0.2)}
    val["baseline:spend_24h_surprise"] = {"roc_auc": Interval(baseline, baseline - 0.01, baseline + 0.01),
                                          "pr_auc": Interval(0.3, 0.2, 0.4)}
    settings = {"rounds": 10, "local-epochs": 10, "samples-per-epoch": 1024, "batch-size": 128,
                "dp-clipping-norm": 1.0, "dp-delta": 1e-5, "readout": "next-event", "pooling": "topk"}
    return PrivacyBench("data.csv", settings, runs, test=dict(val), val=val)


def test_default_is_the_smallest_epsilon_clearly_above_the_best_baseline():
    bench = _bench({1.0: (0.6, 0.5, 0.7), 3.0: (0.93, 0.915, 0.95), 8.0: (0.95, 0.94, 0.96),
                    math.inf: (0.98, 0.97, 0.99)}, baseline=0.91)
    eps, why = bench.choose_default()
    assert eps == 3.0 and "smallest ε" in why
    md = bench.to_markdown()
    assert "**Demo default: ε=3**" in md and "| ε=8 | 1.000 | 0.2000 | 8.000 |" in md


def test_default_stays_dp_off_when_no_finite_epsilon_beats_the_baseline():
    bench = _bench({1.0: (0.5, 0.45, 0.55), 8.0: (0.9, 0.88, 0.92), math.inf: (0.98, 0.97, 0.99)}, baseline=0.91)
    eps, why = bench.choose_default()
    assert math.isinf(eps) and "no finite ε" in why and "DP off reaches 0.980" in why
    assert "**Demo default: ε=∞ (DP off)**" in bench.to_markdown()


@pytest.mark.parametrize(("args", "message"), [
    (["--epsilon", "0"], "--epsilon must be > 0"),
    ([], "give exactly one of --csv FILE or --data DIR"),
])
def test_bad_arguments_give_one_line(tmp_path, capsys, args, message):
    assert main(["bench", "privacy", *args, *(["--data", str(tmp_path)] if args else [])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and message in err[-1]


def test_bootstrap_splits_gives_each_split_its_own_intervals_and_the_test_counts():
    """The interval tables the privacy and adversary benches share: per split, per detector, paired differences."""
    import numpy as np
    import pandas as pd

    from fedfraud.bench.detection import bootstrap_splits

    rng = np.random.default_rng(0)
    n = 2000
    label = rng.random(n) < 0.1
    rows = pd.DataFrame({
        "split": np.where(np.arange(n) < n // 2, "test", "val"),
        "is_fraud": label,
        "cardholder_id": [f"c{i % 80}" for i in range(n)],
        "timestamp": pd.to_datetime(1_700_000_000 + np.arange(n) * 3600, unit="s", utc=True),
        "good": label + rng.normal(0, 0.5, n),  # separates frauds
        "noise": rng.normal(0, 1, n),
    })
    test, val, counts = bootstrap_splits(rows, ["good", "noise"], resamples=60, pairs=(("good", "noise"),))
    for table in (test, val):
        assert table["good"]["roc_auc"].value > 0.8 > table["noise"]["roc_auc"].value
        assert table["good"]["roc_auc"].low <= table["good"]["roc_auc"].value <= table["good"]["roc_auc"].high
    assert counts["test_transactions"] == n // 2 and counts["test_frauds"] == int(label[: n // 2].sum())
    assert test["good"]["roc_auc"].value != val["good"]["roc_auc"].value  # each split scored on its own rows
    assert any("good" in k and "noise" in k for k in test)  # the paired difference is there


def test_cardholder_unit_table_states_the_mechanism_and_validation_only_runs_have_no_test_table():
    bench = _bench({3.0: (0.95, 0.94, 0.96), math.inf: (0.98, 0.97, 0.99)}, baseline=0.91)
    bench.settings.update({"unit": "cardholder", "cardholder-dp-steps": 160, "cardholder-dp-sampling-rate": 0.25,
                           "cardholder-dp-pairs-per-step": 4, "cardholder-dp-clipping-norm": 1.0,
                           "cardholder-dp-pool-per-cardholder": 64, "cardholder-dp-delta": 1e-4})
    bench.runs[0] = PrivacyRun(3.0, {"dp": "on", "epsilon": 2.99, "noise_multiplier": 2.5, "clipping_norm": 0.5},
                               60.0, None, unit="cardholder")  # type: ignore[arg-type]
    md = bench.to_markdown()
    assert "Utility of cardholder-level DP" in md and "over all 160 steps" in md and "δ = 0.0001" in md
    assert "| ε=3 | 2.500 | 1.2500 | 2.990 |" in md  # noise std z·C on a bank's sum
    bench.test = {}
    md = bench.to_markdown()
    assert "Not scored (`--validation-only`)" in md and "| ε=3 | 2.500 | 1.2500 | 2.990 |" in md


def test_unknown_unit_is_one_line(tmp_path, capsys):
    assert main(["bench", "privacy", "--data", str(tmp_path), "--unit", "person"]) == 2
    assert "--unit must be bank or cardholder" in capsys.readouterr().err.strip().splitlines()[-1]

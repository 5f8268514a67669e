"""`fedfraud bench anomaly`: the scenario join, the per-scenario report, and choices made on validation only."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedfraud.bench.detection import (
    DetectionBench,
    best_on_validation,
    choose_rank_weights,
    load_scenarios,
    scenario_aucs,
    scenario_column,
)
from fedfraud.training.bootstrap import Interval
from fedfraud.core.errors import UserError
from fedfraud.training.anomaly.baselines import RANK_TERMS


def _scenarios_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.scenarios.csv.gz"
    text = ("trans_num,is_fraud,scenario,customer_id,terminal_id,tx_time_days,s3_times_multiplied\n"
            "aa01,0,0,1,7,0,0\n"
            " aa02 ,1,1,1,7,0,0\n"
            "aa03,1,2,2,8,1,0\n"
            "aa04,1,3,2,9,1,1\n"
            "zz99,1,2,5,8,3,0\n")
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write(text)
    return path


def _rows(ids: list[str], fraud: list[bool]) -> pd.DataFrame:
    return pd.DataFrame({"transaction_id": ids, "is_fraud": fraud, "bank": 0,
                         "cardholder_id": [f"c{i % 3}" for i in range(len(ids))]}, index=range(10, 10 + len(ids)))


def test_the_side_file_joins_on_trans_num_as_transaction_id(tmp_path: Path) -> None:
    path = _scenarios_file(tmp_path)
    mapping = load_scenarios(path)
    assert pd.isna(mapping["aa01"])  # scenario 0: genuine
    assert mapping.drop("aa01").to_dict() == {"aa02": "S1", "aa03": "S2", "aa04": "S3", "zz99": "S2"}
    rows = _rows(["aa04", "aa01", "aa02", "bb00", "aa03"], [True, False, True, False, True])
    column = scenario_column(rows, tmp_path, path)
    assert column.index.equals(rows.index)
    assert column.tolist()[0] == "S3" and column.tolist()[2] == "S1" and column.tolist()[4] == "S2"
    assert pd.isna(column.iloc[1]) and pd.isna(column.iloc[3])  # genuine, and a row the file does not know


def test_a_side_file_of_another_dataset_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no trans_num matches"):
        scenario_column(_rows(["x1", "x2"], [False, True]), tmp_path, _scenarios_file(tmp_path))


def test_no_side_file_and_no_generator_labels_means_no_scenarios(tmp_path: Path) -> None:
    assert scenario_column(_rows(["x1"], [False]), tmp_path, None) is None


def _tiny() -> tuple[pd.DataFrame, pd.Series]:
    # 6 legitimate rows scored 0..5; S1 frauds score high on "model" and low on "baseline:amount";
    # S2 frauds sit in the middle of "model" and top "baseline:amount"
    legit = pd.DataFrame({"model": np.arange(6.0), "baseline:amount": np.arange(6.0), "is_fraud": False})
    s1 = pd.DataFrame({"model": [10.0, 11.0], "baseline:amount": [-1.0, -2.0], "is_fraud": True})
    s2 = pd.DataFrame({"model": [2.5, 2.5], "baseline:amount": [9.0, 8.0], "is_fraud": True})
    unscored = pd.DataFrame({"model": [np.nan], "baseline:amount": [100.0], "is_fraud": [True]})
    rows = pd.concat([legit, s1, s2, unscored], ignore_index=True)
    scenario = pd.Series([None] * 6 + ["S1", "S1", "S2", "S2", "S2"], index=rows.index)
    return rows, scenario


def test_per_scenario_roc_auc_is_each_scenarios_frauds_against_legitimate_rows() -> None:
    rows, scenario = _tiny()
    table = scenario_aucs(rows, ["model", "baseline:amount"], scenario)
    assert list(table) == ["S1", "S2"]
    assert table["S1"] == {"frauds": 2.0, "model": 1.0, "baseline:amount": 0.0}
    assert table["S2"]["frauds"] == 2.0  # the row the model did not score is left out for every detector
    assert table["S2"]["model"] == pytest.approx(0.5)
    assert table["S2"]["baseline:amount"] == 1.0


def test_the_report_prints_one_row_per_scenario_with_every_detector() -> None:
    rows, scenario = _tiny()
    bench = DetectionBench("tiny.csv", {}, baseline="baseline:amount")
    bench.val = {"model": {"roc_auc": Interval(0.7, 0.6, 0.8), "pr_auc": Interval(0.5, 0.4, 0.6)},
                 "baseline:amount": {"roc_auc": Interval(0.6, 0.5, 0.7), "pr_auc": Interval(0.3, 0.2, 0.4)}}
    bench.counts = {"val_transactions": 10, "val_cardholders": 3, "val_frauds": 4, "val_incidents": 2}
    bench.scenario_aucs["val"] = scenario_aucs(rows, ["model", "baseline:amount"], scenario)
    text = bench.to_markdown()
    assert "| scenario | frauds | model | baseline:amount |" in text
    assert "| S1 | 2 | 1.000 | 0.000 |" in text and "| S2 | 2 | 0.500 | 1.000 |" in text
    assert "| baseline:amount (chosen on validation) | 0.600 [0.500, 0.700] | 0.300 [0.200, 0.400] | 4 |" in text
    assert "Test split not evaluated." in text
    test_part = text.split("### Test cardholders")[1].split("### Validation")[0]
    assert "Not evaluated in this run." in test_part and "| S1 |" not in test_part


def _ranked(seed: int, n: int = 400) -> pd.DataFrame:
    """Validation frauds show in the amount term only, test frauds in the transition term only."""
    rng = np.random.default_rng(seed)
    split = np.where(np.arange(n) < n // 2, "val", "test")
    fraud = rng.random(n) < 0.2
    ranks = {t: rng.random(n) for t in RANK_TERMS}
    ranks["amount_bin_nll"] = np.where((split == "val") & fraud, 0.9 + 0.1 * rng.random(n), ranks["amount_bin_nll"])
    ranks["category_transition"] = np.where((split == "test") & fraud, 0.95, ranks["category_transition"])
    rows = pd.DataFrame({f"rank:{t}": v for t, v in ranks.items()})
    rows["split"], rows["is_fraud"] = split, fraud
    rows["baseline:transition"] = ranks["category_transition"]
    rows["baseline:amount"] = ranks["amount_bin_nll"]
    return rows


def test_the_rank_weights_and_the_baseline_are_chosen_on_validation_only() -> None:
    rows = _ranked(0)
    weights = choose_rank_weights(rows)
    assert weights == {"amount_bin_nll": 1.0}
    assert best_on_validation(rows, ["baseline:transition", "baseline:amount"]) == "baseline:amount"
    flipped = rows.copy()
    test = flipped["split"] == "test"
    flipped.loc[test, "is_fraud"] = ~flipped.loc[test, "is_fraud"]  # the test labels cannot move either choice
    assert choose_rank_weights(flipped) == weights
    assert best_on_validation(flipped, ["baseline:transition", "baseline:amount"]) == "baseline:amount"
    np.testing.assert_array_equal(rows["baseline:rank_combination"], rows["rank:amount_bin_nll"])


def test_without_validation_frauds_the_ranks_get_equal_weights() -> None:
    rows = _ranked(1)
    rows["split"] = "test"
    assert choose_rank_weights(rows) == dict.fromkeys(RANK_TERMS, 1.0)
    mean = np.mean([rows[f"rank:{t}"] for t in RANK_TERMS], axis=0)
    np.testing.assert_allclose(rows["baseline:rank_combination"], mean)
    assert best_on_validation(rows, ["baseline:amount"]) == ""
    assert math.isfinite(rows["baseline:rank_combination"].sum())

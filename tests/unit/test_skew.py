"""Skewed banks (``ingest.skew``, ``eval ... --skew``): banks thinned by cardholder to fraud rates 0.2 %..5 %.

Real data throughout: frames with fraud episodes per cardholder, the project's generator and its ingest.
"""

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from fedfraud.cli.app import main
from fedfraud.core.errors import UserError
from fedfraud.feature_store.layout import list_banks, read_bank, read_manifest
from fedfraud.training.data.config import GeneratorConfig, IngestConfig
from fedfraud.training.data.ingest import ingest_csv
from fedfraud.training.data.skew import describe_skew, skew_dataset, skew_mask, skew_rates, skew_summary
from fedfraud.training.data.synthetic import RAW_CSV, generate_dataset


def _episodes(cards=300, seed=0, fraud_share=0.9):
    """Cardholders with 20..800 genuine rows; most have a fraud spell of 3..15 rows (as in Sparkov)."""
    rng = np.random.default_rng(seed)
    ids, labels = [], []
    for c in range(cards):
        n = int(rng.integers(20, 800))
        f = int(rng.integers(3, 16)) if rng.random() < fraud_share else 0
        ids += [f"card-{c}"] * (n + f)
        labels += [0] * n + [1] * f
    order = rng.permutation(len(ids))  # interleaved in time, as a bank's file is
    return pd.Series(np.asarray(ids)[order]), np.asarray(labels)[order]


def test_rates_are_log_spaced_from_02_to_5_percent():
    assert np.allclose(skew_rates(5), (0.002, 0.00447, 0.01, 0.02236, 0.05), rtol=1e-3)
    assert skew_rates(2) == (0.002, 0.05)
    with pytest.raises(ValueError):
        skew_rates(3, 0.05, 0.01)


@pytest.mark.parametrize("target", [0.002, 0.0045, 0.01, 0.03, 0.05])
def test_mask_reaches_target_within_one_cardholder_deterministically(target):
    ids, y = _episodes()
    keep, report = skew_mask(ids, y, target, bank=3)
    order = np.random.default_rng(1).permutation(len(y))  # the same rows in another order: the same rows kept
    again, _ = skew_mask(ids.iloc[order].reset_index(drop=True), y[order], target, bank=3)
    assert np.array_equal(keep[order], again)  # a pure function of (cardholder, labels, target)
    frame = pd.DataFrame({"id": ids, "y": y})
    per_card = frame.groupby("id")["y"].agg(["size", "sum"])
    # within one cardholder's frauds (lowering) or one cardholder's rows (raising) of the target
    slack = per_card["sum"].max() / report.rows if target < report.rate_before else \
        per_card["size"].max() * target / report.rows
    assert abs(report.rate - target) <= slack + 1e-12
    assert report.rate == pytest.approx(y[keep].mean())
    assert (report.rows, report.frauds) == (int(keep.sum()), int(y[keep].sum()))
    kept = frame[keep]
    if target < report.rate_before:  # cleaning: every cardholder keeps all its genuine rows
        assert report.dropped == 0 and report.cleaned > 0
        genuine = kept[kept.y == 0].groupby("id").size()
        assert genuine.sort_index().equals((per_card["size"] - per_card["sum"]).sort_index())
        cleaned = per_card.index[(per_card["sum"] > 0)].difference(kept[kept.y == 1]["id"].unique())
        assert len(cleaned) == report.cleaned
    else:  # raising: cardholders leave whole, never a fraud-heavier-than-target one
        assert report.cleaned == 0 and report.dropped > 0
        gone = per_card.index.difference(kept["id"].unique())
        assert len(gone) == report.dropped
        assert (per_card.loc[gone, "sum"] < target * per_card.loc[gone, "size"]).all()
        sizes = kept.groupby("id").size().sort_index()
        assert sizes.equals(per_card.loc[sizes.index, "size"])


def test_unreachable_rate_and_missing_labels_are_user_errors():
    ids, y = _episodes(cards=30, fraud_share=0.0)
    with pytest.raises(UserError, match="cannot reach"):
        skew_mask(ids, y, 0.05, bank=2)
    with pytest.raises(UserError, match="needs labels"):
        skew_mask(ids, np.where(np.arange(len(y)) % 7 == 0, np.nan, y), 0.01)


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    root = tmp_path_factory.mktemp("skew")
    generate_dataset(root / "gen", GeneratorConfig(banks=2, cardholders=300, days=60, seed=5, fraud_rate=0.03),
                     raw_csv=True, progress=False)
    return root / "gen" / RAW_CSV


def test_dataset_skew_keeps_one_bank_per_cardholder_and_records_it(ingested, tmp_path):
    cfg = IngestConfig(format="sparkov", banks=3, partition="region", skew=(0.002, 0.05))
    reports = []
    for run in ("a", "b"):
        out = tmp_path / run
        ingest_csv(ingested, out, cfg, progress=False)
        before = {b: read_bank(out, b) for b in list_banks(out)}
        reports.append(skew_dataset(out, *cfg.skew))
    assert reports[0] == reports[1]  # deterministic end to end
    after = {b: read_bank(out, b) for b in list_banks(out)}
    owners = pd.concat([f[["cardholder_id"]].drop_duplicates().assign(bank=b) for b, f in after.items()])
    assert owners["cardholder_id"].is_unique  # one cardholder, one bank
    for r, target in zip(reports[0], skew_rates(3), strict=True):
        frame = after[r.bank]
        assert r.target == pytest.approx(target) and len(frame) == r.rows
        assert frame["is_fraud"].mean() == pytest.approx(r.rate)
        assert abs(r.rate - target) <= max(0.25 * target, 0.002)  # within tolerance of the target
        # kept rows are the original rows, in file order; the cardholder stays in its region bank
        orig = before[r.bank].set_index("transaction_id")
        assert frame["transaction_id"].isin(orig.index).all()
        assert frame["timestamp"].is_monotonic_increasing
    manifest = read_manifest(out)
    assert manifest["skew"]["low"] == 0.002 and len(manifest["skew"]["banks"]) == 3
    assert manifest["per_bank"]["0"]["rows"] == reports[0][0].rows
    assert skew_summary(out) == {r.bank: r for r in reports[0]}
    assert "bank 2: target 5.00 %" in describe_skew(skew_summary(out))


def test_skew_needs_labels_and_nonempty_banks(ingested, tmp_path):
    raw = pd.read_csv(ingested, sep="|", dtype=str, keep_default_na=False)
    unlabelled = tmp_path / "unlabelled.csv"
    raw.drop(columns=["is_fraud"]).to_csv(unlabelled, sep="|", index=False)
    ingest_csv(unlabelled, tmp_path / "u", IngestConfig(banks=2), progress=False)
    with pytest.raises(UserError, match="needs labels"):
        skew_dataset(tmp_path / "u", 0.002, 0.05)
    one_state = raw.assign(state="MO")
    single = tmp_path / "single.csv"
    one_state.to_csv(single, sep="|", index=False)
    ingest_csv(single, tmp_path / "s", IngestConfig(banks=2, partition="region"), progress=False)
    with pytest.raises(UserError, match="holds no transactions"):
        skew_dataset(tmp_path / "s", 0.002, 0.05)


def test_config_rejects_bad_skew_settings():
    assert IngestConfig(skew=(0.002, 0.05)).skew == (0.002, 0.05)
    with pytest.raises(ValidationError, match="0 < lowest <= highest < 1"):
        IngestConfig(skew=(0.05, 0.002))
    with pytest.raises(ValidationError, match="cannot be combined"):
        IngestConfig(skew=(0.002, 0.05), bank_shares=(0.5, 0.5), banks=2)


@pytest.mark.parametrize("args, message", [
    (["eval", "stacking", "--skew", "--bank-shares", "0.5,0.5"], "error: --skew and --bank-shares cannot be combined"),
    (["--set", "ingest.skew=[0.5,0.1]", "eval", "stacking"], "skew must be (lowest, highest) fraud rates"),
    (["--set", "ingest.bank_shares=[0.5,0.5]", "--set", "ingest.banks=2", "eval", "backtest", "--skew"],
     "skew and bank_shares cannot be combined"),
])
def test_cli_bad_combinations_are_one_line_errors(ingested, tmp_path, capsys, args, message):
    data = ["--csv", str(ingested), "--train-until", "2026-02-01", "--labels-delay-days", "3", "--out",
            str(tmp_path)] if "backtest" in args else ["--data", str(ingested), "--anomaly-score", "none"]
    code = main(["--log-level", "ERROR", *args, *data, "--format", "sparkov"])
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_cli_unlabelled_dataset_dir_with_skew_is_one_line_error(ingested, tmp_path, capsys):
    raw = pd.read_csv(ingested, sep="|", dtype=str, keep_default_na=False)
    unlabelled = tmp_path / "unlabelled.csv"
    raw.drop(columns=["is_fraud"]).to_csv(unlabelled, sep="|", index=False)
    ingest_csv(unlabelled, tmp_path / "u", IngestConfig(banks=2), progress=False)
    capsys.readouterr()  # the ingest's own log lines (an earlier CLI test in this process may have left INFO on)
    code = main(["--log-level", "ERROR", "eval", "stacking", "--data", str(tmp_path / "u"), "--skew",
                 "--anomaly-score", "none"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "needs labels" in err[0], err


def test_eval_stacking_skew_shows_each_banks_rate_and_size(ingested, tmp_path, capsys):
    out = tmp_path / "skew.md"
    code = main(["--log-level", "WARNING", "--set", "fraud.num_boost_round=20", "--set", "fraud.threshold_bins=200",
                 "eval", "stacking", "--data", str(ingested), "--format", "sparkov", "--banks", "2", "--skew",
                 "--anomaly-score", "none", "--seeds", "1", "--reps", "50", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "| bank | rows | fraud rate | test cardholders | test frauds | Local | FL | Central | FL − Local [95 %] " \
           "| Central − FL [95 %] |" in text
    rows = {int(line.split("|")[1]): line.split("|") for line in text.splitlines() if line[:4] in ("| 0 ", "| 1 ")}
    assert sorted(rows) == [0, 1]
    rates = {b: float(cells[3].strip().rstrip(" %")) for b, cells in rows.items()}
    assert rates[0] == pytest.approx(0.2, abs=0.1) and rates[1] == pytest.approx(5.0, abs=0.5)
    assert "Skewed banks (`--skew`): bank 0: target 0.20 %" in text
    assert "Skewed banks (`--skew`)" in out.read_text(encoding="utf-8")


def test_eval_backtest_skew_reports_the_skewed_banks(ingested, tmp_path, capsys):
    code = main(["--log-level", "WARNING", "--set", "fraud.num_boost_round=20", "eval", "backtest", "--csv",
                 str(ingested), "--format", "sparkov", "--banks", "2", "--skew", "--train-until", "2026-02-10",
                 "--labels-delay-days", "3", "--fl-trainer", "central", "--reps", "50", "--out", str(tmp_path)])
    text = capsys.readouterr().out
    assert code == 0, text
    line = next(x for x in text.splitlines() if x.startswith("Skewed banks (`--skew`): "))
    assert "bank 0: target 0.20 %" in line and "bank 1: target 5.00 %" in line
    assert "**bank 0**" in text and "**bank 1**" in text  # the per-bank figures beside it


def test_a_bank_without_test_fraud_is_not_measured_rather_than_met():
    """At 0.2 % a small bank can end with no fraud among its test cardholders (the handbook's bank 0 did)."""
    from fedfraud.training.bootstrap import METRICS, Interval
    from fedfraud.training.fraud.evaluate import StudyReport

    nan, one = Interval(float("nan"), float("nan"), float("nan")), Interval(0.02, 0.01, 0.03)
    same = {m: Interval(0.9, 0.8, 0.95) for m in METRICS}
    per_bank = {b: {v: same for v in ("Local", "FL", "Central")} for b in (0, 1)}
    report = StudyReport(
        ("Local", "FL", "Central"), {v: same for v in ("Local", "FL", "Central")},
        {"FL − Local": {m: one for m in METRICS}, "FL − Central": {m: one for m in METRICS}}, per_bank,
        {0: {"FL − Local": nan, "Central − FL": nan}, 1: {"FL − Local": one, "Central − FL": one}},
        {0: {"test_cardholders": 30, "test_frauds": 0, "test_rows": 900, "rows": 3000, "fraud_rate": 0.002},
         1: {"test_cardholders": 20, "test_frauds": 40, "test_rows": 800, "rows": 3000, "fraud_rate": 0.05}},
        {v: [0.9] for v in ("Local", "FL", "Central")})
    targets = {name: (measured, met) for name, measured, met in report.targets()}
    measured, met = targets["FL above Local for every bank (PR-AUC)"]
    assert met is None and "bank 0: no test fraud" in measured
    text = report.to_markdown()
    assert "| 0 | 3000 | 0.20 % | 30 | 0 | — | — | — | — | — |" in text
    assert "| 1 | 3000 | 5.00 % | 20 | 40 | 0.900 | 0.900 | 0.900 | +2.0 [+1.0, +3.0] | +2.0 [+1.0, +3.0] |" in text


def test_ingest_applies_the_skew_setting(ingested, tmp_path, capsys):
    out = tmp_path / "ds"
    code = main(["--log-level", "ERROR", "--set", "ingest.skew=[0.002,0.05]", "ingest", str(ingested), "--banks", "2",
                 "--partition", "region", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "skew bank_0:" in text and "(target 0.20 %)" in text and "(target 5.00 %)" in text
    summary = skew_summary(out)
    assert summary is not None and sorted(summary) == [0, 1]
    assert read_bank(out, 1)["is_fraud"].mean() == pytest.approx(summary[1].rate)

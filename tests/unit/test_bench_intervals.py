"""The paired-difference rows: one format, used by the detection, adversary and privacy benches alike."""

from fedfraud.bench.adversary import AdversaryBench
from fedfraud.bench.detection import DetectionBench
from fedfraud.bench.harness import paired_difference_rows
from fedfraud.training.bootstrap import Interval
from fedfraud.bench.privacy import PrivacyBench

TABLE = {
    "GNN federated": {"roc_auc": Interval(0.91, 0.88, 0.93), "pr_auc": Interval(0.4, 0.3, 0.5)},
    "baseline:x": {"roc_auc": Interval(0.8, 0.7, 0.85), "pr_auc": Interval(0.2, 0.1, 0.3)},
    "GNN federated − baseline:x": {"roc_auc": Interval(0.11, -0.012, 0.2)},
}


def test_paired_differences_are_signed_rows_under_their_heading() -> None:
    assert paired_difference_rows(TABLE, "paired difference") == [
        "", "| paired difference | ROC-AUC [95% CI] |", "|---|---|",
        "| GNN federated − baseline:x | +0.110 [-0.012, +0.200] |",
    ]
    assert paired_difference_rows({k: v for k, v in TABLE.items() if "pr_auc" in v}, "any") == []


def test_every_bench_ends_its_table_with_the_same_rows() -> None:
    diff = paired_difference_rows(TABLE, "paired difference")
    assert DetectionBench("s", {})._rows(TABLE)[-len(diff):] == diff
    assert PrivacyBench("s", {})._table(TABLE, with_runs=False)[-len(diff):] == diff
    adversary = AdversaryBench("s", {})._blocks(TABLE, with_details=True)[:-1]  # its test block, then a blank
    assert adversary[-len(diff):] == paired_difference_rows(TABLE, "paired difference (attack − none)")
    assert adversary[-1] == diff[-1]

"""DSFL's rows in `fedfraud bench privacy` and `fedfraud bench adversary`: which runs are trained with which keys,
and how the tables show them (training and scoring stubbed: no data is read, nothing is trained).
"""

import math
from pathlib import Path

import pandas as pd
import pytest

import fedfraud.bench.adversary as adversary
import fedfraud.bench.privacy as privacy
import fedfraud.training.registry as registry_module
from fedfraud.training.bootstrap import Interval
from fedfraud.training.anomaly.federated.task import RunSettings
from fedfraud.training.federated.config import AGGREGATIONS, DSFLConfig
from fedfraud.training.federated.dsfl import dsfl_card

CARDS = {
    "dsfl": dsfl_card(DSFLConfig(epsilon_top=0.5, epsilon_rest=0.25), 3, 1000, 5),
    "gauss": {"dp": "on", "epsilon": 3.0, "noise_multiplier": 1.2, "noise_std": [0.24], "clipping_norm": 1.0,
              "sensitivity_factor": [1.0]},
    "off": {"dp": "off"},
}


@pytest.mark.parametrize("rule", AGGREGATIONS)
@pytest.mark.parametrize("epsilon", [3.0, math.inf])
def test_every_rule_at_every_epsilon_is_a_valid_run(rule, epsilon):
    s = RunSettings.from_flat(privacy.rule_dp_keys(rule, epsilon))
    assert s.federated.aggregation == rule
    if rule == "dsfl":
        assert not s.federated.dp.enabled and s.federated.dsfl.noise == math.isfinite(epsilon)
        assert s.federated.dsfl.target_epsilon == (epsilon if math.isfinite(epsilon) else 0.0)
    else:
        assert s.federated.dp.enabled == math.isfinite(epsilon)


@pytest.fixture
def stubbed(monkeypatch, tmp_path):
    """train_run records its keys; the registry hands back the card that fits them; scoring is faked."""
    trained: list[dict] = []

    def train_run(data, work, mode, flat, name):
        trained.append(dict(flat, name=name))
        return Path(tmp_path / name), 10.0

    class Registry:
        def __init__(self, path):
            self.flat = next(f for f in trained if f["name"] == Path(path).name)

        def get(self, kind, tag):
            f = self.flat
            card = (CARDS["dsfl"] if f["aggregation"] == "dsfl" and f.get("dsfl-noise")
                    else CARDS["gauss"] if f.get("dp-enabled") else CARDS["off"])
            return type("Version", (), {"privacy": {"client_dp": card}})()

    def bootstrap_splits(rows, detectors, resamples, pairs):
        cell = {"roc_auc": Interval(0.9, 0.85, 0.95), "pr_auc": Interval(0.2, 0.1, 0.3)}
        table = {d: dict(cell) for d in detectors}
        return table, table, {"test_transactions": 100}

    for module in (privacy, adversary):
        monkeypatch.setattr(module, "train_run", train_run)
        monkeypatch.setattr(module, "score_split", lambda *a, **k: (pd.DataFrame(), None))
        monkeypatch.setattr(module, "bootstrap_splits", bootstrap_splits)
    monkeypatch.setattr(registry_module, "ModelRegistry", Registry)
    return trained


def test_privacy_bench_has_a_dsfl_row_per_epsilon_at_the_same_delta(stubbed, tmp_path):
    bench = privacy.run_privacy_bench(None, tmp_path, (3.0, math.inf), data=tmp_path, overrides={"dp-delta": 1e-4})
    dsfl = [f for f in stubbed if f["aggregation"] == "dsfl"]
    assert [f["name"] for f in dsfl] == ["eps3-dsfl", "inf-dsfl"]
    assert dsfl[0]["dsfl-target-epsilon"] == 3.0 and dsfl[0]["dsfl-noise"] and not dsfl[1]["dsfl-noise"]
    assert all(f["dsfl-delta"] == 1e-4 and not f["dp-enabled"] for f in dsfl)
    assert [r.name for r in bench.runs] == ["ε=3", "ε=∞ (DP off)", "ε=3, DSFL", "ε=∞ (DP off), DSFL"]
    md = bench.to_markdown()
    card = CARDS["dsfl"]
    assert (f"| ε=3, DSFL | Laplace | {math.sqrt(2) * 2:.4f} / {math.sqrt(2) * 4:.4f} | "
            f"{card['epsilon_bank']:.3f} (per cardholder {card['epsilon']:.3f}) |") in md
    assert "DSFL rows (`aggregation: dsfl`" in md
    # the demo's default is chosen on the project's ladder only
    assert bench.choose_default()[0] in (3.0, math.inf)
    assert len(stubbed) == 4  # nothing else trained
    stubbed.clear()
    privacy.run_privacy_bench(None, tmp_path, (3.0,), data=tmp_path, dsfl=False)
    assert [f["aggregation"] for f in stubbed] == ["fedavg"]


def test_adversary_bench_has_dsfl_rows_with_and_without_the_malicious_bank(stubbed, tmp_path):
    bench = adversary.run_adversary_bench(None, tmp_path, ("multikrum", "dsfl"), ("", "scale:-10"), (3.0, math.inf),
                                          data=tmp_path)
    dsfl = [f for f in stubbed if f["aggregation"] == "dsfl"]
    assert sorted((f["attack-mode"], f.get("dsfl-target-epsilon", 0.0)) for f in dsfl) == [
        ("", 0.0), ("", 3.0), ("scale:-10", 0.0), ("scale:-10", 3.0)]
    assert not any(f["dp-enabled"] for f in dsfl) and all(f["dp-enabled"] for f in stubbed
                                                          if f["aggregation"] == "multikrum" and "eps3" in f["name"])
    names = [r.name for r in bench.runs]
    assert "dsfl, scale:-10, DP ε=3" in names and "dsfl, none, DP off" in names
    md = bench.to_markdown()
    assert "DSFL: no federated.dp" in md and "dsfl" in md

"""The promotion policy on labelled champion/challenger pairs: promote only beyond the interval."""

from __future__ import annotations

import numpy as np
import pytest

from fedfraud.feature_store.outcomes import OutcomeStore
from fedfraud.training.registry import ModelRegistry
from fedfraud.training.retrain.config import RetrainConfig
from fedfraud.training.retrain.policy import decide_promotion

CFG = RetrainConfig(min_frauds=20, bootstrap_reps=200)


def _registry(tmp_path) -> ModelRegistry:
    reg = ModelRegistry(tmp_path / "registry")
    for kind in ("anomaly", "fraud"):
        for _ in range(2):
            with reg.publish(kind, config={}) as staging:
                (staging / "weights.bin").write_bytes(b"x")
        reg.set_alias(kind, "champion", 1, actor="test", reason="first")
        reg.set_alias(kind, "challenger", 2, actor="test", reason="retrain")
    return reg


def _outcomes(tmp_path, n: int, frauds: int, challenger_gain: float, seed: int = 0):
    """``n`` labelled transactions of n/4 cardholders; both models see the label through noise, the challenger
    with ``challenger_gain`` more signal."""
    rng = np.random.default_rng(seed)
    y = np.zeros(n, bool)
    y[rng.choice(n, frauds, replace=False)] = True
    champion = y * 1.0 + rng.normal(0, 1.0, n)
    challenger = y * (1.0 + challenger_gain) + rng.normal(0, 1.0, n)
    path = tmp_path / "outcomes.sqlite"
    with OutcomeStore(path) as store:
        store.apply(
            shadow=[{"transaction_id": f"t{i}", "cardholder": f"c{i % (n // 4)}", "fraud_model": "fraud:v2",
                     "anomaly_model": "anomaly:v2", "score": float(challenger[i]), "anomaly_score": None,
                     "champion_fraud_model": "fraud:v1", "champion_score": float(champion[i]), "scored_us": 0}
                    for i in range(n)],
            labels=[{"transaction_id": f"t{i}", "is_fraud": int(y[i]), "labelled_at": None, "source": "test",
                     "received_us": 0} for i in range(n)],
        )
    return path


def test_waits_for_enough_labelled_frauds(tmp_path):
    reg = _registry(tmp_path)
    decision = decide_promotion(reg.root, _outcomes(tmp_path, 400, 10, 3.0), CFG)
    assert decision.action == "wait" and "10 labelled frauds" in decision.reason
    assert reg.aliases("fraud") == {"champion": 1, "challenger": 2}  # nothing moved


def test_a_clearly_better_challenger_is_promoted_with_its_evidence(tmp_path):
    reg = _registry(tmp_path)
    decision = decide_promotion(reg.root, _outcomes(tmp_path, 2000, 80, 3.0), CFG, actor="policy-test")
    assert decision.action == "promote", decision.reason
    pr = decision.evidence["pr_auc"]
    assert pr["difference_95ci"][0] > 0 and pr["challenger"] > pr["champion"]
    for kind in ("anomaly", "fraud"):
        assert reg.aliases(kind) == {"champion": 2}
        last = [e for e in reg.audit(kind) if e["alias"] == "champion"][-1]
        assert last["actor"] == "policy-test" and last["evidence"]["frauds"] == 80


@pytest.mark.parametrize("gain", [0.0, -1.0])
def test_an_equal_or_worse_challenger_is_retired_and_the_champion_stays(tmp_path, gain):
    reg = _registry(tmp_path)
    decision = decide_promotion(reg.root, _outcomes(tmp_path, 2000, 80, gain, seed=3), CFG)
    assert decision.action == "keep" and decision.reason.startswith("champion kept")
    for kind in ("anomaly", "fraud"):
        assert reg.aliases(kind) == {"champion": 1}
        assert reg.audit(kind)[-1]["reason"] == decision.reason


def test_dry_run_moves_nothing(tmp_path):
    reg = _registry(tmp_path)
    decision = decide_promotion(reg.root, _outcomes(tmp_path, 2000, 80, 3.0), CFG, apply=False)
    assert decision.action == "promote"
    assert reg.aliases("fraud") == {"champion": 1, "challenger": 2}

"""The aggregation rule and attack switch as settings, and the DP sensitivity bounds of the robust rules."""

import math

import numpy as np
import pytest
from flwr.serverapp.strategy import FedMedian, FedTrimmedAvg, Krum, MultiKrum
from flwr.serverapp.strategy.fedtrimmedavg import trim_mean

from fedfraud.core.errors import ConfigError
from fedfraud.training.federated.config import FederatedConfig
from fedfraud.training.federated.strategy import aggregator, dp_sensitivity_factor
from fedfraud.training.anomaly.federated.task import RunSettings


def test_rule_and_attack_travel_as_run_keys():
    s = RunSettings.from_flat({"aggregation": "krum", "byzantine-banks": 2, "attack-mode": "scale:-10",
                               "attack-bank": 3})
    fed = s.federated
    assert fed.aggregation == "krum" and fed.byzantine_banks == 2
    assert fed.attack.scale == -10.0 and fed.attack.bank == 3
    assert RunSettings.from_flat(s.to_flat()) == s
    assert RunSettings.from_flat({"attack-mode": "flip-targets"}).federated.attack.scale is None
    assert RunSettings.defaults()["attack-mode"] == "" and RunSettings.defaults()["aggregation"] == "multikrum"
    with pytest.raises(ConfigError, match="attack-mode"):
        RunSettings.from_flat({"attack-mode": "scale:lots"})
    with pytest.raises(ConfigError, match="aggregation"):
        RunSettings.from_flat({"aggregation": "bulyan"})


def test_each_rule_is_flowers_message_api_strategy():
    assert aggregator(FederatedConfig(aggregation="fedavg"), 5, "num-examples") is None  # FedProx's own mean
    kinds = {"fedmedian": FedMedian, "fedtrimmedavg": FedTrimmedAvg, "krum": Krum, "multikrum": MultiKrum}
    for name, kind in kinds.items():
        rule = aggregator(FederatedConfig(aggregation=name), 5, "equal-weight")
        assert type(rule) is kind and rule.weighted_by_key == "equal-weight"
    multi = aggregator(FederatedConfig(aggregation="multikrum", byzantine_banks=1), 5, "num-examples")
    assert multi.num_nodes_to_select == 4 and multi.num_malicious_nodes == 1
    # two banks: n − f = 1 would release one bank's update as the model; MultiKrum averages both instead
    assert aggregator(FederatedConfig(aggregation="multikrum"), 2, "num-examples").num_nodes_to_select == 2
    assert aggregator(FederatedConfig(aggregation="multikrum", multikrum_keep=1), 3, "n").num_nodes_to_select == 2


def _ball(rng: np.random.Generator, n: int, d: int, c: float) -> np.ndarray:
    """n updates with L2 norm exactly c: random directions, and some sharing one sign pattern (the median's worst)."""
    x = rng.normal(size=(n, d))
    x[: n // 2 + 1] = np.abs(x[: n // 2 + 1]) * rng.choice([-1, 1], size=d)
    return c * x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("n", [3, 4, 5, 8])
def test_robust_outputs_stay_in_the_ball_the_noise_is_sized_for(n):
    """Each rule's output norm must not exceed half its sensitivity bound (the bound is two outputs apart)."""
    rng = np.random.default_rng(n)
    c = 1.0
    for _ in range(50):
        x = _ball(rng, n, 200, c)
        median = FederatedConfig(aggregation="fedmedian")
        assert np.linalg.norm(np.median(x, axis=0)) <= dp_sensitivity_factor(median, n) * c / n / 2 + 1e-9
        trimmed = FederatedConfig(aggregation="fedtrimmedavg", trim_beta=0.2)
        assert np.linalg.norm(trim_mean(x, 0.2)) <= dp_sensitivity_factor(trimmed, n) * c / n / 2 + 1e-9
        for rule in ("krum", "multikrum"):  # a mean of some of the updates
            k = rng.integers(1, n + 1)
            assert np.linalg.norm(x[:k].mean(axis=0)) <= dp_sensitivity_factor(
                FederatedConfig(aggregation=rule), n) * c / n / 2 + 1e-9
    assert dp_sensitivity_factor(FederatedConfig(aggregation="fedavg"), n) == 1.0
    assert dp_sensitivity_factor(FederatedConfig(aggregation="fedmedian"), n) == pytest.approx(2 * math.sqrt(2) * n)

"""The client-level DP accountant: composition over rounds, calibration, and the card it writes."""

import math

import dp_accounting
import pytest

from fedfraud.training.federated.accountant import (
    DPRound,
    dp_card,
    epsilon_spent,
    gaussian_epsilon,
    noise_for_epsilon,
    plan_noise,
)
from fedfraud.training.federated.config import DPConfig
from fedfraud.training.federated.strategy import banks_per_round


def test_epsilon_grows_with_rounds_and_shrinks_with_noise():
    eps = [gaussian_epsilon(1.0, t, 1e-5) for t in (1, 2, 5, 10, 50, 200)]
    assert all(a < b for a, b in zip(eps, eps[1:], strict=False))
    by_noise = [gaussian_epsilon(z, 10, 1e-5) for z in (0.5, 1.0, 2.0, 8.0)]
    assert all(a > b for a, b in zip(by_noise, by_noise[1:], strict=False))
    assert gaussian_epsilon(1.0, 0, 1e-5) == 0.0
    assert gaussian_epsilon(0.0, 3, 1e-5) == math.inf  # a round released without noise


def test_known_value_and_analytic_bounds():
    # dp-accounting 0.6 RDP, z = 1, 10 rounds, δ = 1e-5 (pinned)
    assert gaussian_epsilon(1.0, 10, 1e-5) == pytest.approx(19.0536, abs=1e-3)
    for z, t in ((1.0, 10), (2.0, 200), (5.0, 10)):
        eps = gaussian_epsilon(z, t, 1e-5)
        # T Gaussian releases = one Gaussian of multiplier z/√T: the exact ε is a lower bound of any accountant
        exact = dp_accounting.get_epsilon_gaussian(z / math.sqrt(t), 1e-5)
        # the classic RDP → (ε, δ) conversion is an upper bound of dp-accounting's tighter one
        classic = min(t * a / (2 * z * z) + math.log(1e5) / (a - 1) for a in (1 + x / 100 for x in range(1, 100_000)))
        assert exact <= eps <= classic + 1e-9
        assert eps < 1.15 * exact  # and close to exact


def test_sampling_lowers_epsilon():
    assert gaussian_epsilon(1.0, 100, 1e-5, sampling_rate=0.1) < gaussian_epsilon(1.0, 100, 1e-5)
    with pytest.raises(ValueError, match="sampling_rate"):
        gaussian_epsilon(1.0, 10, 1e-5, sampling_rate=0.0)


@pytest.mark.parametrize("target,rounds", [(1.0, 10), (3.0, 10), (8.0, 200)])
def test_calibrated_noise_meets_the_target(target, rounds):
    z = noise_for_epsilon(target, rounds, 1e-5)
    eps = gaussian_epsilon(z, rounds, 1e-5)
    assert eps <= target and eps > 0.99 * target


def test_calibration_counts_rounds_already_spent():
    fresh = noise_for_epsilon(3.0, 5, 1e-5)
    spent = [6.0] * 5
    z = noise_for_epsilon(3.0, 5, 1e-5, spent=spent)
    assert z > fresh
    assert epsilon_spent([*spent, *[z] * 5], 1e-5) <= 3.0
    with pytest.raises(ValueError, match="budget is spent"):
        noise_for_epsilon(1.0, 5, 1e-5, spent=[0.5] * 20)
    with pytest.raises(ValueError, match="budget is spent"):
        noise_for_epsilon(1.0, 5, 1e-5, spent=[0.0])  # a round without noise spends everything


def test_plan_noise_from_config():
    assert plan_noise(DPConfig(enabled=False), 10) == 0.0
    assert plan_noise(DPConfig(enabled=True, noise_multiplier=1.3), 10) == 1.3
    z = plan_noise(DPConfig(enabled=True, target_epsilon=8.0, delta=1e-6), 10)
    assert gaussian_epsilon(z, 10, 1e-6) <= 8.0


def test_card_says_on_partial_or_off():
    on = dp_card([DPRound(1.2, 0.5, 5)] * 4, 1e-5, 5)
    assert on["dp"] == "on" and on["epsilon"] == pytest.approx(gaussian_epsilon(1.2, 4, 1e-5))
    assert on["noise_std"] == [pytest.approx(1.2 * 0.5 / 5)] and on["unit_of_privacy"].startswith("one bank")
    mixed = dp_card([DPRound(1.2, 0.5, 5), DPRound(0.0, 0.0, 5)], 1e-5, 5)
    assert mixed["dp"].startswith("partial: 1 of 2 rounds") and mixed["epsilon"] == math.inf
    off = dp_card([{"noise_multiplier": 0.0, "clipping_norm": 0.0, "banks": 5}], 1e-5, 5)
    assert off["dp"] == "off" and "no differential-privacy guarantee" in off["epsilon"]


def test_banks_per_round_follows_fedavg_sampling():
    assert banks_per_round(5, 1.0) == 5
    assert banks_per_round(5, 0.6) == 3
    assert banks_per_round(5, 0.1) == 1

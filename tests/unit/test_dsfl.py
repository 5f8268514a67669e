"""DSFL (aggregation: dsfl): contribution weights and per-dimension noise on hand-made numbers, and its accountant."""

import json
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

from fedfraud.core.errors import ConfigError
from fedfraud.training.anomaly.federated.task import RunSettings
from fedfraud.training.federated.accountant import _ORDERS
from fedfraud.training.federated.config import DSFLConfig, FederatedConfig
from fedfraud.training.federated.dsfl import (
    DSFLAggregate,
    calibrate,
    contribution_errors,
    contribution_weights,
    dsfl_card,
    dsfl_epsilon,
    flat_update,
    laplace_rdp,
    noise_scales,
    privatize,
    select_top,
    unflatten,
)
from fedfraud.training.federated.strategy import aggregator, dp_sensitivity_factor


def test_errors_and_weights_on_hand_made_updates():
    # median of the three is (3, 4): cosines 1, 24/25, 20/25 → errors 0, 0.02, 0.1
    updates = np.array([[3.0, 4.0], [4.0, 3.0], [0.0, 5.0]])
    np.testing.assert_allclose(contribution_errors(updates), [0.0, 0.02, 0.1], atol=1e-12)
    # α = ½ ln((1 − err)/err), err floored at 1e-3: ½ ln 999, ½ ln 49 = ln 7, ½ ln 9 = ln 3
    alpha = np.array([0.5 * math.log(999), math.log(7), math.log(3)])
    np.testing.assert_allclose(contribution_weights(contribution_errors(updates)), alpha / alpha.sum())
    kept = np.array([alpha[0], alpha[1], 0.0])
    np.testing.assert_allclose(contribution_weights(contribution_errors(updates), keep=2), kept / kept.sum())
    # a bank pointing away from the others (a sign-flipped, scaled update) has error 1: weight 0
    flipped = np.array([[1.0, 2.0], [1.2, 1.8], [-50.0, -100.0]])
    np.testing.assert_allclose(contribution_weights(contribution_errors(flipped))[2], 0.0)
    # nobody better than chance: no weights, the round is not released
    assert not contribution_weights(np.array([0.5, 0.7])).any()


def test_selection_and_noise_per_dimension_on_hand_made_numbers():
    cfg = DSFLConfig(epsilon_select=1e6, epsilon_top=4.0, epsilon_rest=0.5, top_fraction=0.4, l1_clip=1.0)
    assert noise_scales(cfg) == (0.25, 2.0)  # C₁/ε₂, C₁/ε₃
    g = np.array([0.2, -1.0, 0.4, 0.1, -0.3])  # L1 = 2: clipped to half
    clipped = g / 2
    # ε₁ this large makes the exponential mechanism the exact top-m (m = 0.4·5 = 2): coordinates 1 and 2
    mask = select_top(clipped, cfg, np.random.default_rng(0))
    assert mask.tolist() == [False, True, True, False, False]
    noised, mask = privatize(g, cfg, np.random.default_rng(7))
    rng = np.random.default_rng(7)
    rng.gumbel(size=5)  # the same draws, in the same order: Gumbel keys, then one Laplace(1) per coordinate
    expected = clipped + rng.laplace(0.0, 1.0, size=5) * np.array([2.0, 0.25, 0.25, 2.0, 2.0])
    np.testing.assert_allclose(noised, expected)


def test_noise_scale_per_group_on_many_coordinates():
    cfg = DSFLConfig(epsilon_select=0.1, epsilon_top=2.0, epsilon_rest=0.25, top_fraction=0.3, l1_clip=0.5)
    noised, mask = privatize(np.zeros(200_000), cfg, np.random.default_rng(3))
    assert mask.sum() == 60_000
    for group, scale in ((mask, 0.25), (~mask, 2.0)):  # mean |Laplace(b)| = b
        assert np.abs(noised[group]).mean() == pytest.approx(scale, rel=0.02)


def test_flat_update_round_trip_keeps_non_float_tensors():
    received = {"w": np.ones((2, 2), np.float32), "n": np.array([3], np.int64), "b": np.zeros(3, np.float32)}
    trained = {"w": np.full((2, 2), 1.5, np.float32), "n": np.array([4], np.int64), "b": np.ones(3, np.float32)}
    flat = flat_update(trained, received)
    np.testing.assert_allclose(flat, [0.5] * 4 + [1.0] * 3)
    back = unflatten(flat, received)
    np.testing.assert_allclose(back["w"], trained["w"]) and np.testing.assert_allclose(back["b"], trained["b"])
    assert back["n"].tolist() == [3] and back["w"].dtype == np.float32


@pytest.mark.parametrize("ratio", [0.05, 0.7, 3.0])
def test_laplace_rdp_is_dp_accountings(ratio):
    for order in (1.5, 2.0, 8.0, 64.0):
        accountant = RdpAccountant([order])
        accountant.compose(dp_accounting.LaplaceDpEvent(1.0 / ratio))
        assert laplace_rdp(ratio, order) == pytest.approx(float(accountant._rdp[0]), rel=1e-9)


def test_unequal_scales_are_bounded_by_the_smallest_scale():
    """Σ_j f(|v_j|/b_j) ≤ f(‖v‖₁/b_min): the superadditivity the accountant rests on, on random splits."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        v = rng.dirichlet(np.ones(6)) * rng.uniform(0.1, 3.0)
        b = rng.choice([0.5, 2.0], size=6)
        for order in (2.0, 16.0):
            assert sum(laplace_rdp(x, order) for x in v / b) <= laplace_rdp(v.sum() / b.min(), order) + 1e-12


def test_epsilon_of_a_dsfl_configuration():
    cfg = DSFLConfig(epsilon_select=0.1, epsilon_top=1.0, epsilon_rest=0.5, top_fraction=0.1, l1_clip=1.0)
    rounds, n, delta = 10, 1000, 1e-5
    # per round: Laplace RDP at shift max(ε₂, ε₃) = 1 and the selection's 100 draws, ε₁²/(2·100)-zCDP
    rdp = [rounds * (laplace_rdp(1.0, a) + min(0.1, a * 0.1**2 / 200)) for a in _ORDERS]
    expected = min(compute_epsilon(list(_ORDERS), rdp, delta)[0], rounds * 1.1)
    assert dsfl_epsilon(cfg, rounds, n, delta) == pytest.approx(expected)
    assert dsfl_epsilon(cfg, rounds, n, delta) == pytest.approx(10.0202, abs=1e-3)
    # per cardholder (any change to its bank's data): the Laplace shift doubles, the selection's does not
    rdp2 = [rounds * (laplace_rdp(2.0, a) + min(0.1, a * 0.1**2 / 200)) for a in _ORDERS]
    assert dsfl_epsilon(cfg, rounds, n, delta, "cardholder") == pytest.approx(
        min(compute_epsilon(list(_ORDERS), rdp2, delta)[0], rounds * 2.1))
    # every coordinate selected: no selection cost; then it is dp-accounting's own Laplace composition
    alltop = cfg.model_copy(update={"top_fraction": 1.0})
    accountant = RdpAccountant(list(_ORDERS))
    accountant.compose(dp_accounting.LaplaceDpEvent(1.0), rounds)
    assert dsfl_epsilon(alltop, rounds, n, delta) == pytest.approx(min(accountant.get_epsilon(delta), 10.0))
    assert dsfl_epsilon(cfg, 0, n, delta) == 0.0
    assert dsfl_epsilon(cfg.model_copy(update={"noise": False}), 3, n, delta) == math.inf


def test_calibration_meets_the_target_from_below():
    cfg = DSFLConfig(target_epsilon=3.0, delta=1e-5)
    got = calibrate(cfg, 20, 5000)
    spent = dsfl_epsilon(got, 20, 5000, 1e-5)
    assert spent <= 3.0 and spent == pytest.approx(3.0, rel=1e-6)
    # one factor: the ratios ε₁ : ε₂ : ε₃ stay
    assert got.epsilon_top / got.epsilon_rest == pytest.approx(2.0)
    assert got.epsilon_select / got.epsilon_top == pytest.approx(0.1)
    assert calibrate(DSFLConfig(), 20, 5000) == DSFLConfig()


def test_calibration_per_cardholder_spends_the_target_per_cardholder():
    """target_unit cardholder: the card's per-cardholder ε (the one compared with DP-SGD) is the target, so the
    noise is larger than for the same ε per bank."""
    per_card = calibrate(DSFLConfig(target_epsilon=8.0, target_unit="cardholder", delta=1e-5), 20, 5000)
    per_bank = calibrate(DSFLConfig(target_epsilon=8.0, delta=1e-5), 20, 5000)
    assert dsfl_epsilon(per_card, 20, 5000, 1e-5, "cardholder") == pytest.approx(8.0, rel=1e-6)
    assert dsfl_card(per_card, 20, 5000, 5)["epsilon"] == pytest.approx(8.0, rel=1e-6)
    assert per_card.epsilon_top < per_bank.epsilon_top


def test_card_states_both_units():
    cfg = DSFLConfig()
    card = dsfl_card(cfg, 4, 1000, 5)
    assert card["dp"] == "on" and card["noise"] == "dsfl" and card["unit_of_privacy"].startswith("one cardholder")
    assert card["epsilon"] == dsfl_epsilon(cfg, 4, 1000, 1e-5, "cardholder") > card["epsilon_bank"]
    assert card["laplace_scale"] == {"selected": 1.0, "other": 2.0} and card["selected_coordinates"] == 100
    assert dsfl_card(cfg.model_copy(update={"noise": False}), 4, 1000, 5)["dp"] == "off"


def test_dsfl_is_a_run_setting_and_refuses_bank_level_dp():
    s = RunSettings.from_flat({"aggregation": "dsfl", "dsfl-epsilon-top": 2.0, "dsfl-keep-banks": 3})
    assert s.federated.dsfl.epsilon_top == 2.0 and RunSettings.from_flat(s.to_flat()) == s
    rule = aggregator(s.federated, 5, "num-examples")
    assert isinstance(rule, DSFLAggregate) and rule.cfg.keep_banks == 3
    with pytest.raises(ConfigError, match="switch federated.dp off"):
        RunSettings.from_flat({"aggregation": "dsfl", "dp-enabled": True})
    with pytest.raises(ValueError, match="own noise"):
        dp_sensitivity_factor(FederatedConfig(aggregation="dsfl"), 5)


def test_public_slice_only_under_dsfl_and_not_with_dp_sgd(tmp_path):
    from fedfraud.training.anomaly.federated.task import public_slice

    assert public_slice(RunSettings.from_flat({"dsfl-public-cardholders": 8, "out-dir": str(tmp_path)}), 0) is None
    assert public_slice(RunSettings.from_flat({"aggregation": "dsfl", "out-dir": str(tmp_path)}), 0) is None
    assert not list(tmp_path.rglob("*"))  # nothing generated
    with pytest.raises(ConfigError, match="dsfl-public-cardholders with cardholder-level DP-SGD"):
        RunSettings.from_flat({"aggregation": "dsfl", "dsfl-public-cardholders": 8, "cardholder-dp-enabled": True})


def test_fraud_plan_calibrates_over_the_noised_float_coordinates_only():
    """The neural fraud variants' plan: the scaler the server set and integer arrays are not coordinates; the
    target ε per cardholder is met over the job's rounds, and the card names the side channels."""
    from flwr.app import Array, ArrayRecord

    from fedfraud.training.fraud.dsfl import DSFLPlan, float_coordinates

    arrays = ArrayRecord({"mean": Array(np.zeros(3, np.float32)), "w": Array(np.zeros((10, 50), np.float32)),
                          "b": Array(np.zeros(20, np.float32)), "steps": Array(np.zeros(2, np.int64))})
    assert float_coordinates(arrays) == 523 and float_coordinates(arrays, ("mean",)) == 520
    cfg = DSFLConfig(target_epsilon=8.0, target_unit="cardholder")
    plan = DSFLPlan.of(cfg, 12, arrays, ("mean",))
    assert plan.coordinates == 520 and plan.rounds == 12
    assert dsfl_epsilon(plan.cfg, 12, 520, cfg.delta, "cardholder") == pytest.approx(8.0, rel=1e-6)
    card = plan.card(3, "the prototypes leave the banks", ("mean",))
    assert card["epsilon"] == pytest.approx(8.0, rel=1e-6) and card["not_covered"].startswith("the prototypes")
    assert json.loads(plan.config()["dsfl"]) == json.loads(plan.cfg.model_dump_json())
    assert DSFLPlan.of(cfg.model_copy(update={"noise": False}), 12, arrays).card(3, "x")["dp"] == "off"

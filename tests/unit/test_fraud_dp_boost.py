"""The fraud model under cardholder-level DP (issue 36): random trees, noised leaf sums under Flower's SecAgg+.

The trees as XGBoost reads them, one cardholder's bounded effect on every release, the accountant, real SecAgg+
rounds over a loopback grid that serializes every message as the SuperLink would (each bank's contribution is its
clean vector plus a share with the configured std; the server decodes exactly their sum and sees only masks), the
published card, and the CLI's one-line error.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import GaussianDpEvent, SelfComposedDpEvent
from dp_accounting.rdp import RdpAccountant
from flwr.app import Context, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from fedfraud.training.anomaly.distributed_dp import ORDERS, decode_sum
from fedfraud.training.federated import secagg_prg
from fedfraud.training.federated.dp_fedsgd import NOISE_SEED_KEY, run_dp_fedsgd
from fedfraud.training.fraud.config import FraudConfig, FraudDPConfig
from fedfraud.training.fraud.dp_boost import (
    BoostServer,
    BoostState,
    RandomTree,
    bank_release,
    bank_vector,
    check_splits,
    own_history_columns,
    grid_edges,
    plan_boost,
    to_booster,
    train_dp_boost,
    train_dp_model,
)
from fedfraud.training.fraud.federated.dp_app import dp_boost_client_app
from fedfraud.training.fraud.features import FraudFeatures
from fedfraud.training.fraud.metrics import pr_auc
from fedfraud.training.fraud.model import FraudModel, to_dmatrix
from fedfraud.training.merchant_risk.dp import skellam_share
from fedfraud.training.merchant_risk.release_app import AuditGrid, read_audit
from fedfraud.training.registry import ModelRegistry
from tests.unit.test_merchant_release import _Loopback, masked_vectors

NAMES = ("amount", "count_24h", "ratio", "anomaly_score")
USED = ("amount", "count_24h", "ratio")
SMALL = FraudDPConfig(epsilon=8.0, trees=4, depth=2, candidates=7, threshold_bins=20)


def _bank(bank: int, cardholders: int = 40, rows: int = 12, seed: int = 0) -> FraudFeatures:
    """Cardholders with ``rows`` transactions each; a fraud is a large amount (the signal a tree can find)."""
    rng = np.random.default_rng([seed, bank])
    n = cardholders * rows
    holder = np.repeat([f"b{bank}c{i}" for i in range(cardholders)], rows).astype(object)
    fraud = rng.random(n) < 0.08
    amount = np.where(fraud, rng.uniform(400, 900, n), rng.lognormal(3.0, 0.8, n))
    X = np.stack([amount, rng.poisson(3, n).astype(float), rng.random(n), np.full(n, np.nan)], axis=1)
    X[rng.random(n) < 0.05, 1] = np.nan  # missing values go left
    split = np.array(["train", "train", "train", "valid", "test"], dtype=object)[np.arange(cardholders) % 5]
    return FraudFeatures(X.astype(np.float32), NAMES, np.array([f"t{bank}-{i}" for i in range(n)], dtype=object),
                         holder, fraud.astype(np.float32), np.repeat(split, rows))


@pytest.fixture(scope="module")
def banks() -> dict[int, FraudFeatures]:
    return {b: _bank(b) for b in range(3)}


def _plan(banks, cfg: FraudDPConfig = SMALL):
    n_train = sum(len(np.unique(f.cardholder[f.split == "train"])) for f in banks.values())
    n_valid = sum(len(np.unique(f.cardholder[f.split == "valid"])) for f in banks.values())
    return plan_boost(cfg, USED, len(banks), n_train, n_valid)


# ---- the trees as XGBoost reads them ----------------------------------------------------------------------------


def test_the_booster_routes_every_row_as_the_banks_do_missing_values_left():
    rng = np.random.default_rng(3)
    X = rng.normal(0, 2, (500, 3))
    X[rng.random((500, 3)) < 0.1] = np.nan
    trees = [RandomTree(rng.integers(0, 3, 7), rng.normal(0, 1, 7), rng.normal(0, 0.3, 8), rng.random(8) + 0.1)
             for _ in range(5)]
    state = BoostState(candidates=[np.zeros(1)] * 3, trees=trees)
    booster = to_booster(state, USED)
    import xgboost as xgb

    got = booster.predict(xgb.DMatrix(X.astype(np.float32), feature_names=list(USED), missing=np.nan),
                          output_margin=True)
    np.testing.assert_allclose(got, state.margin(X.astype(np.float32).astype(np.float64)), rtol=0, atol=1e-5)
    # SHAP reasons (serving's) work on these trees: contributions sum to the margin
    contribs = booster.predict(xgb.DMatrix(X[:20].astype(np.float32), feature_names=list(USED), missing=np.nan),
                               pred_contribs=True)
    np.testing.assert_allclose(contribs.sum(1), got[:20], atol=1e-4)


def test_a_row_exactly_at_a_split_goes_where_xgboost_sends_it():
    import xgboost as xgb

    edges = grid_edges()
    X = np.stack([edges, edges[::-1], edges], axis=1).astype(np.float32)  # every value on a candidate edge
    tree = RandomTree(np.array([0, 1, 2]), edges[[70, 60, 80]].astype(np.float32).astype(np.float64),
                      np.array([-1.0, -0.5, 0.5, 1.0]))
    state = BoostState(candidates=[edges] * 3, trees=[tree])
    got = to_booster(state, USED).predict(xgb.DMatrix(X, feature_names=list(USED), missing=np.nan),
                                          output_margin=True)
    np.testing.assert_allclose(got, state.margin(X.astype(np.float64)), atol=1e-6)


def test_the_candidates_are_float32_values_inside_the_data_and_noise_bins_are_dropped(banks):
    from fedfraud.training.fraud.dp_boost import candidate_thresholds

    plan = _plan(banks)
    state = BoostState.from_arrays(BoostServer(plan, seed=1).weights())
    clean = sum(bank_vector("candidates", f, plan, state)[0] for f in banks.values()) / plan.candidates.scale
    cands = candidate_thresholds(clean, plan, banks_summed=3)
    for c, col in zip(cands, range(len(USED)), strict=True):
        assert len(c) > 0 and np.array_equal(c.astype(np.float32).astype(np.float64), c)  # XGBoost's precision
        values = np.concatenate([f.X[f.split == "train", col] for f in banks.values()])
        assert np.nanmin(values) <= c.min() and c.max() <= np.nanmax(values) * 1.5  # within the data's range
    # pure noise (no cardholder): the cut passes a share P(N > cut·σ) of the bins, none at 4σ (p ≈ 3e-5 per bin)
    std = plan.candidates.noise_std / plan.candidates.scale
    noise = np.random.default_rng(0).normal(0, std, clean.shape)
    strict = _plan(banks, SMALL.model_copy(update={"candidate_cut": 4.0}))
    assert sum(len(c) for c in candidate_thresholds(noise, strict, banks_summed=3)) == 0
    assert sum(len(c) for c in candidate_thresholds(noise, plan, banks_summed=3)) > 0  # 1.5σ: ~7 % of the bins


def test_the_state_the_server_sends_round_trips():
    state = BoostState([np.array([1.0, 2.0]), np.empty(0), np.array([0.5])],
                       [RandomTree(np.array([0, 2, 0]), np.array([1.5, 0.5, 2.0]), np.arange(4.0))],
                       RandomTree(np.array([2, 0, 0]), np.array([0.5, 1.0, 2.0]), np.zeros(4)))
    back = BoostState.from_arrays(state.to_arrays())
    assert [c.tolist() for c in back.candidates] == [c.tolist() for c in state.candidates]
    assert len(back.trees) == 1 and back.pending is not None
    np.testing.assert_array_equal(back.trees[0].leaves, np.arange(4.0))
    np.testing.assert_array_equal(back.pending.features, [2, 0, 0])
    assert back.next_release(3) == "tree" and BoostState().next_release(3) == "candidates"


# ---- one cardholder's effect on every release --------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["candidates", "tree", "threshold"])
def test_one_cardholder_moves_a_banks_clean_vector_by_at_most_the_sensitivity(banks, kind):
    plan = _plan(banks)
    server = BoostServer(plan, seed=1)
    data = banks[0]
    # bring the server to the release under test with real (noised) sums
    while server.kind() != kind:
        state = BoostState.from_arrays(server.weights())
        res = [bank_release(banks[b], plan, state, np.random.default_rng([9, b]))[0] for b in banks]
        server.apply(np.mod(np.sum(res, axis=0), plan.trees.modulus), len(banks))
    state = BoostState.from_arrays(server.weights())
    target = {"candidates": plan.candidates, "tree": plan.trees, "threshold": plan.threshold}[kind]
    split = "valid" if kind == "threshold" else "train"
    full, holders, _ = bank_vector(kind, data, plan, state)
    assert holders == len(np.unique(data.cardholder[data.split == split])) and np.abs(full).sum() > 0
    for who in np.unique(data.cardholder[data.split == split])[:6]:
        without, _, _ = bank_vector(kind, data.subset(data.cardholder != who), plan, state)
        delta = (full - without).astype(np.float64)
        assert 0 < np.linalg.norm(delta) <= target.l2 + 1e-9
        assert np.abs(delta).sum() <= target.l1 + 1e-9
    # a cardholder of another split changes nothing (test, and the other of training / validation)
    for other_split in ("test", "train" if kind == "threshold" else "valid"):
        other = data.cardholder[data.split == other_split][0]
        same, _, _ = bank_vector(kind, data.subset(data.cardholder != other), plan, state)
        np.testing.assert_array_equal(same, full)


def _flipped(data: FraudFeatures, keep: str) -> FraudFeatures:
    """``data`` with every label outside the split ``keep`` flipped."""
    return FraudFeatures(data.X, data.names, data.transaction_id, data.cardholder,
                         np.where(data.split == keep, data.label, 1 - data.label).astype(np.float32), data.split)


def test_labels_reach_only_the_release_of_their_own_split(banks):
    plan = _plan(banks)
    server = BoostServer(plan, seed=1)
    data = banks[1]
    seen = {}
    while server.kind() is not None:
        kind = server.kind()
        state = BoostState.from_arrays(server.weights())
        keep = "valid" if kind == "threshold" else "train"
        clean = bank_vector(kind, data, plan, state)[0]
        np.testing.assert_array_equal(clean, bank_vector(kind, _flipped(data, keep), plan, state)[0])
        seen[kind] = clean
        res = [bank_release(banks[b], plan, state, np.random.default_rng([4, b]))[0] for b in banks]
        server.apply(np.mod(np.sum(res, axis=0), plan.trees.modulus), len(banks))
    assert set(seen) == {"candidates", "tree", "threshold"}
    # ... and a release does read its own split's labels
    state = BoostState.from_arrays(server.weights())
    state.pending, state.trees = server.state.trees[0], []
    assert not np.array_equal(bank_vector("tree", data, plan, state)[0],
                              bank_vector("tree", _flipped(data, "valid"), plan, state)[0])


def test_a_bank_refuses_missing_labels_and_a_cardholder_in_two_splits(banks):
    plan = _plan(banks)
    server = BoostServer(plan, seed=1)
    state = BoostState.from_arrays(server.weights())
    res = [bank_release(banks[b], plan, state, np.random.default_rng([4, b]))[0] for b in banks]
    server.apply(np.mod(np.sum(res, axis=0), plan.trees.modulus), len(banks))
    state = BoostState.from_arrays(server.weights())
    data = banks[0]
    label = data.label.copy()
    label[np.flatnonzero(data.split == "train")[0]] = np.nan
    unlabelled = FraudFeatures(data.X, data.names, data.transaction_id, data.cardholder, label, data.split)
    with pytest.raises(ValueError, match="label on every row"):
        bank_vector("tree", unlabelled, plan, state)
    split = data.split.copy()
    split[np.flatnonzero(data.split == "train")[0]] = "valid"  # one row of a training cardholder in validation
    with pytest.raises(ValueError, match="training and validation"):
        check_splits(FraudFeatures(data.X, data.names, data.transaction_id, data.cardholder, data.label, split))


# ---- the accountant ----------------------------------------------------------------------------------------------


def test_calibration_meets_epsilon_and_is_no_tighter_than_the_gaussian_it_extends(banks):
    for eps in (1.0, 8.0):
        plan = _plan(banks, SMALL.model_copy(update={"epsilon": eps}))
        assert plan.epsilon_training() <= eps * (1 + 1e-3)
        assert plan.epsilon_training() >= 0.95 * eps  # calibrated, not loose
        assert plan.epsilon_validation() <= eps * (1 + 1e-3)
        # the Skellam RDP of the same releases is at least the Gaussian's at the same z (dp-accounting)
        acc = RdpAccountant([float(a) for a in ORDERS])
        acc.compose(GaussianDpEvent(plan.candidates.noise_multiplier))
        acc.compose(SelfComposedDpEvent(GaussianDpEvent(plan.trees.noise_multiplier), SMALL.trees))
        assert acc.get_epsilon(SMALL.delta) <= plan.epsilon_training() + 1e-9
    tight = _plan(banks, SMALL.model_copy(update={"epsilon": 1.0}))
    loose = _plan(banks, SMALL.model_copy(update={"epsilon": 8.0}))
    assert tight.trees.noise_multiplier > loose.trees.noise_multiplier > 0
    assert tight.candidates.noise_multiplier == pytest.approx(tight.trees.noise_multiplier
                                                              * SMALL.candidate_noise_ratio)


# ---- real SecAgg+ rounds ------------------------------------------------------------------------------------------


@pytest.fixture
def task_identity(monkeypatch):
    """The process-wide identity Flower's ServerApp runtime sets before a ServerApp creates messages."""
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)
    monkeypatch.setattr(TaskIdentity, "_run_id", 7)
    monkeypatch.setattr(TaskIdentity, "_node_id", SUPERLINK_NODE_ID)


SEEDS = {9001: 3, 9017: 5, 9034: 8}  # node id -> the bank's test-only noise seed


def test_secagg_releases_carry_each_banks_clean_vector_plus_its_share_and_the_server_sees_only_masks(
    banks, tmp_path, task_identity
):
    plan = _plan(banks)
    rounds = SMALL.trees + 2
    nodes = list(SEEDS)
    seen: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    app = dp_boost_client_app(lambda ctx: (banks[nodes.index(ctx.node_id)], plan),
                              observer=lambda node, step, clean, noise: seen.__setitem__((node, step), (clean, noise)))
    contexts = {node: Context(7, node, {NOISE_SEED_KEY: SEEDS[node]}, RecordDict(), {}) for node in nodes}
    server = BoostServer(plan, seed=11)
    audit = tmp_path / "audit"
    strategy = run_dp_fedsgd(AuditGrid(_Loopback(app, contexts), audit), Context(7, 0, {}, RecordDict(), {}), server,
                             rounds)
    assert not strategy.refused and len(strategy.sums) == rounds
    assert len(server.state.trees) == SMALL.trees and server.state.threshold is not None

    replay = BoostServer(plan, seed=11)  # the in-process arithmetic (what the bench trains with), same seeds
    replies = read_audit(audit)
    per_round = len(replies) // rounds
    for step in range(1, rounds + 1):
        kind = replay.kind()
        target = {"candidates": plan.candidates, "tree": plan.trees, "threshold": plan.threshold}[kind]
        state = BoostState.from_arrays(replay.weights())
        truth = np.zeros(target.dims, dtype=np.int64)
        for b, node in enumerate(nodes):
            clean, noise = seen[(node, step)]
            np.testing.assert_array_equal(clean, bank_vector(kind, banks[b], plan, state)[0])
            np.testing.assert_array_equal(noise, skellam_share((target.dims,), target.share_variance,
                                                               np.random.default_rng([SEEDS[node], step])))
            truth += clean + noise
        # the shares together carry the configured std: σ²/t per bank and coordinate
        shares = np.concatenate([seen[(node, step)][1] for node in nodes]).astype(np.float64)
        std = math.sqrt(target.share_variance)
        assert abs(shares.std() - std) < 6 * std / math.sqrt(2 * shares.size)
        np.testing.assert_array_equal(decode_sum(strategy.sums[step - 1], target), truth)
        replay.apply(np.mod(truth, target.modulus), len(nodes))
        # every reply the server received in this round is masked: no bank's clean vector or residues in clear
        part = replies[(step - 1) * per_round : step * per_round]
        assert len(part) == 4 * len(nodes)  # SecAgg+'s four stages
        for msg in part:
            assert all(not record for record in msg.content.array_records.values())
        masked = masked_vectors(part)
        assert set(masked) == set(nodes)
        for node, u in masked.items():
            clean, noise = seen[(node, step)]
            assert u.shape == clean.shape and u.max() >= (1 << 31)
            for plain in (clean, np.mod(clean + noise, target.modulus)):
                assert np.mean(u == plain) < 0.1
    for a, b in zip(server.state.trees, replay.state.trees, strict=True):
        np.testing.assert_array_equal(a.leaves, b.leaves)
    assert server.state.threshold == replay.state.threshold


def test_a_bank_refuses_a_malformed_state_and_a_replayed_release(banks):
    from flwr.app import ConfigRecord

    from fedfraud.training.fraud.federated.dp_app import RELEASES_KEY, ReleaseRefused, _Bank

    plan = _plan(banks)
    context = Context(7, 9001, {NOISE_SEED_KEY: 3}, RecordDict(), {})
    bank = _Bank(banks[0], plan, context, None)
    first = BoostServer(plan, seed=1).weights()
    prg = secagg_prg.fit_config()  # what the server's DPFedSGDStrategy sends with every release
    with pytest.raises(ReleaseRefused, match="^release not in the plan$"):
        bank.fit(first, {})  # a server that does not name fedfraud's SecAgg+ mask generator
    residues, weight, metrics = bank.fit(first, prg)
    assert weight == 1 and metrics == {} and residues[0].shape == (plan.candidates.dims,)
    with pytest.raises(ReleaseRefused, match="^release not in the plan$"):
        bank.fit(first, prg)  # the same release again: refused, the budget is spent
    assert context.state.config_records[RELEASES_KEY] == ConfigRecord({"candidates": 1, "tree": 0, "threshold": 0})
    # a tree with a leaf array too short for its depth: refused before the data is read, with a fixed message
    bad = BoostState([np.array([1.0, 50.0])] * 3, [], RandomTree(np.array([0, 0, 0]), np.array([1.0, 2.0, 3.0]),
                                                                  np.zeros(2)))
    for arrays in (bad.to_arrays(), [np.array([1, 2, 3], dtype=np.uint8)]):
        with pytest.raises(ReleaseRefused, match="^malformed state from the server$"):
            bank.fit(arrays, prg)
    # trees: the first one, then the same tree again (refused); a bank that missed tree 1 may release tree 2
    server = BoostServer(plan, seed=1)
    server.apply(np.mod(sum(bank_release(banks[b], plan, BoostState.from_arrays(server.weights()),
                                         np.random.default_rng(b))[0] for b in banks), plan.trees.modulus), 3)
    tree0 = server.weights()
    bank.fit(tree0, prg)
    with pytest.raises(ReleaseRefused, match="^release not in the plan$"):
        bank.fit(tree0, prg)
    for _ in range(2):  # trees 0 and 1 filled without this bank
        state = BoostState.from_arrays(server.weights())
        server.apply(np.mod(sum(bank_release(banks[b], plan, state, np.random.default_rng(b))[0]
                                for b in (1, 2)), plan.trees.modulus), 2 if plan.trees.survivors <= 2 else 3)
    assert len(server.state.trees) == 2
    bank.fit(server.weights(), prg)
    assert context.state.config_records[RELEASES_KEY]["tree"] == 2


# ---- the model and its card ---------------------------------------------------------------------------------------


def test_a_published_dp_model_states_its_guarantee_and_scores_like_its_trees(banks, tmp_path):
    cfg = FraudConfig(variant="federated-dp", use_anomaly_score=False,
                      dp=FraudDPConfig(epsilon=1e6, trees=30, depth=3, eta=0.5, reg_lambda=1.0))
    model = train_dp_model(banks, cfg)
    test = FraudFeatures.concat([f.of_split("test") for f in banks.values()])
    # the large-amount signal, found by random trees (the base rate, a model that knows nothing, is about 0.08)
    assert pr_auc(test.label, model.scores(test.X)) > 0.7
    version = model.publish(ModelRegistry(tmp_path), config={}, metrics={})
    privacy = version.privacy
    assert privacy["client_dp"]["dp"] == "on" and privacy["client_dp"]["epsilon"] <= 1e6 * (1 + 1e-3)
    assert not privacy["formal_guarantee"].startswith("none")
    back = FraudModel.from_registry(tmp_path)
    np.testing.assert_allclose(back.scores(test.X), model.scores(test.X), atol=1e-6)
    decisions = back.predict_batch(test.X[:5], top_k=2)
    assert all(len(d.top_reasons) == 2 for d in decisions)
    small = train_dp_model(banks, cfg.model_copy(update={"dp": SMALL}))
    card = small.meta["client_dp"]
    assert card["epsilon"] <= SMALL.epsilon * (1 + 1e-3) and card["delta"] == SMALL.delta
    assert card["releases"] == SMALL.trees + 2


def test_a_dp_model_reads_only_columns_of_the_cardholders_own_history():
    names = ("amount", "tx_count_24h", "merchant_new", "merchant_visits", "mcc_transition_surprise",
             "anomaly_score", "merchant_bank_frauds_21d", "merchant_fed_frauds_21d")
    assert own_history_columns(names) == ("amount", "tx_count_24h", "merchant_new", "merchant_visits")


def test_only_a_simulation_seeds_the_noise_and_two_banks_are_refused(banks):
    a, _ = train_dp_boost(banks, SMALL, USED, seed=5, noise_seed=5)
    b, log = train_dp_boost(banks, SMALL, USED, seed=5, noise_seed=5)
    assert all(np.array_equal(x.leaves, y.leaves) for x, y in zip(a.state.trees, b.state.trees, strict=True))
    assert log["noise"] == "seeded (5): not a guarantee"
    # without a noise seed (what a published model uses) the noise comes from OS entropy: no seed reproduces it
    c, log = train_dp_boost(banks, SMALL, USED, seed=5)
    d, _ = train_dp_boost(banks, SMALL, USED, seed=5)
    assert log["noise"] == "OS entropy"
    assert not np.array_equal(c.state.trees[0].leaves, d.state.trees[0].leaves)
    with pytest.raises(ValueError, match="3 banks"):
        train_dp_model({0: banks[0], 1: banks[1]}, FraudConfig(dp=SMALL))
    assert len(grid_edges()) == 129 and np.all(np.diff(grid_edges()) > 0)
    test = banks[0].of_split("test")
    assert to_dmatrix(test, USED).num_col() == len(USED)


# ---- the study and its CLI ----------------------------------------------------------------------------------------


def test_the_study_puts_fl_and_each_dp_model_in_one_table_with_their_epsilon(banks):
    from fedfraud.training.fraud.dp_study import FL, FL_OWN, NO_NOISE, run_dp_study

    cfg = FraudConfig(dp=SMALL, num_boost_round=10, federated_tls=False)
    report = run_dp_study(banks, cfg, [2.0], seeds=2, reps=50)
    assert report.models == (FL, FL_OWN, NO_NOISE, "random trees, ε = 2")
    assert report.cards["random trees, ε = 2"]["epsilon"] == pytest.approx(2.0, rel=1e-3)
    text = report.to_markdown()
    assert "| random trees, ε = 2 |" in text and "| 2.00 | 2.00 | 1e-05 |" in text
    assert f"test frauds={int(sum(f.of_split('test').label.sum() for f in banks.values()))}" in text
    for name in (NO_NOISE, "random trees, ε = 2"):
        d = report.diff[name]["pr_auc"]
        assert d.low <= d.value <= d.high


@pytest.mark.parametrize("value", ["abc", "0", "1,-3", ""])
def test_bad_epsilons_give_one_line(tmp_path, capsys, value):
    from fedfraud.cli.app import main

    (tmp_path / "x.csv").write_text("a\n1\n")
    assert main(["eval", "fraud-dp", "--data", str(tmp_path / "x.csv"), "--epsilons", value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--epsilons" in err[0]


def test_two_banks_give_one_line(tmp_path, capsys, banks):
    from fedfraud.cli.app import main
    from fedfraud.core.errors import UserError
    from fedfraud.training.fraud.dp_study import run_dp_study

    (tmp_path / "x.csv").write_text("a\n1\n")
    assert main(["eval", "fraud-dp", "--data", str(tmp_path / "x.csv"), "--banks", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "at least 3 banks" in err[0]
    with pytest.raises(UserError, match="at least 3 banks"):
        run_dp_study({0: banks[0], 1: banks[1]}, FraudConfig(dp=SMALL), [1.0], seeds=1, reps=50)

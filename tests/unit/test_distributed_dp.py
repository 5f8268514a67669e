"""Distributed cardholder-level DP (issue 36): DP-FedSGD with Skellam noise shares under Flower's SecAgg+.

The accountant (Zhu–Wang Poisson amplification of the Skellam RDP) against dp-accounting, the integer encoding's
sensitivity and field, the round lock, and two real SecAgg+ rounds through Flower's ``secaggplus_mod`` and
``SecAggPlusWorkflow`` in process, over a loopback grid that serializes every message as the SuperLink would: each
bank's contribution is its clipped sum plus a noise share with the configured std (reproduced from its seed), the
server decodes exactly the sum of the shares, and every reply it receives is masked.
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting.rdp import RdpAccountant
from flwr.app import Context, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from fedfraud.feature_store.config import EgoGraphConfig, EncoderConfig, PrivacyConfig
from fedfraud.training.anomaly.config import AnomalyConfig, CardholderDPConfig
from fedfraud.training.anomaly.data import load_bank_data
from fedfraud.training.anomaly.distributed_dp import (
    ORDERS,
    DistributedPlan,
    RoundRefused,
    ServerStep,
    bank_share,
    decode_sum,
    distributed_card,
    distributed_epsilon,
    plan_distributed,
    poisson_subsampled_rdp,
    simulate_round,
    trainable,
)
from fedfraud.training.anomaly.dpsgd import (
    CardholderDP,
    CardholderPool,
    cardholder_epsilon,
    clip_and_sum,
    per_cardholder_gradients,
)
from fedfraud.training.anomaly.model import AnomalyModel
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.training.data.synthetic import generate_dataset
from fedfraud.training.federated.dp_fedsgd import NOISE_SEED_KEY, DPBank, dp_client_app, run_dp_fedsgd
from fedfraud.training.merchant_risk.dp import skellam_share
from fedfraud.training.merchant_risk.release_app import AuditGrid, read_audit
from tests.unit.test_merchant_release import _Loopback, assert_server_saw_only_masks, masked_vectors

ENC = EncoderConfig(dim=32, merchant_buckets=512)
EGO = EgoGraphConfig()
DP = CardholderDPConfig(enabled=True, noise="distributed", target_epsilon=0.0, noise_multiplier=1.5,
                        pool_per_cardholder=40, pairs_per_step=4, sampling_rate=0.6, clipping_norm=0.5)
# no dropout: the test recomputes each bank's gradients and must get the same ones
CFG = AnomalyConfig(hidden=32, disc_hidden=16, max_test_pairs=60, max_eval_normal=80, batch_size=32,
                    samples_per_epoch=64, dropout=0.0, cardholder_dp=DP)
SEEDS = {9001: 3, 9017: 5, 9034: 8}  # node id -> the bank's test-only noise seed


@pytest.fixture(scope="module")
def banks(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp-data")
    generate_dataset(
        root, GeneratorConfig(banks=3, cardholders=36, days=21, fraud_rate=0.03, seed=11), raw_csv=False, progress=False
    )
    out = []
    for b in range(3):
        data = load_bank_data(root, b, CFG, ENC, PrivacyConfig(), EGO, cache_dir=root / "cache")
        out.append(([data.train], CardholderPool.of([data.train])))
    return out


def _model() -> AnomalyModel:
    torch.manual_seed(0)
    model = AnomalyModel(CFG, ENC, EGO.max_nodes)
    model.encoder.merchant.weight.requires_grad_(False)
    return model


def _plan(banks, z: float = DP.noise_multiplier) -> DistributedPlan:
    dims = sum(p.numel() for _, p in trainable(_model()))
    return plan_distributed(DP.model_copy(update={"noise_multiplier": z}), 10, 3, dims, sum(len(p) for _, p in banks))


# ---- accountant ---------------------------------------------------------------------------------------------


def test_zhu_wang_bound_is_above_the_exact_subsampled_gaussian_and_below_no_sampling():
    for z, q in ((0.8, 0.01), (1.5, 0.1), (3.0, 0.25), (6.0, 0.5)):
        base = np.array([a / (2 * z * z) for a in ORDERS])
        exact = RdpAccountant([float(a) for a in ORDERS])
        exact.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)))
        bound = poisson_subsampled_rdp(base, q)
        assert np.all(bound >= exact._rdp * (1 - 1e-9) - 1e-12)  # an upper bound on the tight (exact) curve
        assert np.all(bound <= base + 1e-12) and bound[0] < base[0]  # amplification, never worse than none
    np.testing.assert_array_equal(poisson_subsampled_rdp(base, 1.0), base)


def test_epsilon_is_at_least_the_gaussian_reference_and_calibration_meets_the_target():
    dims, bits = 10_000, 16
    l2, l1 = 2**bits + math.sqrt(dims) / 2, math.sqrt(dims) * 2**bits + dims / 2
    for z, q in ((1.2, 0.1), (3.0, 0.25), (5.0, 1.0)):
        ours = distributed_epsilon(z, 160, 1e-5, q, l1, l2)
        assert ours >= cardholder_epsilon(z, 160, 1e-5, q) * (1 - 1e-6)
    assert distributed_epsilon(5.0, 160, 1e-5, 1.0, l1, l2) == pytest.approx(cardholder_epsilon(5.0, 160, 1e-5, 1.0),
                                                                              rel=1e-3)  # no sampling: ~Gaussian
    cfg = CardholderDPConfig(enabled=True, noise="distributed", target_epsilon=3.0, delta=1e-4, sampling_rate=0.1)
    plan = plan_distributed(cfg, 200, 5, dims, 600)
    assert plan.epsilon(200, 1e-4) <= 3.0 < DistributedPlan(**{**vars(plan), "noise_multiplier": plan.noise_multiplier
                                                                * 0.99}).epsilon(200, 1e-4)
    assert plan.survivors == 3 and plan.field_bits == 28 and 2 * 5 * plan.modulus <= 2**32
    card = distributed_card(cfg, plan, 200, 5)
    assert card["noise"] == "distributed" and card["epsilon"] <= 3.0 and card["min_banks_summed"] == 3
    assert card["epsilon_gaussian_reference"] <= card["epsilon"]


def test_the_field_holds_every_clean_sum_and_the_scale_shrinks_for_big_federations():
    cfg = CardholderDPConfig(enabled=True, noise="distributed", target_epsilon=8.0, sampling_rate=0.1)
    small = plan_distributed(cfg, 100, 5, 75_400, 600)
    big = plan_distributed(cfg, 100, 5, 75_400, 50_000)
    for plan in (small, big):
        assert plan.sampled_bound < plan.cardholders
        assert 2 * (plan.sampled_bound * 2**plan.scale_bits + plan.margin) < plan.modulus
        assert plan.l2 <= 2**plan.scale_bits * 1.03  # rounding inflates the sensitivity by a few % at most
    assert big.scale_bits < small.scale_bits
    lo, hi = -(small.modulus // 2) + 1, small.modulus // 2 - 1
    truth = np.array([lo, -1, 0, 1, hi])
    for k in (0, 1, 5):  # any representative of Σ residues mod M decodes to the signed sum
        np.testing.assert_array_equal(decode_sum(np.mod(truth, small.modulus) + k * small.modulus, small), truth)


def test_local_dp_sgd_refuses_distributed_noise():
    with pytest.raises(ValueError, match="DP-FedSGD"):
        CardholderDP(DP, 1.0)


# ---- one bank's share ---------------------------------------------------------------------------------------


def test_one_cardholder_moves_a_banks_clean_sum_by_its_own_rounded_clipped_gradient(banks):
    model = _model().train()
    plan = DistributedPlan(**{**vars(_plan(banks, 0.0)), "sampling_rate": 1.0})  # every cardholder, no noise
    sets, pool = banks[0]
    everyone = DP.model_copy(update={"pairs_per_step": 64})  # all rows: no draw shifts when one is removed
    full = bank_share(model, sets, pool, everyone, plan, np.random.default_rng(0), np.random.default_rng(0))
    assert full.cardholders == len(pool) and full.clipped > 0 and not full.noise.any()
    for drop in range(0, len(pool), 4):
        rest = CardholderPool([o for i, o in enumerate(pool.owners) if i != drop])
        part = bank_share(model, sets, rest, everyone, plan, np.random.default_rng(0), np.random.default_rng(0))
        u = (full.clean - part.clean).astype(np.float64)
        assert np.linalg.norm(u) <= plan.l2 and np.abs(u).sum() <= plan.l1
        grads, _ = per_cardholder_gradients(model, sets, [pool.owners[drop]])
        clipped, _ = clip_and_sum(grads, DP.clipping_norm)
        flat = torch.cat([clipped[n].flatten() for n, _ in trainable(model)]).double().numpy()
        assert np.abs(u - flat * plan.scale).max() <= 0.5 + 1e-6 * plan.scale  # its clipped gradient, rounded


def test_server_refuses_a_round_with_fewer_than_t_banks_or_more_than_the_field_holds(banks):
    plan = _plan(banks)
    server = ServerStep(_model(), plan, lr=0.01)
    before = [w.copy() for w in server.weights()]
    for summed in (plan.survivors - 1, plan.banks + 1):
        with pytest.raises(RoundRefused):
            server.apply(np.zeros(plan.dims, dtype=np.int64), summed)
    assert all(np.array_equal(a, b) for a, b in zip(before, server.weights(), strict=True))


# ---- real SecAgg+ rounds --------------------------------------------------------------------------------------


@pytest.fixture
def task_identity(monkeypatch):
    """The process-wide identity Flower's ServerApp runtime sets before a ServerApp creates messages."""
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)
    monkeypatch.setattr(TaskIdentity, "_run_id", 7)
    monkeypatch.setattr(TaskIdentity, "_node_id", SUPERLINK_NODE_ID)


def test_secagg_rounds_carry_each_banks_clipped_sum_plus_its_share_and_the_server_sees_only_masks(
    banks, tmp_path, task_identity
):
    rounds = 2
    plan = _plan(banks)
    assert plan.survivors == 2 and plan.banks == 3
    nodes = list(SEEDS)
    seen: dict[tuple[int, int], object] = {}
    bank_models = {node: _model() for node in nodes}

    def bank_for(context: Context) -> DPBank:
        sets, pool = banks[nodes.index(context.node_id)]
        return DPBank(bank_models[context.node_id], sets, pool, DP, plan)

    app = dp_client_app(bank_for, observer=lambda node, step, share: seen.__setitem__((node, step), share))
    contexts = {node: Context(7, node, {NOISE_SEED_KEY: SEEDS[node]}, RecordDict(), {}) for node in nodes}
    server_model = _model()
    server = ServerStep(server_model, plan, lr=0.01)
    audit = tmp_path / "audit"
    strategy = run_dp_fedsgd(AuditGrid(_Loopback(app, contexts), audit), Context(7, 0, {}, RecordDict(), {}), server,
                             rounds)
    assert not strategy.refused and len(strategy.sums) == rounds

    # the in-process replay (what the bench trains with), from the same seeds and weights, gives the same sums
    replay_model = _model()
    replay = ServerStep(replay_model, plan, lr=0.01)
    replies = read_audit(audit)
    per_round = len(replies) // rounds
    share_std = math.sqrt(plan.share_variance)
    for step in range(1, rounds + 1):
        shares = [seen[(node, step)] for node in nodes]
        for node, share in zip(nodes, shares, strict=True):
            # the contribution is the clean clipped sum plus a share from the bank's seed, mod M
            np.testing.assert_array_equal(share.residues, np.mod(share.clean + share.noise, plan.modulus))
            expected_noise = skellam_share((plan.dims,), plan.share_variance,
                                           np.random.default_rng([SEEDS[node], step, 1]))
            np.testing.assert_array_equal(share.noise, expected_noise)
            # ... with the configured std: σ²/t per coordinate, σ = z·Δ₂ (std's standard error ≈ σ/√(2n))
            n = share.noise.size
            assert abs(share.noise.std() - share_std) < 5 * share_std / math.sqrt(2 * n)
            assert abs(share.noise.mean()) < 5 * share_std / math.sqrt(n)
            assert share.cardholders > 0 and np.abs(share.clean).max() > 0
        # the server decoded exactly Σ (clean + noise) of the three banks
        truth = np.sum([s.clean + s.noise for s in shares], axis=0)
        np.testing.assert_array_equal(decode_sum(strategy.sums[step - 1], plan), truth)
        rngs = [(np.random.default_rng([SEEDS[node], step, 0]), np.random.default_rng([SEEDS[node], step, 1]))
                for node in nodes]
        replayed, _ = simulate_round(replay_model.train(), banks, DP, plan, replay, rngs)
        np.testing.assert_array_equal(np.sum([s.clean + s.noise for s in replayed], axis=0), truth)
        # every reply the server received in this round is masked
        part = replies[(step - 1) * per_round : step * per_round]
        clear = {node: seen[(node, step)].clean for node in nodes}
        residues = {node: seen[(node, step)].residues for node in nodes}
        assert_server_saw_only_masks(part, clear, residues, plan.modulus)
        assert set(masked_vectors(part)) == set(nodes)
    for a, b in zip(server.weights(), replay.weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)  # same sums, same Adam steps
    assert any(not np.array_equal(a, b) for a, b in zip(server.weights(), ServerStep(_model(), plan, 0.01).weights(),
                                                        strict=True))

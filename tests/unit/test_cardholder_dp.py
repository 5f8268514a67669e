"""Cardholder-level DP-SGD (issue 36): per-cardholder clipping, the noise's std, the accountant, training end to end."""

import math

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant
from pydantic import ValidationError

from fedfraud.feature_store.config import EgoGraphConfig, EncoderConfig, PrivacyConfig
from fedfraud.training.anomaly.config import AnomalyConfig, CardholderDPConfig
from fedfraud.training.anomaly.data import PairSet, load_bank_data
from fedfraud.training.anomaly.dpsgd import (
    CardholderDP,
    CardholderPool,
    cardholder_dp_card,
    cardholder_epsilon,
    clip_and_sum,
    dp_event,
    per_cardholder_gradients,
    plan_noise,
    private_gradient,
)
from fedfraud.training.anomaly.engine import evaluate_selection, sources_of, train_model
from fedfraud.training.anomaly.federated.task import RunSettings, cardholder_dp, total_dp_steps
from fedfraud.training.anomaly.heads import event_targets
from fedfraud.training.anomaly.model import AnomalyModel
from fedfraud.training.anomaly.run import privacy_report
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.training.data.synthetic import generate_dataset

ENC = EncoderConfig(dim=32, merchant_buckets=512)
EGO = EgoGraphConfig()
DP = CardholderDPConfig(enabled=True, target_epsilon=0.0, noise_multiplier=1.0, pool_per_cardholder=40,
                        pairs_per_step=64, sampling_rate=1.0, clipping_norm=0.5)
CFG = AnomalyConfig(hidden=32, disc_hidden=16, max_test_pairs=60, max_eval_normal=80, batch_size=32,
                    samples_per_epoch=64, cardholder_dp=DP)


@pytest.fixture(scope="module")
def bank(tmp_path_factory):
    root = tmp_path_factory.mktemp("dp-data")
    generate_dataset(
        root, GeneratorConfig(banks=1, cardholders=24, days=21, fraud_rate=0.03, seed=11), raw_csv=False, progress=False
    )
    return load_bank_data(root, 0, CFG, ENC, PrivacyConfig(), EGO, cache_dir=root / "cache")


def _model(seed: int = 0) -> AnomalyModel:
    torch.manual_seed(seed)
    model = AnomalyModel(CFG, ENC, EGO.max_nodes)
    model.encoder.merchant.weight.requires_grad_(False)
    return model.eval()  # no dropout: two passes see the same function


def _norm(grads: dict[str, torch.Tensor]) -> float:
    return float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values())))


def test_training_pool_is_capped_per_cardholder(bank):
    holders, counts = np.unique(bank.train.cardholders.astype(str), return_counts=True)
    assert counts.max() <= DP.pool_per_cardholder and len(holders) >= 10
    assert counts.max() > 1  # some cardholder contributes several transitions: what the clipping is about


def test_per_cardholder_gradients_are_each_cardholders_own(bank):
    model = _model()
    pool = CardholderPool.of([bank.train])
    picked = pool.owners[:3]
    grads, losses = per_cardholder_gradients(model, [bank.train], picked)
    for i, (_, rows) in enumerate(picked):  # the same gradient as backprop on that cardholder's rows alone
        model.zero_grad()
        q = model.embed(torch_batch(bank.train, rows)).q
        targets = {h: torch.from_numpy(t) for h, t in event_targets(bank.train.priors[rows],
                                                                     bank.train.events[rows]).items()}
        loss = torch.stack(list(model.head.nll(q, targets).values())).sum(0).mean()
        loss.backward()
        assert float(loss.detach()) == pytest.approx(float(losses[i]), rel=1e-5)
        for name, p in model.named_parameters():
            if p.requires_grad:
                torch.testing.assert_close(grads[name][i], p.grad, rtol=1e-4, atol=1e-6)


def torch_batch(pairs: PairSet, rows: np.ndarray):
    from torch_geometric.data import Batch

    return Batch.from_data_list([pairs.previous[int(i)] for i in rows])


def test_a_cardholder_with_many_transitions_is_clipped_to_c_as_a_whole(bank):
    model = _model()
    pool = CardholderPool.of([bank.train])
    big = max(pool.owners, key=lambda o: len(o[1]))
    assert len(big[1]) >= 10
    grads, _ = per_cardholder_gradients(model, [bank.train], [big])
    raw = _norm({k: g[0] for k, g in grads.items()})
    c = raw / 4  # every one of its transitions alone would reach C: clipped per pair, the sum could be ~len × C
    summed, norms = clip_and_sum(grads, c)
    assert float(norms[0]) == pytest.approx(raw, rel=1e-5)
    assert _norm(summed) == pytest.approx(c, rel=1e-5)


def test_removing_one_cardholder_moves_the_noiseless_step_by_at_most_c(bank):
    model = _model()
    pool = CardholderPool.of([bank.train])
    dp = CardholderDP(DP, 0.0)  # q = 1 and every transition of every cardholder: a deterministic step
    full = private_gradient(model, [bank.train], pool, dp, np.random.default_rng(0))
    expected = DP.sampling_rate * len(pool)
    for drop in range(0, len(pool), 5):
        rest = CardholderPool([o for i, o in enumerate(pool.owners) if i != drop])
        # same normalisation as the full pool, so the difference is the removed cardholder's clipped gradient
        part = private_gradient(model, [bank.train], rest, dp, np.random.default_rng(0))
        scale = (DP.sampling_rate * len(rest)) / expected
        diff = {k: (full.gradient[k] - part.gradient[k] * scale) * expected for k in full.gradient}
        assert _norm(diff) <= DP.clipping_norm * (1 + 1e-4)
    assert full.clipped > 0  # the bound was active, not vacuous


def test_noise_std_is_z_times_c_on_a_real_step(bank):
    model = _model()
    pool = CardholderPool.of([bank.train])
    cfg = DP.model_copy(update={"sampling_rate": 0.5, "pairs_per_step": 3})
    z = 1.7
    clean = private_gradient(model, [bank.train], pool, CardholderDP(cfg, 0.0), np.random.default_rng(5))
    noisy = private_gradient(model, [bank.train], pool, CardholderDP(cfg, z), np.random.default_rng(5))
    assert clean.cardholders == noisy.cardholders > 0
    expected = cfg.sampling_rate * len(pool)
    noise = torch.cat([((noisy.gradient[k] - clean.gradient[k]) * expected).flatten() for k in clean.gradient])
    n = noise.numel()
    assert n > 5_000
    std = float(noise.double().std())
    # the std of n Gaussian draws has standard error σ/√(2n): allow five of them
    assert abs(std - z * cfg.clipping_norm) < 5 * z * cfg.clipping_norm / math.sqrt(2 * n)
    assert abs(float(noise.double().mean())) < 5 * z * cfg.clipping_norm / math.sqrt(n)


def test_the_accountant_is_dp_accountings_for_the_same_event():
    z, steps, delta, q = 1.3, 400, 1e-5, 0.05
    ours = cardholder_epsilon(z, steps, delta, q)
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps
    )
    reference = RdpAccountant()  # dp-accounting's own default orders
    reference.compose(event)
    assert ours == pytest.approx(reference.get_epsilon(delta), rel=0.02)
    pld = PLDAccountant(value_discretization_interval=1e-3)
    pld.compose(event)
    # PLD is the tighter (near exact) accountant: RDP is an upper bound on it, and not a loose one here
    assert pld.get_epsilon(delta) <= ours <= 1.3 * pld.get_epsilon(delta)
    assert dp_event(z, steps, q) == event
    assert cardholder_epsilon(0.0, steps, delta, q) == math.inf


def test_calibration_meets_the_target_and_not_much_more():
    cfg = CardholderDPConfig(enabled=True, target_epsilon=3.0, delta=1e-4, sampling_rate=0.25)
    z = plan_noise(cfg, 200)
    assert cardholder_epsilon(z, 200, 1e-4, 0.25) <= 3.0
    assert cardholder_epsilon(z * 0.99, 200, 1e-4, 0.25) > 3.0
    card = cardholder_dp_card(cfg, z, 200, 5)
    assert card["epsilon"] <= 3.0 and card["unit_of_privacy"].startswith("one cardholder")
    assert {"delta", "sampling_rate", "noise_multiplier", "clipping_norm", "steps", "accountant"} <= set(card)
    report = privacy_report({}, card)
    assert "per cardholder" in report["formal_guarantee"] and "200 local DP-SGD steps" in report["formal_guarantee"]


def test_run_settings_carry_the_plan():
    flat = {"cardholder-dp-enabled": True, "cardholder-dp-target-epsilon": 8.0, "rounds": 3, "local-epochs": 2,
            "samples-per-epoch": 100, "batch-size": 50}
    settings = RunSettings.from_flat(flat)
    assert total_dp_steps(settings) == 3 * 2 * 2
    plan = cardholder_dp(settings)
    assert plan is not None and cardholder_epsilon(plan.noise_multiplier, 12, 1e-5, 0.25) <= 8.0
    assert cardholder_dp(RunSettings.from_flat({})) is None
    with pytest.raises(ValidationError, match="next-event"):
        AnomalyConfig(readout="contrastive", cardholder_dp=CardholderDPConfig(enabled=True))


def test_training_with_cardholder_dp_runs_end_to_end(bank):
    torch.manual_seed(0)
    model = AnomalyModel(CFG, ENC, EGO.max_nodes)
    table = model.encoder.merchant.weight.detach().clone()
    dense = [p.detach().clone() for n, p in model.named_parameters() if n != "encoder.merchant.weight"]
    before = evaluate_selection(model, bank)["val_loss"]
    cfg = DP.model_copy(update={"sampling_rate": 0.5, "pairs_per_step": 4, "clipping_norm": 1.0})
    dp = CardholderDP(cfg, 0.5)
    stats, _ = train_model(model, sources_of([bank], CFG, EGO.max_nodes), epochs=4, samples_per_epoch=64,
                           batch_size=32, lr=3e-3, seed=0, proximal_mu=0.01, dp=dp)
    assert stats.steps == 4 * 2 and math.isfinite(stats.loss_last)
    assert torch.equal(model.encoder.merchant.weight.detach(), table)  # frozen under DP
    assert model.encoder.merchant.weight.requires_grad  # and given back afterwards
    moved = [n for (n, p), s in zip(((n, p) for n, p in model.named_parameters() if n != "encoder.merchant.weight"),
                                    dense, strict=True) if not torch.equal(p.detach(), s)]
    assert len(moved) == len(dense)
    after = evaluate_selection(model, bank)["val_loss"]
    assert math.isfinite(after) and after < before  # small noise: it still learns

"""Private merchant-risk release (issue 35, part 2): the banks' Skellam noise shares, the per-cardholder accountant
against dp-accounting, calibration, the field arithmetic (clipping, wrap-around, overflow), and one release through
Flower's real SecAgg+ client mod and server workflow, in process, over a loopback grid that serializes every message
as the SuperLink would. The same app across SuperNode processes: tests/integration/test_merchant_release_secagg.py.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from uuid import uuid4

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from dp_accounting import GaussianDpEvent, SelfComposedDpEvent
from dp_accounting.rdp import RdpAccountant
from flwr.app import Context, Message, RecordDict
from flwr.common import bytes_to_ndarray
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from fedfraud.training.federated.ledger import BUDGET_KEY, PrivacyLedger
from fedfraud.training.fraud.gnn.loopback import LoopbackGrid
from fedfraud.training.merchant_risk import release_app
from fedfraud.training.merchant_risk.config import MerchantNoiseConfig, MerchantRiskConfig
from fedfraud.training.merchant_risk.dp import (
    ORDERS,
    noise_for_epsilon,
    release_epsilon,
    release_noise_std,
    skellam_rdp,
    skellam_share,
)
from fedfraud.training.merchant_risk.release import (
    SECAGG_MODULUS,
    ReleasePlan,
    decode_sum,
    encode_share,
    load_release_vector,
    plan_release,
    private_release,
    save_release_vector,
)
from fedfraud.training.merchant_risk.stats import DAY_S, STATS, BankActivity, federation_release, release_vector

ROOT = Path(__file__).resolve().parents[2]
#: A rich release (every statistic, 3 buckets per cardholder): L2 √32, so the accountant's discrete term shows.
RISK = MerchantRiskConfig(window_days=(4, 9), label_delay_days=3, cpp_days=4, max_merchants=3, buckets=64,
                          released_stats=STATS, release_window_days=(4, 9), release_max_merchants=3)
DAY0 = 19_000


def _vectors(n_banks: int = 3, seed: int = 0, day: int = DAY0 + 12) -> list[np.ndarray]:
    """Real release vectors (stats.release_vector) of random activity, one cardholder per bank."""
    rng = np.random.default_rng(seed)
    out = []
    for b in range(n_banks):
        n = 600
        frame = pd.DataFrame({"holder": [f"{b}-{h}" for h in rng.integers(0, 30, n)],
                              "merchant": rng.integers(0, 256, n).astype(np.uint64),
                              "ts": DAY0 * DAY_S + rng.integers(0, 20 * DAY_S, n),
                              "label": (rng.random(n) < 0.15).astype(np.float32)})
        activity = BankActivity.of(frame["holder"], frame["merchant"].to_numpy(), frame["ts"].to_numpy(),
                                   frame["label"].to_numpy(), RISK.buckets)
        out.append(release_vector(activity, day, RISK))
    return out


def test_l2_sensitivity_bounds_one_cardholder_and_is_at_most_l1():
    rng = np.random.default_rng(5)
    heavy = pd.DataFrame({"holder": "heavy", "merchant": np.repeat(np.arange(40), 3).astype(np.uint64),
                          "ts": DAY0 * DAY_S + np.sort(rng.integers(0, 10 * DAY_S, 120)),
                          "label": (rng.random(120) < 0.4).astype(np.float32)})
    others = pd.DataFrame({"holder": rng.integers(0, 30, 500).astype(str),
                           "merchant": rng.integers(0, 256, 500).astype(np.uint64),
                           "ts": DAY0 * DAY_S + rng.integers(0, 12 * DAY_S, 500),
                           "label": (rng.random(500) < 0.15).astype(np.float32)})
    for cap in (1, 2):
        cfg = RISK.model_copy(update={"per_merchant_cap": cap})

        def vec(frame: pd.DataFrame, c: MerchantRiskConfig = cfg) -> np.ndarray:
            act = BankActivity.of(frame["holder"], frame["merchant"].to_numpy(), frame["ts"].to_numpy(),
                                  frame["label"].to_numpy(), c.buckets)
            return release_vector(act, DAY0 + 9, c)

        diff = vec(pd.concat([others, heavy], ignore_index=True)) - vec(others)
        assert 0 < np.sqrt((diff.astype(float) ** 2).sum()) <= cfg.sensitivity_l2() <= cfg.sensitivity_l1()
    assert RISK.sensitivity_l2() == pytest.approx(math.sqrt(2 * (3 * 5 + 1)))


def test_noise_shares_of_the_survivors_sum_to_the_target_variance():
    plan = plan_release(RISK, MerchantNoiseConfig(noise_multiplier=2.0, min_banks=3), banks=5)
    assert plan.survivors == 3 and plan.share_variance == pytest.approx(plan.noise_std ** 2 / 3)
    children = np.random.default_rng(1).spawn(5)
    shares = [skellam_share((200_000,), plan.share_variance, r) for r in children]
    assert all(s.dtype == np.int64 for s in shares)
    for m in (3, 5):  # t survivors: exactly σ²; all n: n/t × σ²
        total = np.sum(shares[:m], axis=0)
        assert abs(total.mean()) < 4 * math.sqrt(m * plan.share_variance / total.size)
        assert total.var() == pytest.approx(m / 3 * plan.noise_std ** 2, rel=0.02)
    assert not skellam_share((4,), 0.0, children[0]).any()
    # the default t is SecAgg+'s threshold: 2 of 3, 3 of 5
    assert [plan_release(RISK, MerchantNoiseConfig(), n).survivors for n in (3, 4, 5)] == [2, 3, 3]


def test_the_accountant_is_dp_accountings_gaussian_rdp_plus_the_skellam_term():
    l1, l2 = float(RISK.sensitivity_l1()), RISK.sensitivity_l2()
    for std in (3.0, 30.0):
        alpha = np.asarray(ORDERS, dtype=float)
        var = std * std
        by_hand = alpha * l2 ** 2 / (2 * var) + np.minimum(((2 * alpha - 1) * l2 ** 2 + 6 * l1) / (4 * var ** 2),
                                                           3 * l1 / (2 * var))
        np.testing.assert_allclose(skellam_rdp(std, l1, l2), by_hand, rtol=1e-12)
    # composed over T releases: never below dp-accounting's Gaussian at the same σ, and equal to it as σ grows
    gaps = []
    for z, releases in ((0.8, 61), (3.0, 61), (20.0, 61), (20.0, 1)):
        direct = RdpAccountant([float(a) for a in ORDERS])
        direct.compose(SelfComposedDpEvent(GaussianDpEvent(z), releases))
        gauss = direct.get_epsilon(1e-8)
        eps = release_epsilon(z * l2, releases, 1e-8, l1, l2)
        assert eps >= gauss
        gaps.append(eps / gauss - 1)
    assert gaps[0] > gaps[1] > gaps[2] and max(gaps[2:]) < 1e-3


def test_epsilon_is_monotone_and_calibration_inverts_it():
    l1, l2 = float(RISK.sensitivity_l1()), RISK.sensitivity_l2()
    stds = [2.0, 5.0, 10.0, 40.0, 200.0]
    by_noise = [release_epsilon(s, 61, 1e-8, l1, l2) for s in stds]
    assert all(a > b for a, b in zip(by_noise, by_noise[1:], strict=False))
    by_days = [release_epsilon(40.0, t, 1e-8, l1, l2) for t in (1, 2, 10, 61, 365)]
    assert all(a < b for a, b in zip(by_days, by_days[1:], strict=False))
    assert release_epsilon(40.0, 61, 1e-6, l1, l2) < release_epsilon(40.0, 61, 1e-9, l1, l2)
    assert release_epsilon(0.0, 1, 1e-8, l1, l2) == math.inf and release_epsilon(40.0, 0, 1e-8, l1, l2) == 0.0
    for target, releases in ((1.0, 1), (10.0, 61), (3.0, 61)):
        std = noise_for_epsilon(target, releases, 1e-8, l1, l2)
        assert release_epsilon(std, releases, 1e-8, l1, l2) <= target
        assert release_epsilon(std * (1 - 1e-4), releases, 1e-8, l1, l2) > target
    noise = MerchantNoiseConfig(target_epsilon=4.0, period_days=30, delta=1e-7)
    assert release_noise_std(RISK, noise) == pytest.approx(noise_for_epsilon(4.0, 30, 1e-7, l1, l2))
    assert release_noise_std(RISK, MerchantNoiseConfig(noise_multiplier=2.5)) == pytest.approx(2.5 * l2)


def test_private_release_is_the_clear_sum_plus_each_banks_noise_share():
    vectors = _vectors()
    assert all(v.shape == (len(RISK.window_days) * len(STATS), RISK.buckets) for v in vectors)
    plan = plan_release(RISK, MerchantNoiseConfig(noise_multiplier=1.5), banks=3)
    released = private_release(vectors, plan, np.random.default_rng(42))
    shares = [skellam_share(vectors[0].shape, plan.share_variance, r)
              for r in np.random.default_rng(42).spawn(len(vectors))]
    np.testing.assert_array_equal(released, federation_release(vectors) + np.sum(shares, axis=0))
    assert (released < 0).any()  # noise takes some empty buckets below zero: decoded, not wrapped
    clear = plan_release(RISK, MerchantNoiseConfig(noise_multiplier=0.0), banks=3)
    assert clear.noise_std == 0 and clear.epsilon(61, 1e-8, RISK) == math.inf
    np.testing.assert_array_equal(private_release(vectors, clear, np.random.default_rng(0)),
                                  federation_release(vectors))
    with pytest.raises(ValueError, match="sums 2..3 banks"):
        private_release(vectors[:1], plan, np.random.default_rng(0))


def test_the_field_clips_wraps_and_refuses_overflow():
    plan = ReleasePlan(noise_std=6.0, banks=3, survivors=2, count_cap=40, field_bits=9)
    assert 3 * plan.count_cap + 2 * plan.margin < plan.modulus
    # counts above the cap are clipped before the noise; the residues lie in [0, M)
    x = np.array([[0, 39, 40, 41, 10_000]])
    r = encode_share(x, plan, np.random.default_rng(3))
    noise = skellam_share(x.shape, plan.share_variance, np.random.default_rng(3))
    assert r.min() >= 0 and r.max() < plan.modulus
    np.testing.assert_array_equal(decode_sum(r, plan), np.minimum(x, 40) + noise)
    # every true sum in [-τ, n·cap + τ] comes back from any representative mod M ...
    lo, hi = -plan.margin, 3 * plan.count_cap + plan.margin
    truth = np.arange(lo, hi + 1)
    for k in (0, 1, 3):
        np.testing.assert_array_equal(decode_sum(np.mod(truth, plan.modulus) + k * plan.modulus, plan), truth)
    # ... and one beyond the window wraps by M, the event the margin makes a 2**-64 one per entry
    assert decode_sum(np.array([plan.modulus - plan.margin]), plan)[0] == -plan.margin
    from scipy.stats import skellam

    lam = 3 * plan.share_variance / 2
    assert 2 * skellam.sf(plan.margin - 1, lam, lam) <= 2.0 ** -64
    with pytest.raises(ValueError, match="cannot hold"):
        ReleasePlan(noise_std=6.0, banks=3, survivors=2, count_cap=200, field_bits=9)
    with pytest.raises(ValueError, match="overflow SecAgg"):
        plan_release(RISK, MerchantNoiseConfig(count_cap=1 << 24), banks=64)
    for bad in (np.array([[1.5]]), np.array([[-1]])):
        with pytest.raises((TypeError, ValueError)):
            encode_share(bad, plan, np.random.default_rng(0))


def test_a_stored_vector_must_match_the_release_settings(tmp_path):
    v = _vectors(1)[0]
    save_release_vector(tmp_path, DAY0, v, RISK)
    np.testing.assert_array_equal(load_release_vector(tmp_path, DAY0, RISK), v)
    with pytest.raises(ValueError, match="computed under"):
        load_release_vector(tmp_path, DAY0, RISK.model_copy(update={"max_merchants": 4}))
    with pytest.raises(FileNotFoundError):
        load_release_vector(tmp_path, DAY0 + 1, RISK)


def test_the_app_bundle_carries_the_default_run_config():
    flwr = tomllib.loads((ROOT / "apps" / "merchant_release" / "pyproject.toml").read_text())["tool"]["flwr"]
    assert flwr["app"]["config"] == release_app.DEFAULT_SETTINGS
    assert flwr["app"]["components"] == {"serverapp": "fedfraud.training.merchant_risk.release_app:server",
                                         "clientapp": "fedfraud.training.merchant_risk.release_app:client"}


class _Loopback(Grid):
    """Delivers each message to a ClientApp in this process, serialized both ways as over the SuperLink."""

    def __init__(self, app, contexts: dict[int, Context]) -> None:
        self.app, self.contexts, self._run = app, contexts, Run.create_empty(7)

    def set_run(self, run) -> None:
        self._run = run

    @property
    def run(self):
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        raise NotImplementedError

    def pull_messages(self, message_ids):
        raise NotImplementedError

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid4().hex
            wire = message_from_proto(message_to_proto(msg))
            reply = self.app(wire, self.contexts[msg.metadata.dst_node_id])
            replies.append(message_from_proto(message_to_proto(reply)))
        return replies


def masked_vectors(replies: list[Message]) -> dict[int, np.ndarray]:
    """Each bank's masked vector, from the replies the server received (SecAgg+'s stage 2)."""
    out = {}
    for msg in replies:
        configs = msg.content.config_records.get(RECORD_KEY_CONFIGS, {})
        if Key.MASKED_PARAMETERS in configs:
            arrays = [bytes_to_ndarray(b) for b in configs[Key.MASKED_PARAMETERS]]
            out[msg.metadata.src_node_id] = arrays[1]  # arrays[0]: the weight factor
    return out


def assert_server_saw_only_masks(replies: list[Message], clear: dict[int, np.ndarray], residues: dict[int, np.ndarray],
                                 modulus: int) -> None:
    """No array leaves a bank except SecAgg+'s masked vector, and that one is uniform mod 2**32, equal to neither the
    bank's clear vector nor its noised residues (nor their quantized form, residue + M).
    """
    assert len(replies) == 4 * len(clear)  # SecAgg+'s four stages, one reply per bank each
    allowed = {"pk1", "pk2", "dsts", "ctxts", Key.MASKED_PARAMETERS, "nids", "shares"}
    for msg in replies:
        content = msg.content
        assert all(not record for record in content.array_records.values())  # the mod emptied fitres.parameters
        assert {k: dict(r) for k, r in content.metric_records.items()} in ({}, {"fitres.num_examples":
                                                                                 {"num_examples": 1}})
        assert set(content.config_records) <= {RECORD_KEY_CONFIGS, "fitres.metrics", "fitres.status"}
        assert not content.config_records.get("fitres.metrics")  # no metric leaves a bank
        assert set(content.config_records[RECORD_KEY_CONFIGS]) <= allowed
    masked = masked_vectors(replies)
    assert set(masked) == set(clear)
    for node, u in masked.items():
        assert u.shape == clear[node].shape
        assert u.max() >= SECAGG_MODULUS // 2 > 2 * modulus  # far above any residue or count
        for plain in (clear[node], residues[node], residues[node] + modulus):
            assert np.mean(u == plain) < 0.01
        # Rank correlation, so the clipped outlier cannot dominate; under independence its std is 1/sqrt(n), and
        # 5 std bounds a false alarm at about 6e-7 per vector (a fixed 0.1 was 3 std here and failed in CI).
        rho = scipy.stats.spearmanr(u.ravel().astype(float), clear[node].ravel().astype(float)).statistic
        assert abs(rho) < 5 / np.sqrt(u.size)


@pytest.fixture
def task_identity(monkeypatch):
    """The process-wide identity Flower's ServerApp runtime sets before a ServerApp creates messages."""
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)
    monkeypatch.setattr(TaskIdentity, "_run_id", 7)
    monkeypatch.setattr(TaskIdentity, "_node_id", SUPERLINK_NODE_ID)


def test_secagg_release_in_process_is_exact_and_the_server_sees_only_masks(tmp_path, task_identity):
    noise = MerchantNoiseConfig(noise_multiplier=2.0, count_cap=50)  # a small cap: a small field, wrap-around used
    vectors = _vectors(3, seed=9)
    vectors[1][0, 5] = 10_000  # above the cap: clipped in the bank
    contexts, clear = {}, {}
    run_config = {"release-day": DAY0, "num-banks": 3, "merchant-risk": RISK.model_dump_json(),
                  "merchant-noise": noise.model_dump_json(), "out-dir": str(tmp_path / "out"),
                  "audit-dir": str(tmp_path / "audit"), "timeout-s": 60.0}
    for b, v in enumerate(vectors):
        save_release_vector(tmp_path / f"bank_{b}", DAY0, v, RISK)
        node = 9000 + 17 * b
        contexts[node] = Context(7, node, {"data-dir": str(tmp_path / f"bank_{b}"), release_app.NOISE_SEED_KEY: b},
                                 RecordDict(), run_config)
        clear[node] = v
    result = release_app.run_release(_Loopback(release_app.client, contexts), Context(7, 0, {}, RecordDict(),
                                                                                     run_config))
    plan = plan_release(RISK, noise, 3)
    assert result.plan == plan and result.banks_summed == 3 and plan.field_bits < 12
    shares = {node: skellam_share(v.shape, plan.share_variance, np.random.default_rng([b, DAY0]))
              for b, (node, v) in enumerate(clear.items())}
    expected = sum(np.minimum(v, noise.count_cap) + shares[node] for node, v in clear.items())
    np.testing.assert_array_equal(result.release, expected)
    saved = np.load(tmp_path / "out" / f"release-{DAY0}.npz")["release"]
    np.testing.assert_array_equal(saved, expected)
    assert result.card["epsilon_per_release"] == pytest.approx(plan.epsilon(1, noise.delta, RISK))
    residues = {node: np.mod(np.minimum(v, noise.count_cap) + shares[node], plan.modulus) for node, v in clear.items()}
    assert_server_saw_only_masks(release_app.read_audit(tmp_path / "audit"), clear, residues, plan.modulus)
    for b in range(3):  # each bank charged the release to its own privacy ledger (its data folder's), once
        [entry] = PrivacyLedger(tmp_path / f"bank_{b}" / "dp-ledger.json").entries()
        assert entry.run == f"flwr-run-7:merchant-release-{DAY0}"
        assert entry.epsilon == pytest.approx(result.card["epsilon_per_release"], rel=1e-6)


def test_a_bank_refuses_the_release_past_its_lifetime_budget_and_sends_nothing(tmp_path, task_identity):
    noise = MerchantNoiseConfig(noise_multiplier=2.0, count_cap=50)
    plan = plan_release(RISK, noise, 3)
    one, two = plan.epsilon(1, noise.delta, RISK), plan.epsilon(2, noise.delta, RISK)
    vectors = _vectors(3, seed=4)

    def release(run_id: int, day: int, budget: float = (one + two) / 2):  # room for one release, not two
        audit = tmp_path / f"audit-{run_id}-{day}"
        config = {"release-day": day, "num-banks": 3, "merchant-risk": RISK.model_dump_json(),
                  "merchant-noise": noise.model_dump_json(), "out-dir": str(tmp_path / "out"),
                  "audit-dir": str(audit), "timeout-s": 60.0}
        contexts = {}
        for b, v in enumerate(vectors):
            save_release_vector(tmp_path / f"bank_{b}", day, v, RISK)
            node_config = {"data-dir": str(tmp_path / f"bank_{b}"), release_app.NOISE_SEED_KEY: b,
                           BUDGET_KEY: budget}
            contexts[9000 + b] = Context(run_id, 9000 + b, node_config, RecordDict(), config)
        # the production loopback grid: a bank's exception comes back as the error reply a SuperNode sends
        return release_app.run_release(LoopbackGrid(release_app.client, contexts, run_id),
                                       Context(run_id, 0, {}, RecordDict(), config)), audit

    assert release(7, DAY0)[0].banks_summed == 3
    with pytest.raises(RuntimeError, match="SecAgg\\+ halted"):  # the same run and day again, even with budget
        release(7, DAY0, budget=100 * two)
    with pytest.raises(RuntimeError, match="SecAgg\\+ halted"):
        release(8, DAY0 + 1)
    replies = release_app.read_audit(tmp_path / f"audit-8-{DAY0 + 1}")
    refusals = [m for m in replies if m.has_error()]
    assert refusals and all(m.error.reason.endswith(f":<'{release_app.REFUSAL}'>") for m in refusals)
    assert not masked_vectors([m for m in replies if m.has_content()])  # nothing of day 2 left a bank
    for b in range(3):
        ledger = PrivacyLedger(tmp_path / f"bank_{b}" / "dp-ledger.json")
        assert [e.run for e in ledger.entries()] == [f"flwr-run-7:merchant-release-{DAY0}"]

"""The merchant-risk release across a real Flower Deployment Engine federation: a SuperLink and 3 SuperNodes as
processes (TLS, SuperNode authentication), the app submitted with ``flwr run apps/merchant_release``.

Each bank's vector is computed from its own generated transactions (keyed merchant hash, per-cardholder bound) and
stored in its own folder; its SuperNode adds a Skellam share (a fixed seed in the node config, so the test can
recompute it) and SecAgg+ masks the result. The server writes every reply it receives (``audit-dir``): on those real
messages no bank's vector, clear or noised, appears, only SecAgg+'s masked vectors, keys and shares; and the release
is exactly the sum of the clipped vectors plus the three noise shares.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedfraud.feature_store.config import EncoderConfig, PrivacyConfig
from fedfraud.feature_store.encoders import timestamps_us
from fedfraud.feature_store.privacy import PrivateFeaturizer
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.training.data.synthetic import generate_dataset
from fedfraud.training.federated.deployment import Federation, generate_federation_files, run_app
from fedfraud.training.merchant_risk.config import MerchantNoiseConfig, MerchantRiskConfig
from fedfraud.training.merchant_risk.dp import skellam_share
from fedfraud.training.merchant_risk.release import plan_release, save_release_vector
from fedfraud.training.merchant_risk.release_app import NOISE_SEED_KEY, read_audit
from fedfraud.training.merchant_risk.stats import DAY_S, BankActivity, release_vector
from tests.unit.test_merchant_release import assert_server_saw_only_masks

pytestmark = [pytest.mark.integration, pytest.mark.long]

ROOT = Path(__file__).resolve().parents[2]
BANKS = [0, 1, 2]
RISK = MerchantRiskConfig(window_days=(7, 14), label_delay_days=2, cpp_days=5, max_merchants=4, buckets=256,
                          released_stats=("labelled", "frauds"), release_window_days=(7, 14), release_max_merchants=2)
NOISE = MerchantNoiseConfig(noise_multiplier=3.0)


class _SeededFederation(Federation):
    """Bank k's SuperNode gets ``merchant-noise-seed=100+k`` in its node config (its own setting, not the server's)."""

    def supernode_command(self, bank: int, key: Path | None = None, insecure: bool = False,
                          max_retries: int | None = None) -> list[str]:
        cmd = super().supernode_command(bank, key, insecure, max_retries)
        at = cmd.index("--node-config") + 1
        cmd[at] += f" {NOISE_SEED_KEY}={100 + bank}"
        return cmd


def _bank_vectors(data: Path) -> tuple[int, dict[int, np.ndarray]]:
    frames = {b: pd.read_parquet(data / f"bank_{b}" / "transactions.parquet") for b in BANKS}
    day = min(int(timestamps_us(f["timestamp"]).max() // 1_000_000 // DAY_S) for f in frames.values())
    vectors = {}
    for b, frame in frames.items():
        merchant = PrivateFeaturizer.for_bank(EncoderConfig(), PrivacyConfig(), b).merchant_hash(frame["merchant_id"])
        activity = BankActivity.of(frame["cardholder_id"], merchant, timestamps_us(frame["timestamp"]) // 1_000_000,
                                   frame["is_fraud"].astype("float32").to_numpy(), RISK.buckets)
        vectors[b] = release_vector(activity, day, RISK)
    return day, vectors


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    root = tmp_path_factory.mktemp("merchant-release")
    data = root / "data"
    generate_dataset(data, GeneratorConfig(banks=3, cardholders=40, days=21, fraud_rate=0.05, seed=8),
                     raw_csv=False, progress=False)
    day, vectors = _bank_vectors(data)
    for b, v in vectors.items():
        save_release_vector(data / f"bank_{b}", day, v, RISK)
    files = generate_federation_files(root / "federation", banks=len(BANKS))
    out, audit = root / "out", root / "audit"
    with _SeededFederation(files, data, BANKS, cache=False) as fed:
        run_app(files, ROOT / "apps" / "merchant_release", {
            "release-day": day, "num-banks": 3, "merchant-risk": RISK.model_dump_json(),
            "merchant-noise": NOISE.model_dump_json(), "out-dir": str(out), "audit-dir": str(audit),
            "timeout-s": 240.0,
        }, timeout_s=480, log_name="merchant-release")
        nodes = {b: int(fed.node_ids[b]) for b in BANKS}
    return {"day": day, "vectors": vectors, "nodes": nodes, "out": out, "audit": audit}


def test_the_release_is_the_sum_of_the_noised_vectors_exactly(released):
    day, vectors = released["day"], released["vectors"]
    assert sum(int(v.sum()) for v in vectors.values()) > 0
    plan = plan_release(RISK, NOISE, banks=3)
    shares = {b: skellam_share(v.shape, plan.share_variance, np.random.default_rng([100 + b, day]))
              for b, v in vectors.items()}
    release = np.load(released["out"] / f"release-{day}.npz")["release"]
    np.testing.assert_array_equal(release, sum(np.minimum(v, plan.count_cap) + shares[b] for b, v in vectors.items()))
    card = json.loads((released["out"] / f"release-{day}.json").read_text())
    assert card["banks_summed"] == 3 and card["field_bits"] == plan.field_bits
    assert card["epsilon_per_release"] == pytest.approx(plan.epsilon(1, NOISE.delta, RISK))
    assert card["epsilon_period"] == pytest.approx(plan.epsilon(NOISE.period_days, NOISE.delta, RISK))


def test_the_server_received_no_banks_vector_only_masked_shares(released):
    day, vectors, nodes = released["day"], released["vectors"], released["nodes"]
    plan = plan_release(RISK, NOISE, banks=3)
    clear = {nodes[b]: v for b, v in vectors.items()}
    residues = {nodes[b]: np.mod(np.minimum(v, plan.count_cap) + skellam_share(
        v.shape, plan.share_variance, np.random.default_rng([100 + b, day])), plan.modulus) for b, v in vectors.items()}
    replies = read_audit(released["audit"])
    assert {m.metadata.src_node_id for m in replies} == set(clear)
    assert_server_saw_only_masks(replies, clear, residues, plan.modulus)

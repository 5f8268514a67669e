"""Attacks on what leaves a bank (``fedfraud bench attacks``), on real runs.

* the fraud federation's histograms, read off the wire by recording proxies between every bank and the real
  ``xgboost.federated`` server: the server rebuilds a bank's binned amount / hour distribution exactly, far
  closer than the federation's pooled distribution when that bank differs; Laplace noise on the counts moves it;
* the whole bench on a tiny generated federation (real Flower simulation): the membership attack is computed over
  exactly the train-split (member) and held-out cardholders that have a score, the merchant attack reads the banks'
  real replies, and the histogram rows are exact.
"""

from pathlib import Path

import numpy as np
import pytest

from fedfraud.bench.attacks import POOLED, histogram_leak, run_attacks_bench
from fedfraud.config import FedfraudConfig
from fedfraud.feature_store.layout import list_banks, read_bank, split_of
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.training.data.synthetic import generate_dataset
from fedfraud.training.fraud.config import FraudConfig
from fedfraud.training.fraud.features import FraudFeatures
from tests.integration.tiny_run import TINY_RUN

pytestmark = pytest.mark.integration

NAMES = ("amount", "hour_utc", "n_prior", "anomaly_score")


def _banks(sizes=(1500, 1200, 1000), seed=0):
    """Bank 0 spends more and only in the evening; the others alike."""
    rng = np.random.default_rng(seed)
    banks = {}
    for b, n in enumerate(sizes):
        amount = rng.lognormal(5.0 if b == 0 else 3.5, 1.0, n)
        hour = rng.integers(18, 24, n) if b == 0 else rng.integers(0, 24, n)
        X = np.c_[amount, hour, rng.integers(0, 50, n), np.full(n, np.nan)].astype(np.float32)
        X[rng.random(n) < 0.05, 0] = np.nan  # a missing amount is in no bin
        y = (rng.random(n) < 0.05).astype(np.float32)
        split = np.where(rng.random(n) < 0.2, "valid", "train").astype(object)
        ids = np.asarray([f"b{b}-{i}" for i in range(n)], dtype=object)
        cards = np.asarray([f"c{b}-{i % 40}" for i in range(n)], dtype=object)
        banks[b] = FraudFeatures(X, NAMES, ids, cards, y, split)
    return banks


@pytest.mark.slow
def test_server_rebuilds_a_banks_distributions_from_its_real_histograms(tmp_path):
    banks = _banks()
    leak = histogram_leak(banks, FraudConfig(nthread=1, threshold_bins=50), tmp_path, epsilons=(0.1,), draws=20)
    assert leak.n_features == 3  # the base job leaves the anomaly score out
    for bh in leak.banks:
        data = banks[bh.bank]
        train = data.split == "train"
        # the decoded counts are the bank's training rows with a value, bin by bin
        assert bh.rows == int(train.sum())
        assert abs(bh.reconstructed["amount"].sum() - np.isfinite(data.X[train, 0]).sum()) < 1e-3
        np.testing.assert_allclose(bh.reconstructed["hour_utc"], bh.truth["hour_utc"], atol=1e-3)
        exact, pooled = leak.per_bank[bh.bank]["amount"]
        assert exact < 1e-6 and leak.per_bank[bh.bank]["hour_utc"][0] < 1e-6
    # the differing bank is far from the pooled guess, which is all a server would learn from the sum
    assert leak.per_bank[0]["amount"][1] > 0.3 and leak.per_bank[0]["hour_utc"][1] > 0.3
    noised = next(v for k, v in leak.tv.items() if "ε=0.1 per transaction" in k)
    exact_row = next(v for k, v in leak.tv.items() if k.startswith("server reads"))
    assert noised["amount"].low > exact_row["amount"].high + 0.05
    assert POOLED in leak.tv


@pytest.mark.long  # ~2 min: a Flower simulation on Ray, scoring, the XGBoost federation
def test_attacks_bench_end_to_end_on_a_tiny_federation(tmp_path):
    data = tmp_path / "data"
    generate_dataset(data, GeneratorConfig(banks=2, cardholders=30, days=21, fraud_rate=0.05, seed=4),
                     raw_csv=False, progress=False)
    bench = run_attacks_bench(None, tmp_path / "work", epsilons=(float("inf"),), data=data, resamples=50,
                              overrides={**TINY_RUN, "rounds": 1}, max_per_cardholder=20)
    (result,) = bench.membership
    assert result.card.get("dp") != "on"
    # members / non-members: exactly the cardholders with a score, by their split
    # a cardholder's first transaction has no transition to score, so a cardholder needs two to be counted
    n_tx = {c: n for b in list_banks(data) for c, n in read_bank(data, b)["cardholder_id"].astype(str)
            .value_counts().items()}
    scored = [split_of(c, val_fraction=0.15) for c, n in n_tx.items() if n >= 2]
    assert (result.members, result.non_members) == (scored.count("train"), len(scored) - scored.count("train"))
    assert result.members > 0 and result.non_members > 0
    assert 0.0 <= result.auc.low <= result.auc.value <= result.auc.high <= 1.0
    # the histogram attack on the real fraud federation of the same banks: exact reconstruction
    assert bench.histograms is not None
    assert all(per[f][0] < 1e-6 for per in bench.histograms.per_bank.values() for f in ("amount", "hour_utc"))
    # merchant membership from the banks' real round-1 replies: only visited rows move, so the bank's own update
    # beats a coin; every (bank, bucket) pair is counted
    own = next(r for r in bench.merchants if r.view.startswith("server reads the bank's own update"))
    assert own.auc.low > 0.5 and own.pairs == 2 * TINY_RUN["encoder-merchant-buckets"] and own.visited > 0
    md = bench.to_markdown()
    for title in ("### 1. Membership inference", "### 2. What the server learns", "### 3. Merchant membership",
                  "### 4. What a perfect inversion", "no-information baseline",
                  "SecAgg of the histograms", "not in the product"):
        assert title in md, title
    # reruns reuse the published model instead of training again
    again = run_attacks_bench(None, tmp_path / "work", epsilons=(float("inf"),), data=data, resamples=50,
                              overrides={**TINY_RUN, "rounds": 1}, max_per_cardholder=20, histograms=False)
    assert again.membership[0].auc == result.auc
    assert Path(tmp_path / "work" / "registry-attacks-inf").is_dir()


def test_inversion_only_trains_nothing_and_decodes_the_generated_banks(tmp_path):
    data = tmp_path / "data"
    generate_dataset(data, GeneratorConfig(banks=2, cardholders=30, days=21, fraud_rate=0.05, seed=4),
                     raw_csv=False, progress=False)
    bench = run_attacks_bench(None, tmp_path / "work", data=data, resamples=50, inversion_only=True,
                              inversion_rows=200, config=FedfraudConfig(privacy={"secret_seed": "inversion"}))
    assert not bench.membership and not bench.merchants and bench.histograms is None
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").glob("registry-*"))
    inv = bench.inversion
    assert inv is not None and inv.rows == 200 and inv.banks == 2
    train = {c for b in list_banks(data) for c in read_bank(data, b)["cardholder_id"].astype(str)
             if split_of(c, val_fraction=0.15) == "train"}
    assert inv.cardholders <= len(train)
    clean = next(v for k, v in inv.location.items() if k.startswith("clean") and "every true place" in k)
    base = next(v for k, v in inv.location.items() if k.startswith("no-information"))
    assert clean["median km"].value == 0.0 and base["median km"].value > clean["median km"].value
    md = bench.to_markdown()
    assert "### 4. What a perfect inversion" in md and "### 1." not in md and "Load average at start / end" in md

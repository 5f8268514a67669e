"""Issue 35, part 3: the merchant-risk columns serving reads from Feast are the ones training computed.

Real parts: the project generator's dataset (its compromised-merchant scenario), the daily job
(``publish_release``) writing the ``merchant_risk`` view of a real Feast repo (SQLite and the running Redis),
the replica's own online read (``OnlineStateClient.read_batch``, the call ``AnomalyStage.begin`` makes) and the
fraud stage's column builder. Training's columns come from the day-by-day replay (``dataset_columns``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from fedfraud.config import FedfraudConfig
from fedfraud.feature_store.encoders import timestamps_us
from fedfraud.feature_store.layout import list_banks, read_bank
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.training.data.synthetic import generate_dataset
from fedfraud.training.merchant_risk.features import (
    bank_activity,
    dataset_columns,
    merchant_names,
    row_columns,
)
from fedfraud.training.merchant_risk.publish import publish_release
from fedfraud.training.merchant_risk.stats import DAY_S
from tests.prerequisites import require_redis

pytestmark = pytest.mark.integration

REDIS_URL = "127.0.0.1:6379,db=15"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("risk-data")
    generate_dataset(out, GeneratorConfig(banks=3, cardholders=90, days=28, fraud_rate=0.04, seed=11),
                     raw_csv=False, progress=False)
    return out


def _config(noise_multiplier: float) -> FedfraudConfig:
    base = FedfraudConfig()
    features = base.features.model_copy(update={
        "project": f"fedfraud_risk_{os.getpid()}",
        "redis": base.features.redis.model_copy(update={"connection_string": REDIS_URL})})
    risk = base.merchant_risk.model_copy(update={"buckets": 512, "label_delay_days": 3, "release_average": 3})
    noise = base.merchant_noise.model_copy(update={"noise_multiplier": noise_multiplier})
    return base.model_copy(update={"features": features, "merchant_risk": risk, "merchant_noise": noise})


@pytest.mark.parametrize("profile", ["sqlite", "redis"])
@pytest.mark.parametrize("noise_multiplier", [0.0, 5.0])
def test_serving_reads_exactly_the_training_columns_of_the_next_day(dataset, tmp_path, profile, noise_multiplier):
    from fedfraud.feature_store.feast_store import apply_repo, open_store
    from fedfraud.feature_store.offline import MERCHANT_RISK_FILE, MERCHANT_RISK_SCHEMA
    from fedfraud.feature_store.online import OnlineStateClient

    if profile == "redis":
        require_redis()
    import pyarrow.parquet as pq

    cfg = _config(noise_multiplier)
    store = open_store(cfg.features, tmp_path / "repo", profile)
    (tmp_path / "repo" / "data").mkdir(exist_ok=True)
    pq.write_table(MERCHANT_RISK_SCHEMA.empty_table(), tmp_path / "repo" / "data" / MERCHANT_RISK_FILE)
    apply_repo(store)
    try:
        client = OnlineStateClient(store, cfg.egograph, cfg.features.location_cell_deg)
        risk = cfg.merchant_risk
        trained = dataset_columns(dataset, cfg.encoder, cfg.privacy, risk, cfg.merchant_noise,
                                  rng=np.random.default_rng(7))
        banks = list_banks(dataset)
        frames = {b: read_bank(dataset, b) for b in banks}
        release_day = int(frames[banks[0]]["timestamp"].max().value // 1_000_000_000 // DAY_S) - 3
        done = publish_release(cfg, dataset, client, _iso(release_day), rng=np.random.default_rng(7), progress=False)
        assert done.release_day == release_day and all(n > 0 for n in done.rows.values())
        compared = 0
        for b in banks:
            frame = frames[b]
            act = bank_activity(frame, b, cfg.encoder, cfg.privacy, risk)
            bucket = act.bucket[np.argsort(act.row)]  # per row of frame
            day = timestamps_us(frame["timestamp"]) // 1_000_000 // DAY_S
            rows = np.flatnonzero(day == release_day + 1)
            assert rows.size
            _, read = client.read_batch([], b, bucket[rows].tolist())
            served = row_columns(read, risk)
            np.testing.assert_array_equal(served, trained[b][rows])
            assert np.isfinite(served[:, 0]).all()
            compared += rows.size
            # the compromised merchant's victims show in the federation's columns (frauds of other banks' cards)
        assert compared > 20
        assert trained[banks[0]].shape[1] == len(merchant_names(risk))
        if noise_multiplier:
            assert done.card["epsilon_per_release"] != "inf"
    finally:
        store.teardown()


def _iso(day: int) -> str:
    import pandas as pd

    return pd.Timestamp(day * DAY_S, unit="s").date().isoformat()

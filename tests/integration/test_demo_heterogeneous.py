"""``make demo``'s heterogeneous-banks stage on a small generated world (issue 39: "demo: three schemas across
five banks, trained and served"): the generator gives the demographics banks their ``cardholders.parquet``, the
hold-out keeps it, FED-SPFD trains over all five banks, and a demographics bank serves its live tail with its own
model through the replica's hot path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.long]  # `make demo` runs this stage; CI runs `long`


def test_three_schemas_train_and_a_demographics_bank_serves(tmp_path: Path) -> None:
    from fedfraud.bench.serving import publish_bench_models
    from fedfraud.config import FedfraudConfig, update_section
    from fedfraud.demo import DemoArgs, _stage_heterogeneous
    from fedfraud.feature_store.layout import CARDHOLDERS_FILE, bank_dir, read_bank
    from fedfraud.training.data.config import GeneratorConfig
    from fedfraud.training.data.holdout import time_holdout
    from fedfraud.training.data.synthetic import generate_dataset
    from fedfraud.training.registry import ModelRegistry

    cfg = FedfraudConfig()
    data = tmp_path / "data"
    generate_dataset(data, GeneratorConfig(banks=5, cardholders=150, days=21, fraud_rate=0.05, seed=5),
                     raw_csv=False, progress=False, banks_layout=cfg.banks)
    for b in range(5):  # the default layout: banks 1 and 2 hold demographics, and only they get the file
        path = bank_dir(data, b) / CARDHOLDERS_FILE
        assert path.is_file() == (b in (1, 2))
        if path.is_file():
            held = pd.read_parquet(path)
            assert set(held["cardholder_id"]) == set(read_bank(data, b)["cardholder_id"].astype(str))
            assert held[["birth_day", "gender_f", "city_pop", "job_code"]].notna().all().all()
    split = time_holdout(data, tmp_path / "history", 5.0)
    assert (bank_dir(split.history, 1) / CARDHOLDERS_FILE).is_file()

    registry = tmp_path / "registry"
    publish_bench_models(ModelRegistry(registry), read_bank(split.history, 0).head(300), cfg)
    spfd = cfg.fraud.spfd.model_copy(update={"rounds": 3, "warm_rounds": 1})
    cfg = update_section(cfg, "fraud", spfd=spfd)
    # the stage writes the merchant-risk stage's release again from its seed: the same noise, so the same release
    from fedfraud.training.merchant_risk.publish import publish_release

    twice = [publish_release(cfg, split.history, None, rng=np.random.default_rng(7), top=5, progress=False)
             for _ in range(2)]
    pd.testing.assert_frame_equal(twice[0].flagged, twice[1].flagged)
    ctx = {"split": split, "registry": registry, "merchant_risk_seed": 7}
    result = _stage_heterogeneous(cfg, DemoArgs(out=tmp_path / "out"), ctx)

    s = result.summary
    assert s["distinct_schemas"] == 3 and s["served_bank"] == 1
    assert s["served_by"] == s["model"] and s["model"].startswith("fraud-spfd:")
    assert ModelRegistry(registry).get("fraud-spfd", "champion").tag == s["model"]
    assert s["served"] == len(split.live[1]) and 0 <= s["flagged"] <= s["served"]
    assert s["live_frauds"] == int(split.live[1]["is_fraud"].fillna(False).sum())

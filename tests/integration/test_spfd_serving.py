"""A replica deployed with ``fraud.variant: fed-spfd`` decides on the full hot path (anomaly stage, Feast online
store, KV) with its bank's FED-SPFD model (kind ``fraud-spfd``), and refuses another bank's model (issue 39)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    from fedfraud.bench.serving import COLUMNS
    from fedfraud.training.data.config import GeneratorConfig
    from fedfraud.training.data.synthetic import generate_frame

    f, _ = generate_frame(GeneratorConfig(banks=1, cardholders=40, days=20, seed=3))
    return f.sort_values(["timestamp", "transaction_id"]).reset_index(drop=True)[COLUMNS]


def _publish_spfd(reg, cfg, bank: int) -> str:
    """An (untrained) FED-SPFD model of ``bank`` whose private set is the merchant history."""
    from fedfraud.training.fraud.features import feature_names
    from fedfraud.training.fraud.spfd.artifact import SpfdFraudModel
    from fedfraud.training.fraud.spfd.columns import private_columns, shared_columns
    from fedfraud.training.fraud.spfd.task import build_net

    shared = shared_columns(feature_names(cfg.fraud), use_anomaly_score=True)
    private = private_columns(["merchant_history"])
    net = build_net(shared, private, cfg.fraud.spfd, 0)
    arrays = {k: v.detach().numpy() for k, v in net.state_dict().items()}
    version = SpfdFraudModel(arrays, shared, private, cfg.fraud.spfd, 0.5, "fed-spfd", bank).publish(
        reg, config={"fraud": cfg.fraud.model_copy(update={"variant": "fed-spfd"}).model_dump()}, metrics={})
    return version.tag


def test_hot_path_deployed_with_fed_spfd_decides_with_its_banks_model(frame, tmp_path: Path) -> None:
    from fedfraud.bench.serving import publish_bench_models
    from fedfraud.config import FedfraudConfig
    from fedfraud.feature_store.feast_store import apply_repo, open_store
    from fedfraud.serving.config import ScorerConfig
    from fedfraud.serving.hotpath import HotPath
    from fedfraud.training.registry import ModelRegistry

    cfg = FedfraudConfig()
    reg = ModelRegistry(tmp_path / "registry")
    publish_bench_models(reg, frame.head(300), cfg)
    tag = _publish_spfd(reg, cfg, bank=0)
    features = cfg.features.model_copy(update={"repo_dir": str(tmp_path / "repo")})
    serving = cfg.serving.model_copy(update={"registry_root": str(reg.root), "reasons_for": "all"})
    cfg = cfg.model_copy(update={"serving": serving, "features": features,
                                 "fraud": cfg.fraud.model_copy(update={"variant": "fed-spfd"})})
    apply_repo(open_store(cfg.features))
    hot = HotPath(ScorerConfig.of(cfg), None, "fedfraud.serving.anomaly_stage:load_anomaly_scorer")
    try:
        assert hot.models()["fraud"] == tag == "fraud-spfd:v1" and hot.fraud_kind == "fraud-spfd"
        rows = frame.iloc[300:340].reset_index(drop=True)
        records = hot.score(rows, np.arange(1, len(rows) + 1, dtype=np.int64))
        assert len(records) == len(rows) and {r["models"]["fraud"] for r in records} == {tag}
        assert all(0.0 <= r["score"] <= 1.0 and r["decision"] in ("fraud", "legit") and len(r["top_reasons"]) == 3
                   for r in records)
        assert any(r["anomaly_score"] is not None for r in records)
    finally:
        hot.close()
    _publish_spfd(reg, cfg, bank=3)  # the registry's newest is now another bank's model
    with pytest.raises(ValueError, match="bank 3's FED-SPFD model; this replica serves bank 0"):
        HotPath(ScorerConfig.of(cfg), None, "fedfraud.serving.anomaly_stage:load_anomaly_scorer")

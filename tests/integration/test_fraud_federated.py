"""Fraud model end to end: a Sparkov CSV → AS from a real (tiny) anomaly model → six variants incl. one
Flower FedXgbBagging simulation (2 SuperNodes, 3 rounds) → the Table 4.2 markdown; plus publish and score."""

import numpy as np
import pandas as pd
import pytest

from fedfraud.cli.app import main
from feature_store.config import EgoGraphConfig, EncoderConfig, PrivacyConfig
from training.anomaly.config import AnomalyConfig
from training.anomaly.model import AnomalyModel
from training.anomaly.scorer import publish_anomaly_model
from training.data.config import GeneratorConfig, IngestConfig
from training.data.ingest import ingest_csv
from training.data.synthetic import RAW_CSV, generate_dataset
from training.fraud.config import FraudConfig
from training.fraud.dataset import bank_features, load_anomaly_scorer
from training.fraud.model import FraudModel
from training.registry import ModelRegistry

pytestmark = pytest.mark.integration

FAST = ["--set", "fraud.num_boost_round=20", "--set", "fraud.threshold_bins=200"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("fraud")
    data = root / "data"
    generate_dataset(data, GeneratorConfig(banks=2, cardholders=60, days=15, seed=11, fraud_rate=0.03), raw_csv=True,
                     progress=False)
    registry = root / "artifacts"
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    acfg, ego = AnomalyConfig(pooling="topk", layers=2, hidden=16, disc_hidden=16), EgoGraphConfig()
    model = AnomalyModel(acfg, EncoderConfig(), ego.max_nodes)  # untrained but the real architecture and scorer
    publish_anomaly_model(ModelRegistry(registry), model.state_dict(), anomaly_cfg=acfg, encoder_cfg=EncoderConfig(),
                          ego_cfg=ego, config={}, metrics={}, privacy={}, card="test model")
    return {"root": root, "data": data, "csv": data / RAW_CSV, "registry": registry}


def test_eval_stacking_on_sparkov_csv(world, capsys):
    code = main(["--log-level", "WARNING", *FAST, "eval", "stacking", "--data", str(world["csv"]),
                 "--format", "sparkov", "--banks", "2", "--registry", str(world["registry"]), "--rounds", "3"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "| bank | frauds | Local | Local+AS | FL | FL+AS | Central | Central+AS | FL+AS − FL |" in out
    for title in ("F1 at the validation-chosen threshold", "PR-AUC", "Recall at 1% FPR", "stacking gain FL+AS − FL",
                  "federated gap Central+AS − FL+AS", "Targets"):
        assert title in out
    assert "anomaly:v1" in out and "FedXgbBagging, 3 rounds" in out
    rows = [line for line in out.splitlines() if line.startswith("| 0 |") or line.startswith("| 1 |")]
    assert len(rows) == 3 * 2  # two banks in each of the three metric tables


def test_csv_without_labels_is_one_line_error(world, tmp_path, capsys):
    raw = pd.read_csv(world["csv"], sep="|", dtype=str, keep_default_na=False)
    unlabelled = tmp_path / "unlabelled.csv"
    raw.drop(columns=["is_fraud"]).to_csv(unlabelled, sep="|", index=False)
    code = main(["--log-level", "ERROR", "eval", "stacking", "--data", str(unlabelled),
                 "--registry", str(world["registry"])])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: evaluation needs labels")
    # ... but scoring unlabelled transactions works
    assert main(["--log-level", "WARNING", *FAST, "train", "fraud", "--data", str(world["data"]), "--out",
                 str(world["registry"]), "--variant", "centralized"]) == 0
    ingested = tmp_path / "ingested"
    ingest_csv(unlabelled, ingested, IngestConfig(banks=2), progress=False)
    scorer, _ = load_anomaly_scorer(world["registry"])
    feats = bank_features(ingested, 0, FraudConfig(), EncoderConfig(), PrivacyConfig(), scorer)
    assert not feats.has_labels and np.isfinite(feats.X[:, -1]).mean() > 0.5
    model = FraudModel.from_registry(world["registry"])
    decisions = model.predict_batch(feats.X[:25])
    assert len(decisions) == 25 and all(0 <= d.score <= 1 and len(d.top_reasons) == 3 for d in decisions)


def test_no_anomaly_model_is_one_line_error(world, tmp_path, capsys):
    code = main(["--log-level", "ERROR", "eval", "stacking", "--data", str(world["data"]),
                 "--registry", str(tmp_path / "empty")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "fedfraud train anomaly" in err[0]

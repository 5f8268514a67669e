"""The GNN fraud variants through the CLI (minutes: ``make test-long``).

* ``eval variants`` on a generated Sparkov-layout CSV prints the comparison (every row, federated XGBoost + hin2vec
  included, pooled and per bank);
* ``train fraud --variant fedrpda`` (Flower's simulation engine on Ray) and ``--variant fedavg-gnn`` (loopback)
  publish kind ``fraud-gnn``, which loads and scores; kind ``fraud`` (what serving loads) is left alone.
"""

import numpy as np
import pytest
import torch

from fedfraud.cli.app import main
from fedfraud.feature_store.config import EgoGraphConfig, EncoderConfig
from fedfraud.training.anomaly.config import AnomalyConfig
from fedfraud.training.anomaly.model import AnomalyModel
from fedfraud.training.anomaly.scorer import publish_anomaly_model
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.training.data.synthetic import RAW_CSV, generate_dataset
from fedfraud.training.fraud.gnn.artifact import KIND, GnnFraudModel
from fedfraud.training.registry import ModelRegistry

pytestmark = [pytest.mark.integration, pytest.mark.long]

FAST = ["--set", "fraud.num_boost_round=20", "--set", "fraud.threshold_bins=200", "--set", "fraud.gnn.rounds=2",
        "--set", "fraud.gnn.hidden=16"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("gnn-variants")
    data = root / "data"
    generate_dataset(data, GeneratorConfig(banks=2, cardholders=80, days=21, seed=13, fraud_rate=0.04), raw_csv=True,
                     progress=False)
    registry = root / "artifacts"
    torch.manual_seed(0)
    acfg, ego = AnomalyConfig(pooling="topk", layers=2, hidden=16, disc_hidden=16), EgoGraphConfig()
    model = AnomalyModel(acfg, EncoderConfig(), ego.max_nodes)  # untrained, the real architecture and scorer
    publish_anomaly_model(ModelRegistry(registry), model.state_dict(), anomaly_cfg=acfg, encoder_cfg=EncoderConfig(),
                          ego_cfg=ego, config={}, metrics={}, privacy={}, card="test model")
    return {"data": data, "csv": data / RAW_CSV, "registry": registry}


def test_eval_variants_prints_every_row_pooled_and_per_bank(world, capsys):
    code = main(["--log-level", "WARNING", *FAST, "--set", "hin2vec.rounds=1", "eval", "variants", "--data",
                 str(world["csv"]), "--format", "sparkov", "--bank-shares", "0.7,0.3", "--seeds", "1", "--reps", "50",
                 "--no-tune"])
    out = capsys.readouterr().out
    assert code == 0, out
    for row in ("| federated XGBoost |", "| federated XGBoost + hin2vec |",
                "| federated XGBoost + hin2vec − federated XGBoost |", "the hin2vec columns add", "| FedAvg-GNN |",
                "| FedRPDA |", "| FedRPDA − RA |", "| FedRPDA − DRA |",
                "| FedRPDA − FedAvg-GNN |", "| RA only (FedRPDA − DRA) − FedAvg-GNN |", "**Per bank, PR-AUC**",
                "**Per bank, recall@1%FPR**", "**Per bank, F1-macro**",
                "**The paper's claims and the issue's targets, in plain numbers**",
                "test frauds=", "bank shares 0.7,0.3", "on the smallest bank (1, 30%)"):
        assert row in out, row
    assert sum(line.startswith("| 1 | 30% |") for line in out.splitlines()) == 3  # one row per metric table


def test_train_fraud_publishes_the_gnn_variants(world, capsys):
    registry = world["registry"]
    code = main(["--log-level", "WARNING", *FAST, "train", "fraud", "--data", str(world["data"]), "--out",
                 str(registry), "--variant", "fedrpda"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "published fraud-gnn:v1 variant=fedrpda" in out and "test_pr_auc=" in out
    model = GnnFraudModel.from_registry(registry)
    assert model.variant == "fedrpda" and model.meta["engine"] == "simulation"
    assert "anomaly_score" in model.used  # as the XGBoost model, with the registry's anomaly score
    version = ModelRegistry(registry).get(KIND, "latest")
    assert version.metrics["test_frauds"] > 0 and np.isfinite(version.metrics["test_f1_macro"])
    assert ModelRegistry(registry).latest("fraud") is None  # serving's kind untouched
    code = main(["--log-level", "WARNING", *FAST, "--set", "fraud.gnn.engine=loopback", "train", "fraud", "--data",
                 str(world["data"]), "--out", str(registry), "--variant", "fedavg-gnn"])
    out = capsys.readouterr().out
    assert code == 0 and "published fraud-gnn:v2 variant=fedavg-gnn" in out, out
    assert GnnFraudModel.from_registry(registry).cfg.risk_aware_aggregation is False

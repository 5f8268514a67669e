"""``fedfraud train fraud --variant fedavg-gnn|fedrpda``: train the federated GNN and publish it (kind ``fraud-gnn``).

The same inputs as the XGBoost path (:func:`fedfraud.training.fraud.pipeline.load_fraud_banks`: the feature rows
with the registry's anomaly score and the merchant-risk columns), each bank's rows made into its transaction graph
(:mod:`.graph`); one federated job (``fraud.gnn``; the simulation engine by default); test metrics on every bank's
test cardholders; the model goes to the registry under kind ``fraud-gnn``, beside (not instead of) the XGBoost
model, with the serving bank's category-transition table; a replica with the same ``fraud.variant`` serves it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedfraud.training.fraud.features import FraudFeatures
from fedfraud.training.registry import ModelRegistry, ModelVersion

if TYPE_CHECKING:
    from fedfraud.config import FedfraudConfig

__all__ = ["train_and_publish_gnn"]

logger = logging.getLogger(__name__)


def train_and_publish_gnn(cfg: FedfraudConfig, banks: dict[int, FraudFeatures], info: dict[str, Any], out: Path,
                          bank: int = 0) -> tuple[ModelVersion, dict[str, Any]]:
    """Train ``cfg.fraud.variant`` (``fedavg-gnn`` or ``fedrpda``) over every bank and publish it under ``out``.

    ``banks`` and ``info``: :func:`fedfraud.training.fraud.pipeline.load_fraud_banks` (``info["root"]``: the
    dataset folder, read for each bank's cardholders and merchants).
    """
    from fedfraud.feature_store.layout import read_bank
    from fedfraud.training.fraud.gnn.graph import build_graph
    from fedfraud.training.fraud.gnn.study import macro_f1
    from fedfraud.training.fraud.gnn.trainer import train_gnn_jobs, variant_job
    from fedfraud.training.fraud.metrics import classification_metrics

    fc = cfg.fraud
    graphs = {b: build_graph(f, read_bank(info["root"], b), fc.gnn.neighbors, b) for b, f in banks.items()}
    model = train_gnn_jobs(graphs, fc, [variant_job(fc.variant, 0, name=fc.variant)])[fc.variant]
    model.transitions = banks[bank].transitions if bank in banks else None  # what serving computes its column with
    order = sorted(graphs)
    tests = {b: graphs[b].mask("test") for b in order}
    scores = np.concatenate([model.scores(graphs[b], tests[b]) for b in order])
    label = np.concatenate([banks[b].label[tests[b]] for b in order])
    m = classification_metrics(label, scores, model.threshold, fc.fpr_target)
    metrics: dict[str, Any] = {
        "test_f1": m.f1, "test_f1_macro": macro_f1(label, scores >= model.threshold), "test_pr_auc": m.pr_auc,
        "test_recall_at_fpr": m.recall_at_fpr, "test_precision": m.precision, "test_recall": m.recall,
        "test_rows": m.n, "test_frauds": m.n_pos, "valid_f1": float(model.meta["valid_f1"]),
        "valid_pr_auc": float(model.meta["valid_pr_auc"]), "threshold": model.threshold,
        "train_seconds": float(model.meta["seconds"]),
    }
    if bank in graphs:  # the bank's-eye figure
        own = classification_metrics(banks[bank].label[tests[bank]], model.scores(graphs[bank], tests[bank]),
                                     model.threshold, fc.fpr_target)
        metrics[f"bank{bank}_pr_auc"] = own.pr_auc
        metrics[f"bank{bank}_recall_at_fpr"] = own.recall_at_fpr
        metrics[f"bank{bank}_test_frauds"] = own.n_pos
    config = {"fraud": fc.model_dump(), "encoder": cfg.encoder.model_dump(), "anomaly_model": info["anomaly_model"],
              "data": info["data"], "banks": order}
    if fc.merchant_risk_features:
        config["merchant_risk"] = cfg.merchant_risk.model_dump(mode="json")
        config["merchant_noise"] = cfg.merchant_noise.model_dump(mode="json")
    version = model.publish(ModelRegistry(Path(out)), config=config, metrics=metrics)
    logger.info("fraud_gnn_train published=%s variant=%s test_pr_auc=%.4f test_f1_macro=%.4f", version.tag,
                fc.variant, m.pr_auc, metrics["test_f1_macro"])
    return version, metrics

"""``fedfraud train fraud --variant fed-spfd``: train FED-SPFD over heterogeneous banks, publish one bank's model.

The same inputs as the other variants (:func:`fedfraud.training.fraud.pipeline.load_fraud_banks`), each bank's
table extended with its private columns (``banks.<k>.private_features``, :mod:`.columns`); one federated job
(``fraud.spfd``; the simulation engine by default); test metrics pooled over every bank's test cardholders and
for the serving bank; the serving bank's model (shared encoder + its private autoencoder + classifier) goes to the
registry as kind ``fraud-spfd``, with its category-transition table.
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
    from fedfraud.training.fraud.spfd.artifact import SpfdFraudModel

__all__ = ["heterogeneous_tables", "model_rows", "train_and_publish_spfd"]

logger = logging.getLogger(__name__)


def heterogeneous_tables(cfg: FedfraudConfig, banks: dict[int, FraudFeatures], root: Path
                         ) -> tuple[dict[int, FraudFeatures], dict[int, tuple[str, ...]]]:
    """Each bank's table (its feature rows plus its demographics) and its private columns, from ``cfg.banks``."""
    from fedfraud.feature_store.layout import read_bank
    from fedfraud.training.fraud.spfd.columns import bank_table, private_columns

    tables, private = {}, {}
    for b, feats in banks.items():
        sets = cfg.banks.private_features(b)
        frame = read_bank(root, b, columns=["cardholder_id", "timestamp"]) if "demographics" in sets else None
        tables[b] = bank_table(feats, frame, sets, root, b) if frame is not None else feats
        private[b] = private_columns(sets)
    return tables, private


def model_rows(model: SpfdFraudModel, table: FraudFeatures, mask: np.ndarray | None = None) -> np.ndarray:
    """The rows of ``table`` in the model's ``input_names`` order (the ``mask`` rows)."""
    X = table.X[:, [table.names.index(n) for n in model.input_names]]
    return X if mask is None else X[mask]


def train_and_publish_spfd(cfg: FedfraudConfig, banks: dict[int, FraudFeatures], info: dict[str, Any], out: Path,
                           bank: int = 0) -> tuple[ModelVersion, dict[str, Any]]:
    """Train FED-SPFD over every bank and publish ``bank``'s model under ``out``.

    ``banks`` and ``info``: :func:`fedfraud.training.fraud.pipeline.load_fraud_banks` (``info["root"]``: the
    dataset folder, read for the demographics).
    """
    from fedfraud.core.errors import UserError
    from fedfraud.training.fraud.gnn.study import macro_f1
    from fedfraud.training.fraud.metrics import classification_metrics
    from fedfraud.training.fraud.spfd.trainer import spfd_job, train_spfd_jobs

    if bank not in banks:
        raise UserError(f"--bank {bank} is not in the data (banks: {sorted(banks)})")
    fc = cfg.fraud
    tables, private = heterogeneous_tables(cfg, banks, Path(info["root"]))
    models = train_spfd_jobs(tables, private, fc, [spfd_job("fed-spfd", 0, name="fed-spfd")])["fed-spfd"]
    order = sorted(tables)
    tests = {b: tables[b].split == "test" for b in order}
    scores = {b: models[b].scores(model_rows(models[b], tables[b], tests[b])) for b in order}
    label = np.concatenate([tables[b].label[tests[b]] for b in order])
    pooled = np.concatenate([scores[b] for b in order])
    model = models[bank]
    m = classification_metrics(label, pooled, model.threshold, fc.fpr_target)
    own = classification_metrics(tables[bank].label[tests[bank]], scores[bank], model.threshold, fc.fpr_target)
    metrics: dict[str, Any] = {
        "test_f1": m.f1, "test_f1_macro": macro_f1(label, pooled >= model.threshold), "test_pr_auc": m.pr_auc,
        "test_recall_at_fpr": m.recall_at_fpr, "test_rows": m.n, "test_frauds": m.n_pos,
        f"bank{bank}_pr_auc": own.pr_auc, f"bank{bank}_recall_at_fpr": own.recall_at_fpr,
        f"bank{bank}_test_frauds": own.n_pos, "valid_f1": float(model.meta["valid_f1"]),
        "valid_pr_auc": float(model.meta["valid_pr_auc"]), "threshold": model.threshold,
        "train_seconds": float(model.meta["seconds"]),
    }
    config = {"fraud": fc.model_dump(), "encoder": cfg.encoder.model_dump(), "anomaly_model": info["anomaly_model"],
              "data": info["data"], "banks": order,
              "bank_layout": {str(b): list(cfg.banks.private_features(b)) for b in order}}
    if fc.merchant_risk_features:
        config["merchant_risk"] = cfg.merchant_risk.model_dump(mode="json")
        config["merchant_noise"] = cfg.merchant_noise.model_dump(mode="json")
    version = model.publish(ModelRegistry(Path(out)), config=config, metrics=metrics)
    logger.info("fraud_spfd_train published=%s bank=%d test_pr_auc=%.4f bank_pr_auc=%.4f", version.tag, bank,
                m.pr_auc, own.pr_auc)
    return version, metrics

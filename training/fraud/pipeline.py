"""End-to-end jobs behind the CLI: data (dir or CSV) → features with AS → train → evaluate / publish."""

from __future__ import annotations

import logging
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from training.fraud.dataset import dataset_features, load_anomaly_scorer, materialize
from training.fraud.features import ANOMALY_FEATURE, FraudFeatures
from training.fraud.metrics import classification_metrics
from training.registry import ModelRegistry, ModelVersion

if TYPE_CHECKING:
    from fedfraud.config import FedfraudConfig
    from training.fraud.evaluate import StackingReport
    from training.fraud.model import FraudModel

__all__ = ["load_fraud_banks", "stacking_study", "train_and_publish"]

logger = logging.getLogger(__name__)


def load_fraud_banks(cfg: FedfraudConfig, data: Path, registry: Path, anomaly_version: str, stack: ExitStack,
                     require_labels: bool) -> tuple[dict[int, FraudFeatures], dict[str, Any]]:
    """Features of every bank of ``data`` with the registry's anomaly model as the AS column.

    ``stack`` keeps a CSV's temporary dataset alive for as long as the caller needs it.
    """
    scorer, tag = load_anomaly_scorer(registry, anomaly_version)
    root = stack.enter_context(materialize(data, cfg.ingest))
    banks = dataset_features(root, cfg.fraud, cfg.encoder, cfg.privacy, scorer, require_labels=require_labels)
    rows = sum(len(b) for b in banks.values())
    col = next(iter(banks.values())).names.index(ANOMALY_FEATURE)
    info: dict[str, Any] = {
        "data": str(data), "rows": rows, "anomaly_model": tag,
        "frauds": int(sum(np.nansum(b.label) for b in banks.values())),
        "as_coverage": float(sum(np.isfinite(b.X[:, col]).sum() for b in banks.values()) / max(rows, 1)),
    }
    return banks, info


def stacking_study(cfg: FedfraudConfig, data: Path, registry: Path, anomaly_version: str = "latest",
                   num_cpus: int = 2) -> StackingReport:
    """``fedfraud eval stacking``: the six variants on ``data`` (labels required)."""
    from training.fraud.evaluate import run_stacking

    with ExitStack() as stack:
        banks, info = load_fraud_banks(cfg, data, registry, anomaly_version, stack, require_labels=True)
        if len(banks) < 2:
            from fedfraud.errors import UserError

            raise UserError(f"{data} holds {len(banks)} bank; the federated variants need at least 2 (use --banks)")
        return run_stacking(banks, cfg.fraud, num_cpus=num_cpus, info=info)


def _train_variant(cfg: FedfraudConfig, banks: dict[int, FraudFeatures], bank: int) -> FraudModel:
    from training.fraud.train import train_centralized, train_federated, train_local

    fc = cfg.fraud
    if fc.variant == "local":
        if bank not in banks:
            from fedfraud.errors import UserError

            raise UserError(f"--bank {bank} is not in the data (banks: {sorted(banks)})")
        return train_local(banks[bank], fc.use_anomaly_score, fc, bank)
    if fc.variant == "centralized":
        return train_centralized(banks, fc.use_anomaly_score, fc)
    return train_federated(banks, fc, ("as" if fc.use_anomaly_score else "base",))[
        "as" if fc.use_anomaly_score else "base"
    ]


def train_and_publish(cfg: FedfraudConfig, data: Path, out: Path, bank: int = 0,
                      anomaly_version: str = "latest") -> tuple[ModelVersion, dict[str, Any]]:
    """``fedfraud train fraud``: train ``cfg.fraud.variant`` and publish it as kind ``fraud`` under ``out``."""
    with ExitStack() as stack:
        banks, info = load_fraud_banks(cfg, data, out, anomaly_version, stack, require_labels=True)
        model = _train_variant(cfg, banks, bank)
        tests = [b.of_split("test") for b in (banks.values() if cfg.fraud.variant != "local" else [banks[bank]])]
        test = FraudFeatures.concat(tests)
        m = classification_metrics(test.label, model.scores(test.X), model.threshold, cfg.fraud.fpr_target)
        metrics: dict[str, Any] = {
            "test_f1": m.f1, "test_pr_auc": m.pr_auc, "test_recall_at_fpr": m.recall_at_fpr,
            "test_precision": m.precision, "test_recall": m.recall, "test_rows": m.n, "test_frauds": m.n_pos,
            "valid_f1": float(model.meta.get("valid_f1", float("nan"))), "threshold": model.threshold,
        }
        privacy = {
            "inputs": "noised L'/T' (personalized LDP private shuffle, Algorithm 3) + the bank's own amount, MCC, "
                      "timestamp and merchant bucket; AS from the federated anomaly model",
            "epsilon_range": [cfg.privacy.epsilon_min, cfg.privacy.epsilon_max], "delta": cfg.privacy.delta,
            "leaves_a_bank": "federated: XGBoost trees and validation score histograms; never rows",
        }
        config = {"fraud": cfg.fraud.model_dump(), "encoder": cfg.encoder.model_dump(),
                  "anomaly_model": info["anomaly_model"], "data": info["data"], "banks": sorted(banks)}
        version = model.publish(ModelRegistry(out), config=config, metrics=metrics, privacy=privacy)
    logger.info("fraud_train published=%s variant=%s test_f1=%.4f test_pr_auc=%.4f", version.tag,
                cfg.fraud.variant, m.f1, m.pr_auc)
    return version, metrics

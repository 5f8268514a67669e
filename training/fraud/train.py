"""Train the fraud model: each bank alone, federated, centralized (upper bound).

Federated has two implementations: histogram federation
(:mod:`fedfraud.training.fraud.federated.hist`, the default: the centralized model's
trees without pooling rows) and Flower FedXgbBagging (:func:`train_federated`,
kept for comparison as variant ``federated-bagging``).

All three share the features (:mod:`fedfraud.training.fraud.features`), the XGBoost
parameters (:func:`fedfraud.training.fraud.model.xgb_params`) and the threshold rule
(max F1 on validation cardholders, :mod:`fedfraud.training.fraud.metrics`); only where
the data sits differs.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from fedfraud.training.fraud.config import FraudConfig
from fedfraud.training.fraud.features import FraudFeatures
from fedfraud.training.fraud.model import FraudModel, fit_model, used_features

__all__ = ["FEATURE_SETS", "train_centralized", "train_federated", "train_local"]

logger = logging.getLogger(__name__)

#: Feature-set name → whether the anomaly score is a model input.
FEATURE_SETS: dict[str, bool] = {"base": False, "as": True}


def train_local(data: FraudFeatures, use_anomaly_score: bool, cfg: FraudConfig, bank: int | None = None) -> FraudModel:
    """One bank alone: its training cardholders fit, its validation cardholders set the threshold."""
    return fit_model(data.of_split("train"), data.of_split("valid"), use_anomaly_score, cfg, "local",
                     {"bank": bank})


def train_centralized(banks: dict[int, FraudFeatures], use_anomaly_score: bool, cfg: FraudConfig) -> FraudModel:
    """All banks' rows pooled in one place: the upper bound federated training is measured against."""
    pooled = FraudFeatures.concat(list(banks.values()))
    return fit_model(pooled.of_split("train"), pooled.of_split("valid"), use_anomaly_score, cfg, "centralized",
                     {"banks": sorted(banks)})


def train_federated(
    banks: dict[int, FraudFeatures],
    cfg: FraudConfig,
    feature_sets: Sequence[str] = ("base", "as"),
    num_cpus: int = 2,
    rounds: int | None = None,
) -> dict[str, FraudModel]:
    """FedXgbBagging across the banks in a Flower simulation (one SuperNode per bank, Ray backend).

    Variant ``federated-bagging``; the default ``federated`` is histogram federation
    (:func:`fedfraud.training.fraud.federated.hist.federated_hist_train`).

    Returns one model per feature set (``"base"``: no AS, ``"as"``: with AS),
    each with the threshold the server chose from the banks' validation histograms.
    """
    import xgboost as xgb
    from flwr.simulation import run_simulation

    from fedfraud.core.net import ray_bind

    from fedfraud.training.fraud.federated.client_app import app as client_app
    from fedfraud.training.fraud.federated.server_app import FederatedFraudResult, build_server_app
    from fedfraud.training.fraud.federated.task import bank_file, write_index

    unknown = [f for f in feature_sets if f not in FEATURE_SETS]
    if unknown:
        raise ValueError(f"unknown feature sets {unknown}; choose from {sorted(FEATURE_SETS)}")
    if len(banks) < 2:
        raise ValueError("federated training needs at least 2 banks")
    order = sorted(banks)
    rounds = cfg.federated_rounds if rounds is None else rounds
    eta = cfg.eta / len(order) if cfg.federated_eta_scaling else cfg.eta
    names = next(iter(banks.values())).names
    results: dict[str, FederatedFraudResult] = {}
    with tempfile.TemporaryDirectory(prefix="fedfraud-fl-") as tmp:
        folder = Path(tmp)
        for b in order:
            banks[b].save(str(bank_file(folder, b)))
        write_index(folder, order)
        settings = {
            "features-dir": str(folder), "result-dir": "", "fraud-config": cfg.model_dump_json(),
            "feature-sets": list(feature_sets), "num-supernodes": len(order), "num-rounds": rounds, "eta": eta,
            "threshold-bins": cfg.threshold_bins,
        }
        started = time.perf_counter()
        run_simulation(
            server_app=build_server_app(settings, on_result=results.update),
            client_app=client_app,
            num_supernodes=len(order),
            backend_config={
                "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                "init_args": {"num_cpus": min(num_cpus, 2), "logging_level": "ERROR", **ray_bind()},  # loopback
            },
        )
        wall = time.perf_counter() - started
    models: dict[str, FraudModel] = {}
    for fs in feature_sets:
        if fs not in results:
            raise RuntimeError(f"the Flower ServerApp produced no {fs!r} model (see the log above)")
        done = results[fs]
        booster = xgb.Booster()
        booster.load_model(bytearray(done.model))
        booster.set_param({"nthread": cfg.nthread})
        models[fs] = FraudModel(booster, names, used_features(names, FEATURE_SETS[fs]), done.threshold,
                                "federated", {"banks": order, "rounds": rounds, "eta": eta,
                                              "valid_f1": done.valid_f1, "seconds": done.seconds})
    logger.info("fraud_federated banks=%d rounds=%d feature_sets=%s wall_s=%.1f", len(order), rounds,
                ",".join(feature_sets), wall)
    return models

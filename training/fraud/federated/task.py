"""What a bank does in federated fraud training: load its features, boost one tree, report score histograms.

Each simulated bank (SuperNode ``partition-id`` k) reads ``bank_<k>.npz``
(:meth:`FraudFeatures.save`) from the features folder named in the message
config; in a deployment it would be the bank's own feature store. Only trees
(split thresholds on feature values and leaf weights) and validation score
histograms leave a bank.
"""

from __future__ import annotations

import json
import logging
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from fedfraud.training.fraud.config import FraudConfig
from fedfraud.training.fraud.features import FraudFeatures
from fedfraud.training.fraud.model import to_dmatrix, pos_weight, used_features, xgb_params

__all__ = [
    "INDEX_FILE",
    "NODE_FEATURES_FILE",
    "bank_file",
    "boost_one_round",
    "load_node_features",
    "load_partition",
    "validation_histograms",
    "write_index",
]

logger = logging.getLogger(__name__)

INDEX_FILE = "index.json"
#: This bank's fraud features in its own data folder, for a SuperNode of a deployed federation.
NODE_FEATURES_FILE = "fraud-features.npz"


def bank_file(folder: Path, bank: int) -> Path:
    return Path(folder) / f"bank_{bank}.npz"


def write_index(folder: Path, banks: list[int]) -> None:
    """Record which bank each partition id is (partition k → ``banks[k]``)."""
    (Path(folder) / INDEX_FILE).write_text(json.dumps({"banks": banks}), encoding="utf-8")


@lru_cache(maxsize=8)
def load_partition(folder: str, partition_id: int) -> FraudFeatures:
    """This SuperNode's bank, cached for the life of the simulation worker."""
    banks = json.loads((Path(folder) / INDEX_FILE).read_text(encoding="utf-8"))["banks"]
    return FraudFeatures.load(str(bank_file(Path(folder), banks[partition_id])))


@lru_cache(maxsize=2)
def load_node_features(data_dir: str) -> FraudFeatures:
    """A deployed SuperNode's bank: ``<data-dir>/fraud-features.npz`` of its node config, its own folder only."""
    path = Path(data_dir) / NODE_FEATURES_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: save this bank's FraudFeatures there (FraudFeatures.save)")
    return FraudFeatures.load(str(path))


def boost_one_round(data: FraudFeatures, cfg: FraudConfig, use_as: bool, eta: float, global_model: bytes) -> bytes:
    """Add one tree to the global model on this bank's training rows; return only the new tree (bagging)."""
    import xgboost as xgb

    train = data.of_split("train")
    used = used_features(data.names, use_as)
    params = xgb_params(cfg, pos_weight(train.label, cfg.max_scale_pos_weight), eta=eta)
    dtrain = to_dmatrix(train, used)
    if not global_model:
        bst = xgb.train(params, dtrain, num_boost_round=1)
    else:
        bst = xgb.Booster(params=params)
        bst.load_model(bytearray(global_model))
        bst.set_param(params)
        bst.update(dtrain, bst.num_boosted_rounds())
        bst = bst[bst.num_boosted_rounds() - 1 : bst.num_boosted_rounds()]
    return bytes(bst.save_raw("json"))


def validation_histograms(data: FraudFeatures, use_as: bool, model: bytes, bins: int) -> tuple[np.ndarray, ...]:
    """Positive and negative score histograms of this bank's validation rows under the global model."""
    import xgboost as xgb

    from fedfraud.training.fraud.metrics import score_histograms

    valid = data.of_split("valid")
    bst = xgb.Booster()
    bst.load_model(bytearray(model))
    scores = bst.predict(to_dmatrix(valid, used_features(data.names, use_as)))
    return score_histograms(valid.label, scores, bins)


def fraud_config(record: Any) -> FraudConfig:
    """The run's :class:`FraudConfig`, sent by the server as JSON in the message config."""
    return FraudConfig.model_validate_json(str(record["fraud-config"]))

"""A cardholder's mutable feature state and the one per-transaction update shared by offline and online.

:func:`prepare_batch` turns canonical rows into the per-row values both paths
need (private features from the bank's featurizer, merchant hashes, µs
timestamps), sorted by (timestamp, transaction_id). :meth:`CardholderState.apply`
folds one row into the ego graph, the activity aggregates and the latest
embedding. The offline writer (:mod:`fedfraud.feature_store.offline`) and the online
path (:mod:`fedfraud.feature_store.online`) both call exactly these two functions, so
training and serving features cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from fedfraud.feature_store.activity import Activity
from fedfraud.feature_store.config import EgoGraphConfig
from fedfraud.feature_store.egograph import EgoGraphState
from fedfraud.feature_store.encoders import timestamps_us
from fedfraud.feature_store.privacy import PrivateFeatures, PrivateFeaturizer
from fedfraud.feature_store.schema import event_order

__all__ = ["CardholderState", "PreparedBatch", "merchant_key", "prepare_batch"]

_COLUMNS = ("transaction_id", "cardholder_id", "merchant_id", "timestamp", "amount", "lat", "lon", "mcc")


@dataclass(frozen=True)
class PreparedBatch:
    """Per-row inputs of n transactions in (timestamp, transaction_id) order; python lists for the hot loop."""

    features: PrivateFeatures
    cardholder: list[str]
    merchant_hash: list[int]
    key: list[int]
    ts_us: list[int]
    lat: list[float]
    lon: list[float]
    amount: list[float]
    mcc: list[str]

    def __post_init__(self) -> None:
        n = len(self.features)
        for name in ("cardholder", "merchant_hash", "key", "ts_us", "lat", "lon", "amount", "mcc"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"PreparedBatch.{name} has {len(getattr(self, name))} rows, expected {n}")

    def __len__(self) -> int:
        return len(self.features)

    def merchant_key(self, i: int) -> str:
        """Row ``i``'s merchant as the online and offline stores key it: its keyed hash (hex), never its name."""
        return merchant_key(self.merchant_hash[i])


def merchant_key(merchant_hash: int) -> str:
    """The store key of a merchant: its 64-bit hash under the federation's key, as 16 hex digits.

    Why: merchant names are the bank's customers' shopping history once joined with time; the keyed hash
    identifies the merchant inside the federation and means nothing outside it.
    """
    return f"{merchant_hash:016x}"


def prepare_batch(frame: pd.DataFrame, featurizer: PrivateFeaturizer) -> PreparedBatch:
    """Sort canonical rows and compute everything the per-row update needs, vectorised, inside the bank."""
    missing = [c for c in _COLUMNS if c not in frame]
    if missing:
        raise ValueError(f"frame lacks columns {missing}")
    order = event_order(frame)
    data = frame if order is None else frame.iloc[order]
    feats = featurizer.transform(data)
    return PreparedBatch(
        features=feats,
        cardholder=[str(p) for p in feats.cardholder],
        merchant_hash=featurizer.merchant_hash(data["merchant_id"]).tolist(),
        key=feats.keys.tolist(),
        ts_us=timestamps_us(data["timestamp"]).tolist(),
        lat=data["lat"].to_numpy(dtype=np.float64).tolist(),
        lon=data["lon"].to_numpy(dtype=np.float64).tolist(),
        amount=data["amount"].to_numpy(dtype=np.float64).tolist(),
        mcc=data["mcc"].astype(str).tolist(),
    )


@dataclass
class CardholderState:
    """Everything the store keeps per cardholder, in memory.

    Attributes:
        cardholder: keyed pseudonym (the Feast entity key).
        ego: the dynamic ego graph (``cardholder_ego_state.ego_state``).
        activity: running aggregates (``cardholder_activity``).
        time_embedding: noised T' of the latest in-order transaction, float32 ``[d]`` (``cardholder_time``).
        epsilon: the cardholder's personal LDP budget.
        q_t: last graph embedding written by the scorer, float32 ``[k]``; empty until one is set.
        found: the store had a row for this cardholder.
        rebuilt: the stored ego-graph blob was corrupt and the state restarted from empty.
        demographics: the ``cardholder_demographics`` row, when the read asked for it and the bank holds one.
    """

    cardholder: str
    ego: EgoGraphState
    activity: Activity = field(default_factory=Activity)
    time_embedding: np.ndarray | None = None
    epsilon: float | None = None
    q_t: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    found: bool = False
    rebuilt: bool = False
    demographics: dict[str, Any] | None = None

    @classmethod
    def empty(cls, cardholder: str, cfg: EgoGraphConfig) -> CardholderState:
        """State of a cardholder never seen before (first transaction)."""
        return cls(cardholder=cardholder, ego=EgoGraphState(cfg))

    @property
    def version(self) -> int:
        """Transactions applied to the ego graph: grows by one per applied transaction."""
        return self.ego.n_transactions

    def apply(self, batch: PreparedBatch, i: int, cell_deg: float) -> bool:
        """Fold row ``i`` of ``batch`` in; ``False`` (and no change) for a redelivered transaction."""
        ts = batch.ts_us[i]
        in_order = self.activity.tx_count == 0 or ts >= self.activity.last_seen_us
        ego = self.ego
        if not ego.update(batch.key[i], batch.merchant_hash[i], batch.lat[i], batch.lon[i], ts, batch.amount[i],
                          batch.mcc[i]):
            return False
        self.activity.update(ts, batch.amount[i], batch.lat[i], batch.lon[i], batch.mcc[i], cell_deg)
        if in_order:
            self.time_embedding = batch.features.time[i]
        self.epsilon = float(batch.features.epsilon[i])
        return True

"""What the anomaly stage hands the fraud stage: one micro-batch's private inputs and anomaly scores.

:class:`fedfraud.serving.anomaly_stage.AnomalyStage` builds a :class:`ScoredBatch`;
:class:`fedfraud.serving.fraud_stage.FraudStage` decides on it. The rows keep the
micro-batch's event-time order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["ScoredBatch"]


@dataclass
class ScoredBatch:
    """What the anomaly stage hands the fraud stage: private per-transaction inputs + AS, in event-time order."""

    source: str
    transaction_id: list[str]
    cardholder: list[str]
    ts_us: list[int]
    amount: list[float]
    mcc: list[str]
    merchant: np.ndarray
    location: np.ndarray
    time: np.ndarray
    anomaly_score: np.ndarray
    redelivered: np.ndarray
    produced_us: np.ndarray
    anomaly_model: str
    scored_us: int = 0
    content: list[str] = field(default_factory=list)  # canonical-row hashes (kafka.content_hashes); optional
    shadow_anomaly_score: np.ndarray | None = None  # the challenger GNN's AS while one shadows (NaN where none)
    shadow_anomaly_model: str = ""
    #: Fraud-stage state blobs by cardholder, read in the anomaly stage's round trip (``KVStore.get_tables``);
    #: the fraud stage reads a cardholder missing here itself.
    fraud_blobs: dict[str, bytes | None] = field(default_factory=dict)
    #: Per row, the ``merchant_risk`` row of its merchant read in the same online read (None: no row); None when
    #: the replica does not read merchant risk.
    merchant_risk: list[dict[str, Any] | None] | None = None
    #: Per row, the 64-bit keyed merchant hash (``merchant`` is its bucket, which merchants share): what a GNN fraud
    #: model's merchant neighbourhood is keyed by. None: not given (the bucket is used).
    merchant_hash: np.ndarray | None = None
    #: Per row, its cardholder's ``cardholder_demographics`` row (None: the bank has none for it); None when the
    #: replica's fraud model reads no demographic columns.
    demographics: list[dict[str, Any] | None] | None = None
    #: Per row, the G-HIN2Vec embedding of its cardholder's ego graph *before* the row, float32 ``[n, dim]`` (NaN
    #: rows: no graph yet, or a redelivery); None when the replica's fraud model reads no hin2vec columns.
    hin2vec: np.ndarray | None = None
    hin2vec_model: str = ""  # the hin2vec model's tag when ``hin2vec`` is set

    def __post_init__(self) -> None:
        n = len(self.transaction_id)
        for name in ("cardholder", "ts_us", "amount", "mcc", "merchant", "location", "time", "anomaly_score",
                     "redelivered", "produced_us"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"ScoredBatch.{name} has {len(getattr(self, name))} rows, expected {n}")
        if self.hin2vec is not None and (self.hin2vec.ndim != 2 or len(self.hin2vec) != n):
            raise ValueError(f"ScoredBatch.hin2vec has shape {self.hin2vec.shape}, expected ({n}, dim)")

    def __len__(self) -> int:
        return len(self.transaction_id)

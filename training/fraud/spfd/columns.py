"""Which columns are shared and which private, and a bank's table with its private columns.

The shared set is the fraud feature row (:func:`fedfraud.training.fraud.features.feature_names`) minus every
column some bank may hold privately; a bank's private set is the columns of its ``banks.<k>.private_features``
(:class:`fedfraud.training.data.config.BanksConfig`). ``demographics`` columns come from the bank's
``cardholders.parquet`` (written by ``ingest``), joined per transaction; ``merchant_history`` columns are already
in the fraud feature row, so serving computes them unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from fedfraud.core.errors import UserError
from fedfraud.feature_store.demographics import DEMOGRAPHIC_FEATURES, DEMOGRAPHIC_FIELDS, demographic_columns
from fedfraud.feature_store.encoders import timestamps_us
from fedfraud.feature_store.layout import read_cardholders
from fedfraud.training.fraud.features import ANOMALY_FEATURE, FraudFeatures

__all__ = ["DEMOGRAPHIC_FEATURES", "PRIVATE_COLUMNS", "bank_table", "held_columns", "private_columns", "shared_columns"]

#: Private set → its columns.
PRIVATE_COLUMNS: dict[str, tuple[str, ...]] = {
    "demographics": DEMOGRAPHIC_FEATURES,
    "merchant_history": ("merchant_new", "merchant_visits"),
}
_ALL_PRIVATE = frozenset(c for cols in PRIVATE_COLUMNS.values() for c in cols)


def shared_columns(names: Sequence[str], use_anomaly_score: bool) -> tuple[str, ...]:
    """The columns every bank has: the row ``names`` minus any private column (and the anomaly score if unused)."""
    return tuple(n for n in names if n not in _ALL_PRIVATE and (use_anomaly_score or n != ANOMALY_FEATURE))


def private_columns(sets: Sequence[str]) -> tuple[str, ...]:
    """The columns of a bank's private sets, in the sets' order."""
    unknown = [s for s in sets if s not in PRIVATE_COLUMNS]
    if unknown:
        raise ValueError(f"unknown private feature sets {unknown}; known: {sorted(PRIVATE_COLUMNS)}")
    return tuple(c for s in sets for c in PRIVATE_COLUMNS[s])


def _demographics(frame: pd.DataFrame, holders: pd.DataFrame) -> np.ndarray:
    """``[n, 4]`` demographic columns of the canonical rows ``frame`` (NaN where the cardholder has none)."""
    joined = frame[["cardholder_id", "timestamp"]].merge(holders, on="cardholder_id", how="left")
    stored = np.column_stack([joined[c].to_numpy(dtype=np.float64) for c in DEMOGRAPHIC_FIELDS])
    return demographic_columns(timestamps_us(joined["timestamp"]), stored)  # serving's function


def bank_table(feats: FraudFeatures, frame: pd.DataFrame, sets: Sequence[str], root: Path, bank: int
               ) -> FraudFeatures:
    """The bank's feature rows plus its demographic columns when it holds them (``frame``: its canonical rows,
    in the rows' order, as :func:`fedfraud.training.fraud.dataset.bank_features` read them).
    """
    if "demographics" not in sets:
        return feats
    if len(frame) != len(feats):
        raise ValueError("the canonical rows and the feature rows differ in length")
    holders = read_cardholders(root, bank)
    if holders is None:
        raise UserError(f"bank {bank} holds demographics (banks.{bank}.private_features) but its dataset has no "
                        "cardholders.parquet: ingest a Sparkov file with its dob/gender/city_pop/job columns, or "
                        f"drop demographics from banks.{bank}")
    extra = _demographics(frame, holders).astype(np.float32)
    return FraudFeatures(np.hstack([feats.X, extra]), (*feats.names, *DEMOGRAPHIC_FEATURES), feats.transaction_id,
                         feats.cardholder, feats.label, feats.split, feats.transitions)


def held_columns(table: FraudFeatures, shared: Sequence[str], private: Sequence[str]) -> FraudFeatures:
    """Only the columns the bank holds (``shared`` then its ``private`` ones): what a model of that bank alone may
    read. A bank's table keeps the whole fraud feature row, whose merchant-history columns are private to the
    banks that hold them.
    """
    names = (*shared, *private)
    idx = [table.names.index(n) for n in names]
    return FraudFeatures(table.X[:, idx], names, table.transaction_id, table.cardholder, table.label, table.split,
                         table.transitions)

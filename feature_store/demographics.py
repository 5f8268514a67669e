"""A cardholder's demographics as fraud-model columns: one function for training rows and the hot path.

A bank that holds demographics (``banks.<k>.private_features: [demographics]``, issue 39) keeps one row per
cardholder (``bank_<k>/cardholders.parquet``, :data:`fedfraud.feature_store.schema.DEMOGRAPHIC_COLUMNS`): birth day,
gender, city population, a hash of the job title. It never leaves the bank. The columns a model reads per
transaction are :data:`DEMOGRAPHIC_FEATURES`; the age is taken at the transaction, so it is computed here from the
transaction's timestamp, the same way for the training table and for serving (which reads the row from the Feast
view ``cardholder_demographics``, keyed by card token).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["DEMOGRAPHIC_FEATURES", "DEMOGRAPHIC_FIELDS", "demographic_columns", "stored_fields"]

#: The demographic columns of a transaction: the cardholder's age at it (years), 1 female / 0 male, the city's
#: population, the job's hash (a category).
DEMOGRAPHIC_FEATURES: tuple[str, ...] = ("age_years", "gender_f", "city_pop", "job_code")
#: What is stored per cardholder (the view's fields, ``cardholders.parquet`` without the id).
DEMOGRAPHIC_FIELDS: tuple[str, ...] = ("birth_day", "gender_f", "city_pop", "job_code")
_US_PER_DAY = 86_400_000_000.0


def stored_fields(rows: Sequence[Mapping[str, Any] | None]) -> np.ndarray:
    """``[n, 4]`` float64 :data:`DEMOGRAPHIC_FIELDS` of stored rows (the online view's); None or a missing value
    gives NaN, which the models read as missing.
    """
    out = np.full((len(rows), len(DEMOGRAPHIC_FIELDS)), np.nan)
    for i, row in enumerate(rows):
        if row:
            out[i] = [np.nan if row.get(f) is None else float(row[f]) for f in DEMOGRAPHIC_FIELDS]
    return out


def demographic_columns(ts_us: Sequence[int] | np.ndarray, stored: np.ndarray) -> np.ndarray:
    """``[n, 4]`` float64 :data:`DEMOGRAPHIC_FEATURES` of transactions at ``ts_us`` (µs since the epoch), each with
    its cardholder's :data:`DEMOGRAPHIC_FIELDS` (``stored``, NaN where unknown): the age at the transaction, then
    the stored values.
    """
    stored = np.asarray(stored, dtype=np.float64).reshape(-1, len(DEMOGRAPHIC_FIELDS))
    days = np.asarray(ts_us, dtype=np.float64) / _US_PER_DAY
    return np.column_stack([(days - stored[:, 0]) / 365.25, stored[:, 1:]])

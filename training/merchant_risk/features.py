"""The merchant-risk columns of a fraud-feature row: one implementation for training, the daily job and serving.

A transaction on day ``d`` at a merchant in bucket ``b`` reads the ``merchant_risk`` row of release ``d − 1``:
the bank's own columns (:func:`~.stats.risk_columns` of its vector) and the federation's
(:func:`~.stats.release_columns`, the mean of the latest releases). Training computes them with
:func:`~.stats.daily_merchant_features` (the release replayed day by day, labels ``label_delay_days`` late); the
daily job (:func:`table_rows`) computes the same two functions for every bucket and writes them to Feast; serving
reads the row in the micro-batch's online read and turns it into columns with :func:`row_columns`. A bucket
without a row reads as an all-zero one, as training does, so the three cannot disagree.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from fedfraud.training.fraud.features import FraudFeatures
from fedfraud.training.merchant_risk.config import MerchantNoiseConfig, MerchantRiskConfig
from fedfraud.training.merchant_risk.stats import (
    BankActivity,
    MerchantColumns,
    Releaser,
    bank_feature_names,
    bank_vector,
    daily_merchant_features,
    release_columns,
    release_feature_names,
    risk_columns,
)

if TYPE_CHECKING:
    from fedfraud.feature_store.config import EncoderConfig, PrivacyConfig

__all__ = [
    "RiskTable",
    "bank_activity",
    "dataset_columns",
    "merchant_names",
    "row_columns",
    "table_rows",
    "training_columns",
    "with_merchant_columns",
]


def merchant_names(risk: MerchantRiskConfig) -> tuple[str, ...]:
    """The merchant columns a fraud row ends with: the bank's own, then the federation's."""
    return (*bank_feature_names(risk), *release_feature_names(risk))


@functools.lru_cache(maxsize=8)
def _empty(risk: MerchantRiskConfig) -> tuple[np.ndarray, np.ndarray]:
    """The columns of a bucket with no row (computed once per settings: serving asks for them every micro-batch)."""
    zero = np.zeros(1, dtype=np.int64)
    own = risk_columns(np.zeros((len(risk.window_days) * 6, 1), dtype=np.int64), zero)[0]
    return own, release_columns([], zero, risk)[0]


@dataclasses.dataclass(frozen=True)
class RiskTable:
    """One bank's ``merchant_risk`` rows of one release: buckets with anything to say, and their two column sets."""

    release_day: int
    buckets: np.ndarray
    own: np.ndarray
    fed: np.ndarray


def table_rows(activity: BankActivity, release_day: int, recent: Sequence[np.ndarray], risk: MerchantRiskConfig
               ) -> RiskTable:
    """The bank's rows of release ``release_day``: its own vector of that day and the mean of ``recent``
    releases (the latest last), for every bucket where either is not all zero.

    Why only those: a bucket without a row reads as zeros (:func:`row_columns`), exactly what it would hold.
    """
    everyone = np.arange(risk.buckets, dtype=np.int64)
    vector = bank_vector(activity, release_day, risk)
    latest = np.mean([np.asarray(r, dtype=np.float64) for r in recent[-risk.release_average:]], axis=0) \
        if recent else np.zeros((1, risk.buckets))
    keep = np.flatnonzero(vector.any(axis=0) | (latest != 0).any(axis=0))
    own = risk_columns(vector, everyone[keep])
    fed = release_columns(list(recent), everyone[keep], risk)
    return RiskTable(int(release_day), keep, own, fed)


def row_columns(rows: Sequence[Mapping[str, Any] | None], risk: MerchantRiskConfig) -> np.ndarray:
    """Serving's merchant columns (float32 ``[n, F]``, :func:`merchant_names` order) from the ``merchant_risk`` rows
    read for n transactions (None: no row, read as an all-zero bucket).
    """
    own_empty, fed_empty = _empty(risk)
    width = own_empty.size + fed_empty.size
    out = np.empty((len(rows), width), dtype=np.float32)
    for i, row in enumerate(rows):
        own = row.get("merchant_bank") if row else None
        fed = row.get("merchant_fed") if row else None
        own = own_empty if own is None or len(own) != own_empty.size else own
        fed = fed_empty if fed is None or len(fed) != fed_empty.size else fed
        out[i, :own_empty.size] = own
        out[i, own_empty.size:] = fed
    return out


def training_columns(banks: Mapping[int, BankActivity], risk: MerchantRiskConfig,
                     release: Releaser | None = None, progress: bool = False) -> dict[int, np.ndarray]:
    """Every bank's merchant columns per row (the caller's row order), with the federation's columns from
    ``release`` (the product's private release; None: the clear sum), as serving would have read them.
    """
    releasers = {"release": release} if release is not None else None
    cols = daily_merchant_features(banks, risk, progress=progress, releasers=releasers)
    return {b: np.hstack([c.bank, c.private["release"] if release is not None else c.fed]).astype(np.float32)
            for b, c in cols.items()}


def with_merchant_columns(base: FraudFeatures, cols: MerchantColumns | np.ndarray, risk: MerchantRiskConfig,
                          extra: Sequence[tuple[Sequence[str], np.ndarray]] = ()) -> FraudFeatures:
    """``base`` (from ``build_features``) with the merchant columns appended (bank's own, then federation's) and
    any ``extra`` (names, columns) after them; same rows, same transition table.

    Why appended and not in ``build_features``: the merchant columns depend on other banks (the release), the
    per-cardholder state does not.
    """
    block = np.hstack([cols.bank, cols.fed]) if isinstance(cols, MerchantColumns) else np.asarray(cols)
    parts = [block, *(np.asarray(c) for _, c in extra)]
    if any(p.shape[0] != len(base) for p in parts):
        raise ValueError(f"merchant columns have {[p.shape[0] for p in parts]} rows, features {len(base)}")
    names = (*base.names, *merchant_names(risk), *(n for ns, _ in extra for n in ns))
    X = np.hstack([base.X, *parts]).astype(np.float32)
    return dataclasses.replace(base, X=X, names=names)


def bank_activity(frame: pd.DataFrame, bank: int, encoder_cfg: EncoderConfig, privacy_cfg: PrivacyConfig,
                  risk: MerchantRiskConfig) -> BankActivity:
    """A bank's canonical rows (``cardholder_id``, ``merchant_id``, ``timestamp``, ``is_fraud``) as the merchant
    statistics read them: merchants keyed with the federation's key, in the frame's row order.
    """
    from fedfraud.feature_store.encoders import timestamps_us
    from fedfraud.feature_store.privacy import PrivateFeaturizer

    featurizer = PrivateFeaturizer.for_bank(encoder_cfg, privacy_cfg, bank)
    label = frame["is_fraud"].astype("float32").to_numpy(dtype=np.float32) if "is_fraud" in frame \
        else np.full(len(frame), np.nan, dtype=np.float32)
    return BankActivity.of(frame["cardholder_id"], featurizer.merchant_hash(frame["merchant_id"]),
                           timestamps_us(frame["timestamp"]) // 1_000_000, label, risk.buckets)


def dataset_columns(root: Path, encoder_cfg: EncoderConfig, privacy_cfg: PrivacyConfig, risk: MerchantRiskConfig,
                    noise: MerchantNoiseConfig, rng: np.random.Generator | None = None, progress: bool = False
                    ) -> dict[int, np.ndarray]:
    """Every bank's merchant columns of a dataset folder (file order), the release replayed day by day with each
    bank's noise share (:func:`~.release.private_release`; ``noise``'s plan for these banks), labels
    ``risk.label_delay_days`` late.

    Why replayed: in this simulation every bank's rows are at hand, so the releases the banks would have made are
    made again (fresh noise from the OS unless ``rng`` is given, as a real release's); a deployed bank trains on
    the releases it stored.
    """
    from fedfraud.feature_store.layout import list_banks, read_bank
    from fedfraud.training.merchant_risk.release import plan_release, private_release

    columns = ["cardholder_id", "merchant_id", "timestamp", "is_fraud"]
    banks = {b: bank_activity(read_bank(root, b, columns=columns), b, encoder_cfg, privacy_cfg, risk)
             for b in list_banks(root)}
    plan = plan_release(risk, noise, len(banks))
    rng = rng or np.random.default_rng()
    return training_columns(banks, risk, lambda day, vectors: private_release(vectors, plan, rng), progress)

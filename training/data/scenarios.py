"""Fraud scenarios of labelled transactions, and each scenario's ROC-AUC: the one place a scenario is joined.

Scenario labels come from a side file (``trans_num`` → scenario, e.g. the handbook simulator's) or from a generated
dataset's ``labels.parquet``. Why here and not in a bench: training's model cards (``train fraud``'s per-scenario
figures) and the benches read the same join.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd

from fedfraud.core.errors import UserError

__all__ = ["all_finite", "load_scenarios", "roc_auc", "scenario_aucs", "scenario_column"]

logger = logging.getLogger(__name__)


def all_finite(part: pd.DataFrame, detectors: list[str]) -> np.ndarray:
    """Rows every detector scored (detectors are compared on the same rows)."""
    scores = np.c_[[part[d].to_numpy(dtype=np.float64) for d in detectors]].T
    return np.all(np.isfinite(scores), axis=1) if len(detectors) else np.ones(len(part), dtype=bool)


def roc_auc(label: np.ndarray, score: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    keep = np.isfinite(score)
    return float(roc_auc_score(label[keep], score[keep])) if 0 < label[keep].sum() < keep.sum() else math.nan


def _generated_scenarios(rows: pd.DataFrame, labels_root: Path) -> pd.Series | None:
    """The generator's scenario of each of ``rows`` (aligned, NaN for none), or None without ``labels.parquet``."""
    from fedfraud.feature_store.layout import bank_dir

    banks = sorted(rows["bank"].unique())
    paths = [bank_dir(labels_root, int(b)) / "labels.parquet" for b in banks]
    if not paths or not all(p.exists() for p in paths):
        return None
    scen = pd.concat([pd.read_parquet(p).assign(bank=int(b)) for p, b in zip(paths, banks, strict=True)])
    merged = rows[["bank", "transaction_id"]].merge(scen, on=["bank", "transaction_id"], how="left")
    return pd.Series(merged["scenario"].to_numpy(), index=rows.index)


def load_scenarios(path: Path) -> pd.Series:
    """A scenarios side file (``trans_num`` → ``scenario``) as a Series keyed by ``transaction_id``.

    The Sparkov loader keeps ``trans_num`` as the ``transaction_id`` unchanged, so the two join directly.
    Scenario 0 (or empty) is a genuine transaction and maps to NaN; a number ``k`` becomes ``"S<k>"``.
    """
    frame = pd.read_csv(path, usecols=["trans_num", "scenario"], dtype=str, keep_default_na=False)
    name = frame["scenario"].str.strip()
    name = name.where(~name.str.fullmatch(r"\d+"), "S" + name)
    name = name.mask(name.isin(["", "S0"]))
    return pd.Series(name.to_numpy(), index=frame["trans_num"].str.strip().to_numpy(), name="scenario")


def scenario_column(rows: pd.DataFrame, data: Path, scenarios: Path | None) -> pd.Series | None:
    """Each of ``rows``' scenario (aligned, NaN for none): from the ``scenarios`` file when given, else the
    generator's labels under ``data``; None when neither exists. Raises when the file matches none of the rows
    (the wrong file, or a ``--work`` holding another dataset).
    """
    if scenarios is None:
        return _generated_scenarios(rows, data)
    mapping = load_scenarios(Path(scenarios))
    ids = rows["transaction_id"].astype(str).str.strip()
    matched = ids.isin(mapping.index)
    if not matched.any():
        raise UserError(f"{scenarios}: no trans_num matches a scored transaction_id (another dataset under --work?)")
    fraud = rows["is_fraud"].fillna(False).astype(bool)
    column = ids.map(mapping[~mapping.index.duplicated()])
    logger.info("scenarios joined=%d of %d rows; frauds without a scenario=%d", int(matched.sum()), len(rows),
                int((fraud & column.isna()).sum()))
    return column


def scenario_aucs(rows: pd.DataFrame, detectors: list[str], scenario: pd.Series) -> dict[str, dict[str, float]]:
    """Per fraud scenario: its frauds' count and each detector's ROC-AUC of them against all legitimate rows.

    ``scenario`` is aligned with ``rows`` (NaN = no scenario). Rows some detector did not score are left out for
    all, as in :func:`bootstrap_by_group`, so the detectors are compared on the same transactions.
    """
    finite = all_finite(rows, detectors)
    fraud = rows["is_fraud"].fillna(False).astype(bool).to_numpy()
    name = scenario.reindex(rows.index).astype("string")
    legit = finite & ~fraud
    out: dict[str, dict[str, float]] = {}
    for s in sorted(name[fraud].dropna().unique()):
        pos = finite & fraud & name.eq(s).fillna(False).to_numpy(dtype=bool)
        keep = pos | legit
        out[s] = {"frauds": float(pos.sum())}
        out[s].update({d: roc_auc(pos[keep], rows[d].to_numpy(dtype=np.float64)[keep]) for d in detectors})
    return out

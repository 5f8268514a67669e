"""One bank's fraud-model inputs: private features, anomaly scores, feature rows and the split.

Split by cardholder, never by row, so no cardholder's history leaks between
fitting and evaluation: ``test`` is the project-wide 25 % test split
(:func:`fedfraud.feature_store.layout.split_of`, the same cardholders the anomaly model
never trained on); of the remaining cardholders ``validation_fraction`` go to
``valid`` (where the decision threshold is chosen) by an independent hash.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from fedfraud.core.errors import UserError
from fedfraud.feature_store.config import EncoderConfig, PrivacyConfig
from fedfraud.feature_store.privacy import PrivateFeaturizer
from fedfraud.training.data.config import BanksConfig, IngestConfig
from fedfraud.feature_store.layout import list_banks, read_bank, split_of
from fedfraud.training.fraud.config import FraudConfig
from fedfraud.training.fraud.features import FraudFeatures, build_features, fit_transitions

__all__ = [
    "AnomalyScorerLike",
    "anomaly_scores_for",
    "bank_features",
    "dataset_features",
    "fraud_split",
    "materialize",
]

logger = logging.getLogger(__name__)

_VALID_SALT = "fedfraud-fraud-valid"


def fraud_split(cardholder_ids: Iterable[str], validation_fraction: float) -> np.ndarray:
    """``train`` / ``valid`` / ``test`` per cardholder id (object array), deterministic."""
    ids = [str(c) for c in cardholder_ids]
    unique = sorted(set(ids))
    out: dict[str, str] = {}
    for cid in unique:
        if split_of(cid) == "test":
            out[cid] = "test"
            continue
        digest = hashlib.blake2b(f"{_VALID_SALT}:{cid}".encode(), digest_size=8).digest()
        out[cid] = "valid" if int.from_bytes(digest, "big") / 2**64 < validation_fraction else "train"
    return np.asarray([out[c] for c in ids], dtype=object)


class AnomalyScorerLike(Protocol):
    """What the fraud model needs from the anomaly model: AS for every transaction of a frame."""

    def score_frame(self, frame: pd.DataFrame, featurizer: PrivateFeaturizer) -> np.ndarray: ...


def anomaly_scores_for(frame: pd.DataFrame, featurizer: PrivateFeaturizer,
                       scorer: AnomalyScorerLike | None) -> np.ndarray:
    """AS per row of ``frame`` (float64, NaN where the anomaly model has no transition, e.g. a first visit)."""
    if scorer is None:
        return np.full(len(frame), np.nan)
    scores = np.asarray(scorer.score_frame(frame, featurizer), dtype=np.float64)
    if scores.shape != (len(frame),):
        raise ValueError(f"anomaly scorer returned shape {scores.shape} for {len(frame)} rows")
    return scores


def bank_features(
    root: Path,
    bank: int,
    fraud_cfg: FraudConfig,
    encoder_cfg: EncoderConfig,
    privacy_cfg: PrivacyConfig,
    scorer: AnomalyScorerLike | None = None,
    progress: bool = False,
) -> FraudFeatures:
    """Feature rows of every transaction of ``bank`` (with AS when a scorer is given), in file order."""
    frame = read_bank(root, bank)
    # the anomaly model fixes the embedding layout it was trained on; the fraud features use the same L'/T'
    encoder_cfg = getattr(scorer, "encoder_cfg", encoder_cfg)
    featurizer = PrivateFeaturizer.for_bank(encoder_cfg, privacy_cfg, bank)
    private = featurizer.transform(frame)
    scores = anomaly_scores_for(frame, featurizer, scorer)
    split = fraud_split(frame["cardholder_id"], fraud_cfg.validation_fraction)
    # the category-transition table comes from this bank's training cardholders only, and ships with the model
    transitions = (fit_transitions(frame, private.cardholder, split == "train")
                   if fraud_cfg.previous_transaction_features else None)
    feats = build_features(frame, private, fraud_cfg, scores, split, progress=progress, transitions=transitions)
    logger.info("bank_features bank=%d rows=%d labelled=%s fraud=%d as_coverage=%.3f", bank, len(feats),
                feats.has_labels, int(np.nansum(feats.label)), float(np.mean(np.isfinite(scores))) if len(scores)
                else 0.0)
    return feats



@contextmanager
def materialize(data: Path, ingest_cfg: IngestConfig, banks_layout: BanksConfig | None = None) -> Iterator[Path]:
    """A dataset directory for ``data``: itself if it is one, else a CSV ingested into a temporary directory
    (keeping the private columns ``banks_layout`` gives each bank, when given).

    With ``ingest_cfg.skew`` the banks are thinned to their target fraud rates
    (:func:`~fedfraud.training.data.skew.skew_dataset`), on a temporary copy when ``data`` is a directory.
    """
    from fedfraud.training.data.ingest import ingest_csv

    data = Path(data)
    if data.is_dir() and ingest_cfg.skew is None:
        yield data
        return
    if not data.exists():
        raise UserError(f"{data}: no such dataset directory or CSV file")
    with tempfile.TemporaryDirectory(prefix="fedfraud-ingest-") as tmp:
        if data.is_dir():  # ingest.skew thins a copy (the dataset keeps its own partition)
            import shutil

            list_banks(data)
            shutil.copytree(data, tmp, dirs_exist_ok=True)
        else:
            report = ingest_csv(data, Path(tmp), ingest_cfg, progress=False, banks_layout=banks_layout)
            if report.accepted == 0:
                raise UserError(f"{data}: no valid transactions (rejected {report.rejected})")
            logger.info("ingested csv=%s format=%s accepted=%d rejected=%d", data, report.format, report.accepted,
                        report.rejected)
        if ingest_cfg.skew is not None:
            from fedfraud.training.data.skew import skew_dataset

            skew_dataset(Path(tmp), *ingest_cfg.skew)
        yield Path(tmp)


def dataset_features(
    root: Path,
    fraud_cfg: FraudConfig,
    encoder_cfg: EncoderConfig,
    privacy_cfg: PrivacyConfig,
    scorer: AnomalyScorerLike | None,
    require_labels: bool,
    progress: bool = True,
) -> dict[int, FraudFeatures]:
    """:func:`bank_features` of every bank under ``root``; with ``require_labels`` a one-line error if any lack them."""
    ids = list_banks(root)
    if require_labels:  # fail in a second, before any anomaly scoring
        for bank in ids:
            labels = read_bank(root, bank, columns=["is_fraud"])["is_fraud"]
            if labels.isna().any():
                raise UserError(
                    f"evaluation needs labels: {int(labels.isna().sum())} transactions of bank {bank} have no "
                    "is_fraud (scoring works without labels; training and evaluation do not)"
                )
    return {
        bank: bank_features(root, bank, fraud_cfg, encoder_cfg, privacy_cfg, scorer)
        for bank in tqdm(ids, desc="banks", disable=not progress)
    }


def labelled_banks(root: Path, data: Path | str) -> dict[int, Any]:
    """Every bank's frame of a dataset that the federated evaluations can use: at least 2 banks, all labelled."""
    from fedfraud.core.errors import UserError
    from fedfraud.feature_store.layout import list_banks, read_bank

    ids = list_banks(root)
    if len(ids) < 2:
        raise UserError(f"{data} holds {len(ids)} bank; the federated variants need at least 2 (use --banks)")
    frames = {b: read_bank(root, b) for b in ids}
    for b, f in frames.items():
        if f["is_fraud"].isna().any():
            raise UserError(f"evaluation needs labels: {int(f['is_fraud'].isna().sum())} transactions of bank "
                            f"{b} have no is_fraud (scoring works without labels; training and evaluation do not)")
    return frames

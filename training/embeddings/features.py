"""G-HIN2Vec columns of the fraud model (``fraud.extra_features: [hin2vec]``, ``--features +hin2vec``).

Stacked like the anomaly score: computed per row by a model that exists before the fraud model, appended after
the base columns. Causal: a row reads the embedding of its cardholder's ego graph *before* the row
(:func:`~fedfraud.training.embeddings.embed.causal_embeddings`); NaN on a cardholder's first transaction.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np

from fedfraud.core.errors import UserError
from fedfraud.feature_store.config import EgoGraphConfig, EncoderConfig, PrivacyConfig
from fedfraud.feature_store.layout import read_bank
from fedfraud.feature_store.privacy import PrivateFeaturizer
from fedfraud.training.embeddings.embed import causal_embeddings, embedding_names
from fedfraud.training.embeddings.model import Hin2Vec
from fedfraud.training.fraud.features import FraudFeatures

__all__ = ["HIN2VEC_FEATURE", "bank_embedding_columns", "with_embeddings"]

logger = logging.getLogger(__name__)

#: The name of the feature set in ``fraud.extra_features`` / ``--features +hin2vec``.
HIN2VEC_FEATURE = "hin2vec"


def bank_embedding_columns(root: Path, bank: int, model: Hin2Vec, encoder_cfg: EncoderConfig,
                           privacy_cfg: PrivacyConfig, ego_cfg: EgoGraphConfig, progress: bool = False) -> np.ndarray:
    """Embedding columns of every transaction of ``bank`` in file order (the order of :func:`bank_features`)."""
    if encoder_cfg.dim != model.loc_dim:
        raise UserError(f"the hin2vec model reads L' of size {model.loc_dim}, the fraud features use "
                        f"{encoder_cfg.dim}: train them with the same encoder.dim")
    frame = read_bank(root, bank)
    featurizer = PrivateFeaturizer.for_bank(encoder_cfg, privacy_cfg, bank)
    cols = causal_embeddings(frame, featurizer, model, ego_cfg, progress=progress)
    logger.info("hin2vec_columns bank=%d rows=%d coverage=%.3f", bank, len(cols),
                float(np.isfinite(cols[:, 0]).mean()) if len(cols) else 0.0)
    return cols


def with_embeddings(base: FraudFeatures, cols: np.ndarray) -> FraudFeatures:
    """``base`` with the embedding columns appended (same rows, same transition table)."""
    cols = np.asarray(cols, dtype=np.float32)
    if cols.ndim != 2 or cols.shape[0] != len(base):
        raise ValueError(f"embedding columns have shape {cols.shape}, features {len(base)} rows")
    names = (*base.names, *embedding_names(cols.shape[1]))
    return dataclasses.replace(base, X=np.hstack([base.X, cols]).astype(np.float32), names=names)

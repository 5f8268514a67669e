"""G-HIN2Vec columns of the fraud model (``fraud.extra_features: [hin2vec]``, ``--features +hin2vec``).

Stacked like the anomaly score: computed per row by a model that exists before the fraud model, appended after
the base columns. Causal: a row reads the embedding of its cardholder's ego graph *before* the row
(:func:`~fedfraud.training.embeddings.embed.causal_embeddings`); NaN on a cardholder's first transaction.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedfraud.core.errors import UserError
from fedfraud.feature_store.config import EgoGraphConfig, EncoderConfig, PrivacyConfig
from fedfraud.feature_store.layout import read_bank
from fedfraud.feature_store.privacy import PrivateFeaturizer
from fedfraud.training.embeddings.embed import causal_embeddings, embedding_names
from fedfraud.training.embeddings.model import Hin2Vec
from fedfraud.training.fraud.features import FraudFeatures

if TYPE_CHECKING:
    from fedfraud.training.embeddings.publish import Hin2VecModel

__all__ = ["HIN2VEC_FEATURE", "HIN2VEC_MODEL_KEY", "bank_embedding_columns", "hin2vec_version_for", "pinned_hin2vec",
           "with_embeddings"]

logger = logging.getLogger(__name__)

#: The name of the feature set in ``fraud.extra_features`` / ``--features +hin2vec``.
HIN2VEC_FEATURE = "hin2vec"
#: The fraud model's registry-config key naming the exact hin2vec version (``hin2vec:v3``) its columns came from.
HIN2VEC_MODEL_KEY = "hin2vec_model"


def hin2vec_version_for(version_config: dict[str, Any]) -> str | None:
    """The hin2vec version a fraud model's columns must be computed with (its registry config), None without them.

    Why pinned: ``latest`` moves when a new encoder is published, and a fraud model read with another encoder's
    columns scores off-distribution. A model trained before the tag was recorded falls back to the
    ``fraud.hin2vec_version`` it was trained with.
    """
    fraud = version_config.get("fraud")
    extra = fraud.get("extra_features") if isinstance(fraud, dict) else None
    if not extra or HIN2VEC_FEATURE not in extra:
        return None
    tag = version_config.get(HIN2VEC_MODEL_KEY)
    if isinstance(tag, str) and ":v" in tag:
        return tag.split(":", 1)[1]
    return str(fraud.get("hin2vec_version") or "latest")


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


def pinned_hin2vec(root: Path | str, version_config: dict[str, Any], encoder_dim: int) -> Hin2VecModel | None:
    """The encoder a fraud model's hin2vec columns must be computed with (:func:`hin2vec_version_for`), loaded, or
    None for a model without them: what serving and batch scoring both load, so their columns are training's.
    """
    from fedfraud.training.embeddings.publish import load_hin2vec

    version = hin2vec_version_for(version_config)
    if version is None:
        return None
    h2v = load_hin2vec(root, version)
    if h2v.encoder_dim != encoder_dim:
        raise UserError(f"{h2v.tag} reads L' of size {h2v.encoder_dim}, the features here use encoder.dim "
                        f"{encoder_dim}: train them with the same encoder.dim")
    return h2v

"""The ``hin2vec`` registry artifact: weights, settings and a card; loaded back as a ready :class:`Hin2Vec`."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch

from fedfraud.training.embeddings.config import Hin2VecConfig
from fedfraud.training.embeddings.model import Hin2Vec
from fedfraud.training.registry import ModelRegistry, ModelVersion

__all__ = ["KIND", "MODEL_FILE", "Hin2VecModel", "load_hin2vec", "publish_hin2vec"]

KIND = "hin2vec"
MODEL_FILE = "model.pt"

_CARD = """G-HIN2Vec (thesis chapter 3): unsupervised graph-level embedding of a cardholder's heterogeneous ego graph
(cardholder, merchant, category and location nodes; static and dynamic edges), trained with the double-triplet
loss, federated with Flower (FedAvg). Inputs are private features only: merchant hash buckets, noised locations L',
category slots, visit counts and the cardholder's history summary; no cardholder identifier enters the model."""


class Hin2VecModel:
    """A published encoder with the settings it was trained with (what :func:`embed_cardholders` needs)."""

    def __init__(self, model: Hin2Vec, version: ModelVersion) -> None:
        self.model = model
        self.version = version

    @property
    def tag(self) -> str:
        return self.version.tag

    @property
    def cfg(self) -> Hin2VecConfig:
        return self.model.cfg

    @property
    def encoder_dim(self) -> int:
        return self.model.loc_dim


def publish_hin2vec(registry: ModelRegistry, state: dict[str, torch.Tensor], cfg: Hin2VecConfig, loc_dim: int,
                    config: dict[str, Any], metrics: dict[str, Any], privacy: dict[str, Any]) -> ModelVersion:
    """Write weights and settings as the next ``hin2vec`` version (atomic, like every registry kind)."""
    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in state.items()}, buffer)
    full = {**config, "hin2vec": cfg.model_dump(), "loc_dim": loc_dim}
    with registry.publish(KIND, config=full, metrics=metrics, privacy=privacy, card=_CARD) as folder:
        (Path(folder) / MODEL_FILE).write_bytes(buffer.getvalue())
    version = registry.get(KIND, "latest")
    return version


def load_hin2vec(root: Path | str, version: int | str = "latest") -> Hin2VecModel:
    """The registry's ``hin2vec`` model (weights only: ``torch.load(weights_only=True)``), in eval mode."""
    found = ModelRegistry(root).get(KIND, version)
    cfg = Hin2VecConfig.model_validate(found.config["hin2vec"])
    model = Hin2Vec(cfg, int(found.config["loc_dim"]))
    state = torch.load(found.file(MODEL_FILE), map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    model.eval()
    return Hin2VecModel(model, found)

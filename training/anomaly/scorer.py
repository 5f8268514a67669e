"""Publishing the anomaly model to the registry and the scorer serving calls per micro-batch.

Anomaly score convention: in [0, 1], high means unusual for this cardholder.
With the default ``next-event`` readout it is ``1 − exp(−NLL/10)`` of the
transaction under the model of the cardholder's next transaction given
G_{t-1}; with the thesis readout ``1 − f(q_{t-1}, q_t)``, f the
discriminator's probability that G_{t-1} → G_t is a real transition.

Serving keeps each cardholder's last embedding, so a transaction costs one
graph embedding, not two::

    scorer = AnomalyScorer.from_registry(ModelRegistry("artifacts"))
    q_cur = scorer.embed(current_graphs)          # np.ndarray [n, q_dim], batched
    scores = scorer.score(q_prev_cached, q_cur)   # np.ndarray [n]
    # cache q_cur as the cardholders' new q_prev
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from torch_geometric.data import Data

from fedfraud.feature_store.config import EgoGraphConfig, EncoderConfig
from fedfraud.feature_store.egograph import FeatureSource, SnapshotPair, iter_snapshot_pairs
from fedfraud.training.anomaly.config import AnomalyConfig
from fedfraud.training.anomaly.model import (
    AnomalyModel,
    GraphBatch,
    embed_graphs,
    pick_device,
    score_embeddings,
    score_event_embeddings,
    score_pairs,
)
from fedfraud.training.registry import ModelRegistry, ModelVersion
from fedfraud.training.safe_load import load_torch_file

__all__ = ["KIND", "MODEL_FILE", "AnomalyScorer", "publish_anomaly_model"]

logger = logging.getLogger(__name__)

KIND = "anomaly"
MODEL_FILE = "model.pt"
SPEC_FILE = "model.json"


def publish_anomaly_model(
    registry: ModelRegistry,
    state_dict: dict[str, Tensor],
    *,
    anomaly_cfg: AnomalyConfig,
    encoder_cfg: EncoderConfig,
    ego_cfg: EgoGraphConfig,
    config: dict[str, Any],
    metrics: dict[str, Any],
    privacy: dict[str, Any],
    card: str,
) -> ModelVersion:
    """Write weights + the spec needed to rebuild the model into a new ``anomaly`` registry version."""
    spec = {"anomaly": anomaly_cfg.model_dump(), "encoder": encoder_cfg.model_dump(), "egograph": ego_cfg.model_dump()}
    with registry.publish(KIND, config=config, metrics=metrics, privacy=privacy, card=card) as stage:
        torch.save({k: v.detach().cpu() for k, v in state_dict.items()}, stage / MODEL_FILE)
        (stage / SPEC_FILE).write_text(json.dumps(spec, indent=2, sort_keys=True), encoding="utf-8")
    return registry.get(KIND, "latest")


class AnomalyScorer:
    """A loaded anomaly model in eval mode: embeds ego graphs and scores transitions (CUDA if available)."""

    def __init__(
        self, model: AnomalyModel, ego_cfg: EgoGraphConfig, tag: str = "unregistered", batch_size: int = 256
    ) -> None:
        self.model = model.eval()
        self.ego_cfg = ego_cfg
        self.tag = tag
        self.batch_size = batch_size

    @classmethod
    def from_registry(
        cls, registry: ModelRegistry | Path | str, version: int | str = "latest", device: str = "auto"
    ) -> AnomalyScorer:
        """Load an ``anomaly`` version (``"latest"``, ``3`` or ``"v3"``) onto ``device``."""
        reg = registry if isinstance(registry, ModelRegistry) else ModelRegistry(registry)
        found = reg.get(KIND, version)
        spec = json.loads(found.file(SPEC_FILE).read_text(encoding="utf-8"))
        encoder_cfg = EncoderConfig.model_validate(spec["encoder"])
        ego_cfg = EgoGraphConfig.model_validate(spec["egograph"])
        spec["anomaly"].setdefault("upper_tail", "")  # published before the key existed: every head two-sided
        model = AnomalyModel(AnomalyConfig.model_validate(spec["anomaly"]), encoder_cfg, ego_cfg.max_nodes)
        state = load_torch_file(found.file(MODEL_FILE), what=f"anomaly model {found.tag}")  # tensors only
        model.load_state_dict(state)
        model.to(pick_device(device))
        logger.info("anomaly_scorer loaded=%s pooling=%s device=%s", found.tag, model.cfg.pooling, pick_device(device))
        return cls(model, ego_cfg, found.tag)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def q_dim(self) -> int:
        """Size of a graph embedding q."""
        return self.model.encoder.out_dim

    @property
    def encoder_cfg(self) -> EncoderConfig:
        """The encoder config the model was trained with (featurizers must use the same one)."""
        return self.model.encoder_cfg

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.tag}, pooling={self.model.cfg.pooling}, device={self.device})"

    def embed(self, graphs: Sequence[Data] | GraphBatch) -> np.ndarray:
        """q_t of each graph, ``[n, q_dim]`` float32 numpy (cache it as the next q_{t-1}); ``Data`` graphs or one
        :class:`~fedfraud.training.anomaly.model.GraphBatch` (serving's :func:`collate_views`).

        Numpy in and out, like :meth:`score` and :meth:`score_events`: serving keeps
        q in its state stores as numpy, so it calls this scorer directly
        (``fedfraud.serving.anomaly_stage.GraphScorer``) with no wrapper.
        """
        with torch.inference_mode():
            batch = graphs if isinstance(graphs, GraphBatch) else list(graphs)
            return embed_graphs(self.model, batch, self.batch_size).float().cpu().numpy()

    @property
    def uses_events(self) -> bool:
        """True when the readout scores (q_{t-1}, newest event): call :meth:`score_events`, not :meth:`score`."""
        return self.model.uses_events

    def score(self, q_prev: np.ndarray, q_cur: np.ndarray) -> np.ndarray:
        """Anomaly scores ``1 − f(q_{t-1}, q_t)`` for aligned rows, float64 ``[n]`` (thesis readouts)."""
        with torch.inference_mode():
            out = score_embeddings(self.model, self._on_device(q_prev), self._on_device(q_cur))
        return out.astype(np.float64).reshape(-1)

    def score_events(self, q_prev: np.ndarray, prior: np.ndarray, event: np.ndarray) -> np.ndarray:
        """Anomaly scores of newest events against q_{t-1} (event readouts), float64 ``[n]``.

        ``prior`` / ``event`` are :attr:`EgoGraphState.prior` / ``last_event``
        of each transaction (:mod:`fedfraud.feature_store.events`).
        """
        with torch.inference_mode():
            out = score_event_embeddings(self.model, self._on_device(q_prev), prior, event)
        return np.asarray(out, dtype=np.float64).reshape(-1)

    def _on_device(self, q: np.ndarray) -> Tensor:
        return torch.from_numpy(q).to(self.device)

    def score_graphs(
        self,
        previous: Sequence[Data],
        current: Sequence[Data],
        prior: np.ndarray | None = None,
        event: np.ndarray | None = None,
    ) -> np.ndarray:
        """Scores of aligned transitions when no cached q_{t-1} exists (event readouts need prior/event)."""
        return score_pairs(self.model, previous, current, self.batch_size, prior, event)

    def score_frame(self, frame: pd.DataFrame, featurizer: FeatureSource, chunk: int = 2048) -> np.ndarray:
        """Score every row of a bank's canonical frame by replaying its ego graphs; NaN where there is no
        transition (a cardholder's first transaction, a redelivery). Used to stack AS into the fraud model.
        """
        out = np.full(len(frame), np.nan, dtype=np.float64)
        for positions, scores in self.iter_scores(frame, featurizer, chunk):
            out[positions] = scores
        return out

    def iter_scores(
        self, frame: pd.DataFrame, featurizer: FeatureSource, chunk: int = 2048, progress: bool = False
    ) -> Iterator[tuple[list[int], np.ndarray]]:
        """(row positions in ``frame``, scores) chunk by chunk, replaying each cardholder's ego graph in event order.

        The transactions without a transition (a cardholder's first, a
        redelivery) are not yielded. Memory is bounded by ``chunk`` graphs.
        """
        ids: list[int] = []
        pairs: list[SnapshotPair] = []
        pairs_of = iter_snapshot_pairs(
            frame, featurizer, self.ego_cfg, min_transactions_per_month=0.0, progress=progress  # type: ignore[arg-type]
        )
        for pair in pairs_of:
            ids.append(pair.position)
            pairs.append(pair)
            if len(ids) >= chunk:
                yield ids, self._score_pairs(pairs)
                ids, pairs = [], []
        if ids:
            yield ids, self._score_pairs(pairs)

    def _score_pairs(self, pairs: list[SnapshotPair]) -> np.ndarray:
        previous, current = [p.previous for p in pairs], [p.current for p in pairs]
        if not self.uses_events:
            return self.score_graphs(previous, current)
        priors, events = np.stack([p.prior for p in pairs]), np.stack([p.event for p in pairs])
        return self.score_graphs(previous, current, priors, events)

"""A trained GNN fraud model: weights, input layout, settings and threshold; its registry form (kind ``fraud-gnn``).

Files of a version: ``gnn_weights.npz`` (the state dict as arrays, loaded with ``allow_pickle=False``: nothing in
it can run code) and ``gnn_model.json`` (layout, settings, threshold, variant, provenance). It is published under
its own kind, ``fraud-gnn``, beside the XGBoost model (kind ``fraud``); a replica deployed with ``fraud.variant``
``fedavg-gnn`` or ``fedrpda`` decides with it (:mod:`fedfraud.serving.graph_fraud`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from fedfraud.training.fraud.features import CategoryTransitions
from fedfraud.training.fraud.gnn.config import GnnConfig
from fedfraud.training.fraud.gnn.graph import TransactionGraph
from fedfraud.training.fraud.npz_artifact import load_files, published, save_files
from fedfraud.training.registry import ModelRegistry, ModelVersion

__all__ = ["KIND", "GnnFraudModel"]

logger = logging.getLogger(__name__)

KIND = "fraud-gnn"
WEIGHTS_FILE = "gnn_weights.npz"
META_FILE = "gnn_model.json"


@dataclass
class GnnFraudModel:
    """The global model of one federated GNN job (``score >= threshold`` is fraud).

    ``transitions``: the serving bank's category-transition table its ``mcc_transition_surprise`` column was
    computed with (serving passes it to ``FraudFeatureState.update``, as for XGBoost).
    """

    arrays: dict[str, np.ndarray]
    names: tuple[str, ...]
    used: tuple[str, ...]
    cfg: GnnConfig
    threshold: float
    variant: str
    meta: dict[str, Any] = field(default_factory=dict)
    transitions: CategoryTransitions | None = None
    #: Its registry kind; serving tells a GNN from an XGBoost model by it (``serving.graph_fraud``).
    kind: ClassVar[str] = KIND

    @property
    def input_names(self) -> tuple[str, ...]:
        """The feature row layout the model reads (what the fraud stage hands it)."""
        return self.names

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {self.threshold}")
        self._module: Any = None

    def module(self) -> Any:
        """The torch module with these weights (built once)."""
        if self._module is None:
            from fedfraud.training.fraud.gnn.task import build_model, set_state

            self._module = build_model(self.names, self.used, self.cfg, 0)
            set_state(self._module, self.arrays)
            self._module.eval()
        return self._module

    def scores(self, graph: TransactionGraph, mask: np.ndarray | None = None) -> np.ndarray:
        """Fraud probability of every node of ``graph`` (or of the ``mask`` nodes)."""
        from fedfraud.training.fraud.gnn.task import score_nodes

        if tuple(graph.features.names) != self.names:
            raise ValueError("the graph's feature rows have another layout than the model was trained on")
        return score_nodes(self.module(), graph, mask)

    def save(self, folder: Path) -> None:
        meta = {"names": list(self.names), "used": list(self.used), "gnn": self.cfg.model_dump(),
                "threshold": self.threshold, "variant": self.variant, "meta": self.meta}
        save_files(folder, WEIGHTS_FILE, META_FILE, self.arrays, meta, self.transitions)

    @classmethod
    def load(cls, folder: Path) -> GnnFraudModel:
        arrays, meta, table = load_files(folder, WEIGHTS_FILE, META_FILE)
        return cls(arrays, tuple(meta["names"]), tuple(meta["used"]), GnnConfig.model_validate(meta["gnn"]),
                   float(meta["threshold"]), str(meta["variant"]), dict(meta.get("meta", {})), table)

    def publish(self, registry: ModelRegistry, *, config: dict[str, Any], metrics: dict[str, Any],
                privacy: dict[str, Any] | None = None) -> ModelVersion:
        """Publish as kind ``fraud-gnn`` with a card naming the variant, its two strategies and its ``client_dp``
        (DSFL's (ε, δ) and what it leaves out, or DP off).
        """
        from fedfraud.training.fraud.dsfl import client_dp_of, privacy_statement  # flwr: not at serving

        c = self.cfg
        sentence, fields = privacy_statement(client_dp_of(self.meta, c.aggregation), "the GNN")
        card = "\n".join([
            f"Federated GNN fraud model, variant **{self.variant}** (risk-aware aggregation "
            f"{'on' if c.risk_aware_aggregation else 'off'}, diversified-risk augmentation + prototype loss "
            f"{'on' if c.diversified_risk_augmentation else 'off'}).",
            "",
            f"Decision: `score >= {self.threshold:.4f}` is fraud; the threshold maximises F1 on the banks' summed "
            "validation score histograms.",
            "Inputs: the fraud feature row of each transaction plus its past neighbours through its cardholder and "
            f"its merchant ({c.neighbors} per relation, {c.layers} hops); see docs/fraud.md#variants.",
            "",
            "**Privacy**: model weights, class prototypes, risk intensities and histograms leave each bank. "
            + sentence,
        ])
        privacy = {**(privacy or {}), **fields,
                   "leaves_a_bank": "per-column sums of transformed training rows (once), model weights per round, "
                                    "the risk intensity H_k and two class prototypes with their counts (FedRPDA), "
                                    "validation score histograms; never rows"}
        with registry.publish(KIND, config=config, metrics=metrics, privacy=privacy,
                              extra={"variant": self.variant, "threshold": self.threshold, "used": list(self.used),
                                     **self.meta}, card=card) as staging:
            self.save(staging)
        version = registry.get(KIND, "latest")
        logger.info("gnn_model published=%s variant=%s", version.tag, self.variant)
        return version

    @classmethod
    def from_registry(cls, registry: ModelRegistry | Path | str, version: int | str = "latest") -> GnnFraudModel:
        found = published(registry, KIND, version, WEIGHTS_FILE)
        model = cls.load(found.path)
        model.meta = {**model.meta, "registry_tag": found.tag}
        return model

"""A serving bank's FED-SPFD model (shared encoder + its private autoencoder + classifier), kind ``fraud-spfd``.

Files of a version: ``spfd_weights.npz`` (the bank's whole state dict as arrays, loaded with
``allow_pickle=False``: nothing in it can run code) and ``spfd_model.json`` (columns, settings, threshold, bank,
provenance, the bank's category-transition table). The object has the interface serving decides with
(:class:`fedfraud.training.fraud.model.FraudModel`'s ``input_names``, ``used``, ``threshold``, ``transitions``,
``scores``, ``predict_batch``), so :class:`fedfraud.serving.fraud_stage.FraudStage` uses it unchanged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from fedfraud.training.fraud.features import CategoryTransitions
from fedfraud.training.fraud.model import FraudDecision, Reason
from fedfraud.training.fraud.npz_artifact import load_files, published, save_files
from fedfraud.training.fraud.spfd.config import SpfdConfig
from fedfraud.training.registry import ModelRegistry, ModelVersion

__all__ = ["KIND", "SpfdFraudModel"]

logger = logging.getLogger(__name__)

KIND = "fraud-spfd"
WEIGHTS_FILE = "spfd_weights.npz"
META_FILE = "spfd_model.json"


@dataclass
class SpfdFraudModel:
    """One bank's FED-SPFD model (``score >= threshold`` is fraud).

    ``shared`` then ``private`` is the row layout it reads (``input_names``); ``use_private`` False for the
    baselines without the private autoencoder (FedAvg, FedPer), whose classifier sees z_p = 0.
    """

    arrays: dict[str, np.ndarray]
    shared: tuple[str, ...]
    private: tuple[str, ...]
    cfg: SpfdConfig
    threshold: float
    variant: str
    bank: int
    use_private: bool = True
    meta: dict[str, Any] = field(default_factory=dict)
    transitions: CategoryTransitions | None = None
    #: Its registry kind (``fedfraud.serving.graph_fraud.fraud_kind``).
    kind: ClassVar[str] = KIND

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {self.threshold}")
        self._net: Any = None
        self._groups: np.ndarray | None = None

    @property
    def input_names(self) -> tuple[str, ...]:
        """The row layout the model reads: the shared columns, then the bank's private ones."""
        return (*self.shared, *self.private)

    @property
    def used(self) -> tuple[str, ...]:
        return self.input_names

    def net(self) -> Any:
        """The torch module with these weights (built once)."""
        if self._net is None:
            from fedfraud.training.fraud.spfd.task import build_net, set_arrays

            self._net = build_net(self.shared, self.private, self.cfg, 0)
            set_arrays(self._net, self.arrays)
            self._net.eval()
        return self._net

    def _inputs(self, X: np.ndarray) -> torch.Tensor:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim == 1:
            X = X.reshape(1, -1)
        if X.ndim != 2 or X.shape[1] != len(self.input_names):
            raise ValueError(f"expected feature rows of {len(self.input_names)} values, got shape {X.shape}")
        x_s, x_p = self.net().inputs(X[:, : len(self.shared)], X[:, len(self.shared):])
        return torch.cat([x_s, x_p], dim=1)

    def _logit(self, x: torch.Tensor) -> torch.Tensor:
        net = self.net()
        width = net.shared.width
        return net(x[:, :width], x[:, width:], self.use_private).logit

    def scores(self, X: np.ndarray) -> np.ndarray:
        """Fraud probability per row (float64) of rows ``[n, len(input_names)]`` or one row."""
        with torch.no_grad():
            return torch.sigmoid(self._logit(self._inputs(X))).double().numpy()

    def predict_batch(self, X: np.ndarray, top_k: int = 3, reasons_for: str = "all") -> list[FraudDecision]:
        """Score, decision and top reasons per row, as :meth:`fedfraud.training.fraud.model.FraudModel.predict_batch`.

        A reason's contribution is gradient × input of the fraud log-odds (inputs are standardized, so 0 is the
        training mean), summed over a feature's input columns (its one-hot bucket, its missing indicator).
        """
        if reasons_for not in ("all", "fraud"):
            raise ValueError(f"reasons_for must be 'all' or 'fraud', got {reasons_for!r}")
        values = np.asarray(X, dtype=np.float64).reshape(-1, len(self.input_names))
        x = self._inputs(values).requires_grad_(True)
        logit = self._logit(x)
        logit.sum().backward()  # rows are independent: each row's own gradient
        score = torch.sigmoid(logit.detach()).double().numpy()
        assert x.grad is not None
        parts = (x.grad * x.detach()).double().numpy() @ self._group_matrix()
        out = []
        for i, s in enumerate(score.tolist()):
            fraud = s >= self.threshold
            reasons: tuple[Reason, ...] = ()
            if reasons_for == "all" or fraud:
                order = np.argsort(-parts[i] if fraud else parts[i], kind="stable")[:top_k]
                reasons = tuple(Reason(self.input_names[j], float(values[i, j]), float(parts[i, j])) for j in order)
            out.append(FraudDecision(float(min(max(s, 0.0), 1.0)), bool(fraud), reasons))
        return out

    def predict(self, features: np.ndarray, top_k: int = 3) -> FraudDecision:
        return self.predict_batch(np.asarray(features).reshape(1, -1), top_k)[0]

    def _group_matrix(self) -> np.ndarray:
        """``[input width, features]`` 0/1: which model inputs make up each feature of ``input_names``."""
        if self._groups is None:
            net = self.net()
            owners = [*net.shared.owners(), *net.private.owners()]
            groups = np.zeros((len(owners), len(self.input_names)))
            groups[np.arange(len(owners)), [self.input_names.index(o) for o in owners]] = 1.0
            self._groups = groups
        return self._groups

    def save(self, folder: Path) -> None:
        meta = {"shared": list(self.shared), "private": list(self.private), "spfd": self.cfg.model_dump(),
                "threshold": self.threshold, "variant": self.variant, "bank": self.bank,
                "use_private": self.use_private, "meta": self.meta}
        save_files(folder, WEIGHTS_FILE, META_FILE, self.arrays, meta, self.transitions)

    @classmethod
    def load(cls, folder: Path) -> SpfdFraudModel:
        arrays, meta, table = load_files(folder, WEIGHTS_FILE, META_FILE)
        return cls(arrays, tuple(meta["shared"]), tuple(meta["private"]), SpfdConfig.model_validate(meta["spfd"]),
                   float(meta["threshold"]), str(meta["variant"]), int(meta["bank"]), bool(meta["use_private"]),
                   dict(meta.get("meta", {})), table)

    def publish(self, registry: ModelRegistry, *, config: dict[str, Any], metrics: dict[str, Any],
                privacy: dict[str, Any] | None = None) -> ModelVersion:
        """Publish as kind ``fraud-spfd`` with a card naming the bank, its columns, what left every bank and its
        ``client_dp`` (DSFL's (ε, δ) and what it leaves out, or DP off).
        """
        from fedfraud.training.fraud.dsfl import client_dp_of, privacy_statement  # flwr: not at serving

        c = self.cfg
        sentence, fields = privacy_statement(client_dp_of(self.meta, c.aggregation), "FED-SPFD")
        card = "\n".join([
            f"FED-SPFD fraud model of **bank {self.bank}** (variant {self.variant}): a shared encoder over the "
            f"{len(self.shared)} columns every bank has (federated, embeddings aligned to the federation's mean "
            f"and covariance), this bank's private autoencoder over its {len(self.private)} own columns "
            f"({', '.join(self.private) or 'none'}), a federated classifier over both.",
            "",
            f"Decision: `score >= {self.threshold:.4f}` is fraud; the threshold maximises F1 on the banks' summed "
            "validation score histograms. Loss weights: "
            f"λ_alg={c.lambda_alg}, λ_p-n={c.lambda_pn}, λ_rec={c.lambda_rec}, sparsity={c.sparsity}; see "
            "docs/fraud.md#heterogeneous-banks-fed-spfd-issue-39.",
            "",
            "**What left each bank**: per-column sums (count, sum, sum of squares) of its transformed shared training "
            "columns, once; the shared encoder, its warm-start decoder and the classifier every round; every round, "
            f"the row count, the sum Σz and the sum of outer products Σzzᵀ of its training rows' {c.embed_dim}-wide "
            "shared embeddings (the server returns their pooled mean and covariance: a bank with few rows reveals "
            "close to the mean and spread of its own customers' embeddings); validation score histograms. "
            "Never rows, private columns, the private autoencoder or its scaler. " + sentence,
        ])
        privacy = {**(privacy or {}), **fields,
                   "leaves_a_bank": "shared-column scaler sums (once); shared encoder, warm-start decoder and "
                                    "classifier weights per round; per round the count, sum and sum of outer "
                                    "products of the bank's training rows' shared embeddings; validation score "
                                    "histograms; never rows, private columns or the private autoencoder"}
        with registry.publish(KIND, config=config, metrics=metrics, privacy=privacy,
                              extra={"variant": self.variant, "threshold": self.threshold, "bank": self.bank,
                                     "used": list(self.used), "private": list(self.private), **self.meta},
                              card=card) as staging:
            self.save(staging)
        version = registry.get(KIND, "latest")
        logger.info("spfd_model published=%s bank=%d variant=%s", version.tag, self.bank, self.variant)
        return version

    @classmethod
    def from_registry(cls, registry: ModelRegistry | Path | str, version: int | str = "latest") -> SpfdFraudModel:
        found = published(registry, KIND, version, WEIGHTS_FILE)
        model = cls.load(found.path)
        model.meta = {**model.meta, "registry_tag": found.tag}
        return model

"""The fraud model: an XGBoost booster over fraud features, its threshold and per-decision reasons.

Serving calls, per transaction::

    row = state.update(FraudInput(...))          # fedfraud.training.fraud.features
    decision = model.predict(row)                # FraudDecision(score, decision, top_reasons)

``predict`` takes the *full* feature row (every name of
:func:`~fedfraud.training.fraud.features.feature_names`) and picks the columns the
model was trained on, so a model without the anomaly score and one with it
are called the same way. Reasons are XGBoost SHAP contributions
(``pred_contribs=True``) in log-odds: for a fraud decision the features that
pushed the score up most, for a legitimate one those that pushed it down most.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from fedfraud.training.federated.accountant import dp_off_card
from fedfraud.training.fraud.config import FraudConfig
from fedfraud.training.fraud.features import ANOMALY_FEATURE, CategoryTransitions, FraudFeatures
from fedfraud.training.fraud.metrics import best_f1_threshold
from fedfraud.training.registry import ModelRegistry, ModelVersion

__all__ = [
    "MODEL_FILE",
    "META_FILE",
    "FraudDecision",
    "FraudModel",
    "Reason",
    "Variant",
    "fit_booster",
    "pos_weight",
    "to_dmatrix",
    "fit_model",
    "used_features",
    "xgb_params",
]

logger = logging.getLogger(__name__)

MODEL_FILE = "model.json"
META_FILE = "fraud_model.json"
KIND = "fraud"
Variant = Literal["local", "federated", "federated-dp", "centralized"]


def used_features(names: Sequence[str], use_anomaly_score: bool) -> tuple[str, ...]:
    """The columns a model trains on: all features, minus the anomaly score for the no-AS baselines."""
    return tuple(n for n in names if use_anomaly_score or n != ANOMALY_FEATURE)


def xgb_params(cfg: FraudConfig, scale_pos_weight: float, eta: float | None = None) -> dict[str, Any]:
    """XGBoost parameters; class imbalance is handled by ``scale_pos_weight`` (neg/pos, capped).

    ``base_score`` is fixed at 0.5 so every bank's trees in federated bagging
    start from the same prior (XGBoost would otherwise estimate it per bank).
    """
    return {
        "objective": "binary:logistic",
        "eval_metric": "aucpr",
        "tree_method": "hist",
        "max_depth": cfg.max_depth,
        "eta": cfg.eta if eta is None else eta,
        "subsample": cfg.subsample,
        "colsample_bytree": cfg.colsample_bytree,
        "min_child_weight": cfg.min_child_weight,
        "scale_pos_weight": float(scale_pos_weight),
        "base_score": 0.5,
        "nthread": cfg.nthread,
        "seed": cfg.seed,
        "verbosity": 0,
    }


def pos_weight(label: np.ndarray, cap: float) -> float:
    """neg/pos of the labels, in [1, cap]; 1 when there are no positives."""
    pos = float(np.sum(label == 1))
    neg = float(np.sum(label == 0))
    return 1.0 if pos == 0 else float(min(max(neg / pos, 1.0), cap))


def to_dmatrix(data: FraudFeatures, used: Sequence[str]) -> Any:
    import xgboost as xgb

    idx = [data.names.index(n) for n in used]
    label = data.label if data.has_labels else None
    return xgb.DMatrix(data.X[:, idx], label=label, feature_names=list(used), missing=np.nan,
                       nthread=1)


def fit_booster(train: FraudFeatures, used: Sequence[str], cfg: FraudConfig, rounds: int | None = None) -> Any:
    """Train one booster on labelled rows (local or pooled data)."""
    import xgboost as xgb

    if not train.has_labels:
        raise ValueError("training needs labelled rows")
    params = xgb_params(cfg, pos_weight(train.label, cfg.max_scale_pos_weight))
    return xgb.train(params, to_dmatrix(train, used), num_boost_round=cfg.num_boost_round if rounds is None else rounds)


@dataclass(frozen=True)
class Reason:
    """One feature's part in a decision: its value and SHAP contribution (log-odds)."""

    feature: str
    value: float
    contribution: float


@dataclass(frozen=True)
class FraudDecision:
    """The fraud model's answer for one transaction."""

    score: float
    decision: bool
    top_reasons: tuple[Reason, ...]

    def __post_init__(self) -> None:
        if not 0.0 <= self.score <= 1.0:
            raise ValueError(f"score must be in [0, 1], got {self.score}")


@dataclass
class FraudModel:
    """A trained fraud booster plus everything needed to use it consistently.

    Attributes:
        booster: the ``xgboost.Booster``.
        input_names: the full feature row layout the caller passes (``feature_names(cfg)``).
        used: the columns the booster was trained on (a subset of ``input_names``).
        threshold: decision threshold, ``score >= threshold`` is fraud (max F1 on validation data).
        variant: local, federated or centralized.
        meta: free-form provenance (bank, rounds, training sizes).
        transitions: the bank's category-transition table its ``mcc_transition_surprise`` column was computed
            with; serving passes it to ``FraudFeatureState.update`` (None: an older model, or none fitted).
    """

    booster: Any
    input_names: tuple[str, ...]
    used: tuple[str, ...]
    threshold: float
    variant: Variant
    meta: dict[str, Any] = field(default_factory=dict)
    transitions: CategoryTransitions | None = None

    def __post_init__(self) -> None:
        missing = [n for n in self.used if n not in self.input_names]
        if missing:
            raise ValueError(f"model features {missing} are not in the input layout")
        if not 0.0 <= self.threshold <= 1.0 or math.isnan(self.threshold):
            raise ValueError(f"threshold must be in [0, 1], got {self.threshold}")
        self._idx = np.asarray([self.input_names.index(n) for n in self.used], dtype=np.int64)
        trained = getattr(self.booster, "feature_names", None)
        if trained is not None and list(trained) != list(self.used):  # inplace_predict does not check the columns
            raise ValueError(f"the booster was trained on {list(trained)}, not on the model's {list(self.used)}")

    @property
    def uses_anomaly_score(self) -> bool:
        return ANOMALY_FEATURE in self.used

    def _rows(self, X: np.ndarray) -> np.ndarray:
        """The used columns of full feature rows ``[n, F]`` (or one row ``[F]``), float32, in the booster's order."""
        with np.errstate(over="ignore"):  # a value beyond float32 becomes inf, refused below with a clear error
            X = np.asarray(X, dtype=np.float32)
        if X.ndim == 1:
            X = X.reshape(1, -1)
        if X.ndim != 2 or X.shape[1] != len(self.input_names):
            raise ValueError(f"expected feature rows of {len(self.input_names)} values, got shape {X.shape}")
        rows = X[:, self._idx]
        if np.isinf(rows).any():  # what a DMatrix refuses (also a float64 beyond float32's range, now inf)
            raise ValueError("feature rows hold an infinite value (or one beyond float32's range)")
        return rows

    def _score_rows(self, rows: np.ndarray) -> np.ndarray:
        """Probabilities of :meth:`_rows` output. ``inplace_predict`` skips building a DMatrix (~0.1 ms of a
        micro-batch's ~0.24 ms here) and gives the same floats as ``predict`` on one.
        """
        return np.asarray(self.booster.inplace_predict(rows, missing=np.nan), dtype=np.float64).reshape(-1)

    def scores(self, X: np.ndarray) -> np.ndarray:
        """Fraud probability per row (float64) of full feature rows ``[n, F]`` or one row ``[F]``."""
        return self._score_rows(self._rows(X))

    def predict_batch(self, X: np.ndarray, top_k: int = 3, reasons_for: str = "all") -> list[FraudDecision]:
        """Score, decision and the ``top_k`` reasons of each row (``reasons_for="fraud"``: of the rows decided
        fraud only; the others get no reasons).

        The score comes from the booster's prediction (:meth:`scores`), not from the sigmoid of the SHAP sum:
        the two differ in the last float bits, and the drift monitor compares
        live scores with :meth:`scores` on quantile bins whose edges sit on the
        (discrete) score values, so a last-bit difference moved whole bins.
        Exact TreeSHAP is the expensive part (~0.2 ms per row for 200 trees of
        depth 4, one thread, against ~0.01 ms for the score), hence ``reasons_for``.
        """
        if reasons_for not in ("all", "fraud"):
            raise ValueError(f"reasons_for must be 'all' or 'fraud', got {reasons_for!r}")
        import xgboost as xgb

        values = self._rows(X)
        score = self._score_rows(values)
        explained = np.arange(len(score)) if reasons_for == "all" else np.flatnonzero(score >= self.threshold)
        contribs: dict[int, np.ndarray] = {}
        if len(explained):
            part = xgb.DMatrix(values[explained], feature_names=list(self.used), missing=np.nan, nthread=1)
            shap = np.asarray(self.booster.predict(part, pred_contribs=True))[:, :-1]  # drop the bias column
            contribs = dict(zip(explained.tolist(), shap, strict=True))
        out = []
        for i, s in enumerate(score.tolist()):
            fraud = s >= self.threshold
            reasons: tuple[Reason, ...] = ()
            if i in contribs:
                c = contribs[i]
                order = np.argsort(-c if fraud else c, kind="stable")[:top_k]
                reasons = tuple(Reason(self.used[j], float(values[i, j]), float(c[j])) for j in order)
            out.append(FraudDecision(float(min(max(s, 0.0), 1.0)), bool(fraud), reasons))
        return out

    def predict(self, features: np.ndarray, top_k: int = 3) -> FraudDecision:
        """One transaction: ``features`` is the row :meth:`FraudFeatureState.update` returned."""
        return self.predict_batch(np.asarray(features).reshape(1, -1), top_k)[0]

    def feature_importance(self, importance_type: str = "total_gain") -> dict[str, float]:
        """Importance per used feature (0 for features no tree splits on), largest first."""
        raw = self.booster.get_score(importance_type=importance_type)
        total = sum(raw.values()) or 1.0
        scores = {n: float(raw.get(n, 0.0)) / total for n in self.used}
        return dict(sorted(scores.items(), key=lambda kv: -kv[1]))

    # ------------------------------------------------------------------ persistence
    def save(self, folder: Path) -> None:
        """Write ``model.json`` (XGBoost's own format) and ``fraud_model.json`` (layout, threshold)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.booster.save_model(str(folder / MODEL_FILE))
        meta = {"input_names": list(self.input_names), "used": list(self.used), "threshold": self.threshold,
                "variant": self.variant, "meta": self.meta}
        if self.transitions is not None:  # the table serving must compute mcc_transition_surprise with
            meta["category_transitions"] = self.transitions.to_json()
        (folder / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")

    @classmethod
    def load(cls, folder: Path) -> FraudModel:
        import xgboost as xgb

        folder = Path(folder)
        meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
        booster = xgb.Booster()
        booster.load_model(str(folder / MODEL_FILE))
        booster.set_param({"nthread": 1})
        table = meta.get("category_transitions")  # absent in a model saved before the table existed
        return cls(booster, tuple(meta["input_names"]), tuple(meta["used"]), float(meta["threshold"]),
                   meta["variant"], meta.get("meta", {}),
                   None if table is None else CategoryTransitions.from_json(table))

    def publish(self, registry: ModelRegistry, *, config: dict[str, Any], metrics: dict[str, Any],
                privacy: dict[str, Any] | None = None, files: dict[str, bytes] | None = None) -> ModelVersion:
        """Publish as kind ``fraud`` with metrics and a card listing feature importances (``files``: more
        artifacts of the version, e.g. the drift reference).
        """
        dp = self.meta.get("client_dp")
        # random trees choose no split by gain: their importance is the share of splits
        importance = self.feature_importance("weight" if dp else "total_gain")
        if dp:  # variant federated-dp: the card states its (ε, δ) per cardholder
            statement = (f"**Privacy**: ({dp['epsilon']:.2f}, {dp['delta']:g})-DP per training cardholder over "
                         f"every release of its training (random trees, noised leaf sums; the SecAgg+ arithmetic "
                         f"replayed in one process), "
                         f"({dp['epsilon_validation_cardholders']:.2f}, {dp['delta']:g}) per validation cardholder "
                         "(the threshold); see the Privacy section and docs/privacy.md.")
            eps_valid = dp["epsilon_validation_cardholders"]
            guarantee = (f"({dp['epsilon']:.2f}, {dp['delta']:g})-DP per training cardholder (add/remove) for the "
                         f"split candidates and leaf sums its training sent, ({eps_valid:.2f}, {dp['delta']:g}) per "
                         "validation cardholder for the threshold histogram; the published model and the sums it "
                         "was built from")
        else:
            statement = ("**Privacy**: differential privacy is **off** for this model: no (ε, δ). XGBoost trees and "
                         "the federated histograms and sketches are not noised (see the Privacy section and "
                         "docs/privacy.md).")
            guarantee = "none: no (epsilon, delta) is claimed for the fraud model or what its training sent"
            dp = dp_off_card(
                f"{self.variant} XGBoost: trees, split values, quantile sketches and gradient/hessian histograms "
                "are not clipped or noised (variant federated-dp is the fraud model with cardholder-level DP)"
            )
        card = "\n".join([
            f"XGBoost fraud model, **{self.variant}** training, "
            f"{'with' if self.uses_anomaly_score else 'without'} the federated anomaly score (AS).",
            "",
            f"Decision: `score >= {self.threshold:.4f}` is fraud; the threshold maximises F1 on validation "
            "cardholders (held out of training by a hash of the cardholder).",
            "Inputs: the full feature row of `fedfraud.training.fraud.features.feature_names` (private features only).",
            "",
            statement,
            "",
            f"## Feature importance (share of {'splits' if dp else 'total gain'})",
            "",
            *[f"- {name}: {share:.3f}" for name, share in importance.items()],
        ])
        privacy = {**(privacy or {}), "formal_guarantee": guarantee, "client_dp": dp}
        with registry.publish(KIND, config=config, metrics=metrics, privacy=privacy,
                              extra={"variant": self.variant, "used": list(self.used), "threshold": self.threshold,
                                     "feature_importance": importance, **self.meta},
                              card=card) as staging:
            self.save(staging)
            for name, blob in (files or {}).items():
                (staging / name).write_bytes(blob)
        version = registry.get(KIND, "latest")
        logger.info("fraud_model published=%s variant=%s anomaly_score=%s", version.tag, self.variant,
                    self.uses_anomaly_score)
        return version

    @classmethod
    def from_registry(cls, registry: ModelRegistry | Path | str, version: int | str = "latest") -> FraudModel:
        """Load a published fraud model (what serving calls at start-up and on hot swap)."""
        reg = registry if isinstance(registry, ModelRegistry) else ModelRegistry(registry)
        found = reg.get(KIND, version)
        found.file(MODEL_FILE)
        model = cls.load(found.path)
        model.meta = {**model.meta, "registry_tag": found.tag}
        return model


def fit_model(train: FraudFeatures, valid: FraudFeatures, use_anomaly_score: bool, cfg: FraudConfig,
              variant: Variant, meta: dict[str, Any] | None = None) -> FraudModel:
    """Local or centralized model: fit on ``train``, choose the max-F1 threshold on ``valid``."""
    used = used_features(train.names, use_anomaly_score)
    booster = fit_booster(train, used, cfg)
    model = FraudModel(booster, train.names, used, 0.5, variant, dict(meta or {}), train.transitions)
    if len(valid) and valid.has_labels:
        threshold, f1 = best_f1_threshold(valid.label, model.scores(valid.X))
    else:
        threshold, f1 = 0.5, float("nan")
    model.threshold = threshold
    model.meta.update({"train_rows": len(train), "valid_rows": len(valid), "valid_f1": f1})
    return model

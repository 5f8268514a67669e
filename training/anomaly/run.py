"""Round bookkeeping shared by the federated and the centralized trainer: metrics, logs, checkpoints, publishing.

A round's per-bank test metrics are summarised as mean and std over banks
(the thesis reports mean ± std over clients) and logged as one
``key=value`` line. After every round the global weights, the round number
and the whole metrics history are written atomically to
``<run dir>/checkpoint.pt`` (and the history to ``history.json``), so a
crashed run resumes from its last completed round.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedfraud.core.errors import UserError
from fedfraud.feature_store.config import EgoGraphConfig, EncoderConfig
from fedfraud.training.anomaly.config import AnomalyConfig
from fedfraud.training.anomaly.data import BankPrivacy
from fedfraud.training.anomaly.scorer import publish_anomaly_model
from fedfraud.training.registry import ModelRegistry, ModelVersion
from fedfraud.training.safe_load import NUMPY_ARRAYS, load_torch_file

__all__ = [
    "CHECKPOINT_FILE",
    "Checkpoint",
    "RoundRecord",
    "selected_record",
    "checkpoint_dir",
    "log_round",
    "privacy_report",
    "publish_run",
    "summarize_banks",
]

logger = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.pt"
HISTORY_FILE = "history.json"


def checkpoint_dir(out: Path, mode: str) -> Path:
    """Where a run of ``mode`` (``federated`` / ``centralized``) keeps its checkpoint under the artifacts dir."""
    return Path(out) / "checkpoints" / f"anomaly-{mode}"


def summarize_banks(per_bank: Mapping[int, Mapping[str, float]]) -> dict[str, float]:
    """``{metric}_mean`` and ``{metric}_std`` over banks (NaNs, e.g. a bank without fraud, are skipped)."""
    out: dict[str, float] = {}
    keys = sorted({k for m in per_bank.values() for k in m})
    for key in keys:
        vals = np.array([float(m[key]) for m in per_bank.values() if key in m], dtype=np.float64)
        vals = vals[np.isfinite(vals)]
        out[f"{key}_mean"] = float(vals.mean()) if vals.size else float("nan")
        out[f"{key}_std"] = float(vals.std()) if vals.size else float("nan")
    return out


@dataclass(frozen=True)
class RoundRecord:
    """One completed round: its number, mean training loss, per-bank test metrics and wall time."""

    round: int
    train_loss: float
    per_bank: dict[int, dict[str, float]]
    seconds: float
    summary: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.round < 1:
            raise ValueError("rounds count from 1")
        if not self.per_bank:
            raise ValueError(f"round {self.round} has no bank metrics")
        if not self.summary:
            object.__setattr__(self, "summary", summarize_banks(self.per_bank))

    def to_json(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "train_loss": self.train_loss,
            "seconds": self.seconds,
            "summary": self.summary,
            "per_bank": {str(k): v for k, v in self.per_bank.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RoundRecord:
        return cls(
            int(data["round"]),
            float(data["train_loss"]),
            {int(k): dict(v) for k, v in data["per_bank"].items()},
            float(data["seconds"]),
            dict(data["summary"]),
        )


def log_round(record: RoundRecord, total: int, mode: str) -> None:
    """One ``key=value`` line for the round (means over banks) plus one per bank at DEBUG."""
    s = record.summary
    parts = [f"mode={mode}", f"round={record.round}/{total}", f"train_loss={record.train_loss:.4f}"]
    keys = ("val_loss", "loss", "accuracy", "precision", "recall", "f1", "roc_auc")
    if record.round == total:  # the fraud check on test cardholders: once, so the log invites no choice by round
        keys += ("fraud_roc_auc", "fraud_pr_auc")
    for key in keys:
        if f"{key}_mean" in s:
            parts.append(f"test_{key}={s[f'{key}_mean']:.4f}±{s[f'{key}_std']:.4f}")
    parts.append(f"seconds={record.seconds:.1f}")
    logger.info(" ".join(parts))
    for bank, metrics in sorted(record.per_bank.items()):
        logger.info(
            "mode=%s round=%d bank=%d %s",
            mode,
            record.round,
            bank,
            " ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items())
                     if record.round == total or not k.startswith("fraud_")),
        )


@dataclass
class Checkpoint:
    """Global weights after ``round`` completed rounds, the history so far and the settings that produced them."""

    round: int
    state_dict: dict[str, Tensor]
    history: list[RoundRecord]
    settings: dict[str, Any]
    optimizer: dict[str, Any] | None = None
    privacy: dict[int, dict[str, float]] = field(default_factory=dict)
    dp_ledger: list[dict[str, float]] = field(default_factory=list)  # one entry per released round (accountant)
    best_round: int = 0
    best_val_loss: float = math.inf
    best_state_dict: dict[str, Tensor] | None = None

    def offer(self, record: RoundRecord, state_dict: Mapping[str, Tensor]) -> None:
        """Record a completed round; keep its weights as the best when its mean validation loss is the lowest.

        Model selection uses validation cardholders only (``val_loss_mean``);
        without one (thesis readouts) the latest round is the selected one.
        """
        self.round = record.round
        self.state_dict = dict(state_dict)
        self.history.append(record)
        val = record.summary.get("val_loss_mean", math.nan)
        if not math.isfinite(val):
            self.best_round, self.best_state_dict = record.round, None
        elif val < self.best_val_loss:
            self.best_round, self.best_val_loss = record.round, val
            self.best_state_dict = {k: v.detach().cpu().clone() for k, v in state_dict.items()}

    @property
    def selected(self) -> tuple[int, dict[str, Tensor]]:
        """(round, weights) to publish: the best validation round, else the latest."""
        if self.best_state_dict is not None:
            return self.best_round, self.best_state_dict
        return self.round, self.state_dict

    @property
    def selected_summary(self) -> dict[str, float]:
        """The published round's summary, so a run's result reports the weights it publishes (empty before any
        round).
        """
        return dict(selected_record(self.history, self.selected[0]).summary) if self.history else {}

    def save(self, directory: Path) -> Path:
        """Atomic write of ``checkpoint.pt`` (and ``history.json`` for people)."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / CHECKPOINT_FILE
        payload = {
            "round": self.round,
            "state_dict": {k: v.detach().cpu() for k, v in self.state_dict.items()},
            "history": [r.to_json() for r in self.history],
            "settings": self.settings,
            "optimizer": self.optimizer,
            "privacy": self.privacy,
            "dp_ledger": self.dp_ledger,
            "best_round": self.best_round,
            "best_val_loss": self.best_val_loss,
            "best_state_dict": self.best_state_dict,
        }
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".pt", dir=directory)
        with os.fdopen(fd, "wb") as fh:
            torch.save(payload, fh)
        os.replace(tmp, path)
        (directory / HISTORY_FILE).write_text(json.dumps(payload["history"], indent=1), encoding="utf-8")
        return path

    @classmethod
    def load(cls, directory: Path) -> Checkpoint | None:
        """The checkpoint in ``directory``, or None if there is none."""
        path = Path(directory) / CHECKPOINT_FILE
        if not path.exists():
            return None
        # tensors and plain values only (numpy scalars of older checkpoints too): a pickle that would call anything
        # is refused in one line, and nothing in it runs
        payload = load_torch_file(path, NUMPY_ARRAYS, "checkpoint")
        if not isinstance(payload, dict):
            raise UserError(f"{path} is not a checkpoint (it holds a {type(payload).__name__})")
        return cls(
            round=int(payload["round"]),
            state_dict=payload["state_dict"],
            history=[RoundRecord.from_json(r) for r in payload["history"]],
            settings=dict(payload["settings"]),
            optimizer=payload.get("optimizer"),
            privacy={int(k): v for k, v in (payload.get("privacy") or {}).items()},
            dp_ledger=list(payload.get("dp_ledger") or []),
            best_round=int(payload.get("best_round", 0)),
            best_val_loss=float(payload.get("best_val_loss", math.inf)),
            best_state_dict=payload.get("best_state_dict"),
        )

    def check_compatible(self, settings: Mapping[str, Any], keys: tuple[str, ...]) -> None:
        """Refuse to resume with settings that change the model or the data (one-line :class:`UserError`)."""
        diff = [k for k in keys if k in self.settings and k in settings and self.settings[k] != settings[k]]
        if diff:
            k = diff[0]
            raise UserError(
                f"cannot resume: {k}={settings[k]!r} differs from the checkpoint's {self.settings[k]!r} "
                "(drop --resume or use another --out)"
            )


def privacy_report(
    per_bank: Mapping[int, BankPrivacy | Mapping[str, float]],
    client_dp: Mapping[str, Any],
    feature_ldp: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Registry privacy section: the client-level DP of what left the banks (``client_dp``, from the federation's
    accountant, or ``dp: off`` said plainly), the feature mechanism inside the banks, and the thesis's μ-GDP figure
    labelled as the heuristic it is (issue 15's review).
    """
    banks = {int(b): (vars(p) if isinstance(p, BankPrivacy) else dict(p)) for b, p in per_bank.items()}
    mus = [float(p["mu_gdp"]) for p in banks.values()]
    dp = dict(client_dp)
    if dp.get("dp") == "on" and dp.get("noise") == "dsfl":
        guarantee = (
            f"({dp['epsilon']:.3g}, {dp['delta']:g})-DP per cardholder (any change to one bank's data) over all "
            f"{dp['rounds']} DSFL rounds, for every update a bank sends and every released model (Laplace noise "
            f"added inside each bank; ({dp['epsilon_bank']:.3g}, {dp['delta']:g}) per bank against a zero update; "
            "see client_dp for what is not covered)"
        )
    elif dp.get("dp") == "on" and dp.get("noise") == "distributed":
        guarantee = (
            f"({dp['epsilon']:.3g}, {dp['delta']:g})-DP per cardholder (add/remove all of one training "
            f"cardholder's transactions) over all {dp['steps']} DP-FedSGD rounds, for every sum the server decodes "
            "and every released model (each bank adds a share of the noise; SecAgg+ sums at least "
            f"{dp.get('min_banks_summed')} banks' shares; see client_dp for what is not covered)"
        )
    elif dp.get("dp") == "on" and str(dp.get("unit_of_privacy", "")).startswith("one cardholder"):
        guarantee = (
            f"({dp['epsilon']:.3g}, {dp['delta']:g})-DP per cardholder (add/remove all of one training "
            f"cardholder's transactions) over all {dp['steps']} local DP-SGD steps of {dp['rounds']} rounds, for "
            "every update a bank sends and every released model (DP-SGD noise added inside each bank; see "
            "client_dp for what is not covered)"
        )
    elif dp.get("dp") == "on":
        guarantee = (
            f"({dp['epsilon']:.3g}, {dp['delta']:g})-DP for one bank's whole contribution over all {dp['rounds']} "
            "rounds, on the released models (client-level DP, see client_dp); the server itself sees clipped "
            "updates without noise"
        )
    else:
        guarantee = (
            "none: no (epsilon, delta) is claimed for what leaves a bank (client_dp: "
            f"{dp.get('dp', 'off')}). The feature noise stays inside the bank"
        )
    features = (
        str(feature_ldp["mechanism"])
        if feature_ldp is not None
        else "personalized LDP private shuffle (thesis Algorithm 3) on L' and T'"
    )
    return {
        "formal_guarantee": guarantee,
        "client_dp": dp,
        **({"feature_ldp": dict(feature_ldp)} if feature_ldp is not None else {}),
        "mechanism": f"{features}, inside each bank; merchant ids hashed under the federation's key (the server "
                     "cannot name a bank's merchants from the rows its update changes)",
        "thesis_heuristic": (
            "mu-GDP, mu = sqrt(2 / (sum_i q_i - max_i q_i)), q_i = (1 - delta_i) / (1 + e^eps_i): the thesis's "
            "shuffle-amplification figure, NOT a guarantee here. Its premises do not hold: there is no shuffler "
            "across users, each cardholder releases many reports, the noise's sigma never enters it, and it counts "
            "the coordinates of one vector as users; it shrinks with bank size whatever the noise"
        ),
        "mu_gdp_per_bank": {str(b): p["mu_gdp"] for b, p in sorted(banks.items())},
        "mu_gdp_max": max(mus) if mus else math.inf,
        "per_bank": {str(b): p for b, p in sorted(banks.items())},
        "leaves_a_bank": "model parameters after local training (trained with cardholder-level DP-SGD, or the "
                         "bank's update clipped to L2 <= clipping_norm, when client_dp says so) and scalar metrics "
                         "(losses, counts, the heuristic above); no features, graphs, ids or coordinates",
    }


def _card(mode: str, anomaly_cfg: AnomalyConfig, rounds: int, chosen: RoundRecord) -> str:
    auc = chosen.summary.get("fraud_roc_auc_mean", float("nan"))
    encoder = (
        f"a {anomaly_cfg.layers}-layer GCN with `{anomaly_cfg.pooling}` pooling (ratio {anomaly_cfg.ratio}) over each "
        "cardholder's private dynamic ego graph"
    )
    if anomaly_cfg.readout == "next-event":
        what = (
            f"Anomaly model for card transactions: {encoder} and its event history embed G_(t-1); a next-event head "
            f"predicts the next transaction's {anomaly_cfg.heads.replace(',', ', ')}. Trained {mode} for {rounds} "
            "round(s) on real transactions only (no labels, no negatives).",
            "**Score**: 1 - exp(-NLL/10), NLL = negative log-likelihood of the transaction under the model of this "
            "cardholder's next transaction; high means unusual for this cardholder.",
        )
    elif anomaly_cfg.readout == "contrastive":
        what = (
            f"Anomaly model for card transactions: {encoder} embeds G_(t-1); a contrastive head tells the "
            f"cardholder's real next transaction from event negatives ({anomaly_cfg.negatives}). Trained {mode} for "
            f"{rounds} round(s) without labels.",
            "**Score**: 1 - f(G_(t-1), event) in [0, 1]; high means unusual for this cardholder.",
        )
    else:
        what = (
            f"Anomaly model for card transactions (thesis readout): {encoder}, and a 2-layer discriminator "
            f"f(q_prev, q_cur). Trained {mode} for {rounds} round(s) without labels, on perturbed graphs (C1 "
            "topology, C2 node features, C3 both) as negatives.",
            "**Score**: anomaly score = 1 - f(q_prev, q_cur) in [0, 1]; high means unusual for this cardholder.",
        )
    return "\n".join(
        [
            what[0],
            "",
            what[1],
            "",
            f"**Published weights**: round {chosen.round} of {rounds} (the lowest mean validation loss; the latest "
            "round when the readout has none).",
            "",
            f"**ROC-AUC against real fraud labels** (in-training check of these weights on test cardholders): "
            f"{auc:.3f}. The "
            "benchmark (`fedfraud bench anomaly`) gives intervals and baselines.",
            "",
            "**Inputs**: noised location L' (nodes), noised time T' (edges), hashed merchant buckets and a summary "
            "of the cardholder's event history; the newest transaction enters as discretised fields or derived "
            "features. No raw coordinates, timestamps or ids. The featurizer must use the encoder config stored "
            "with the model.",
            "",
            "**Limits**: trained on the banks' own history; a cardholder's first transaction has no score; the "
            "score is a behaviour-change signal, not a fraud probability.",
            *(
                []
                if anomaly_cfg.ablate == "none"
                else ["", f"**Ablated** (`anomaly.ablate={anomaly_cfg.ablate}`): a study variant, not the product "
                      "model."]
            ),
        ]
    )


def publish_run(
    registry: ModelRegistry,
    state_dict: Mapping[str, Tensor],
    *,
    mode: str,
    anomaly_cfg: AnomalyConfig,
    encoder_cfg: EncoderConfig,
    ego_cfg: EgoGraphConfig,
    config: dict[str, Any],
    history: list[RoundRecord],
    privacy: Mapping[int, BankPrivacy | Mapping[str, float]],
    client_dp: Mapping[str, Any],
    feature_ldp: Mapping[str, Any] | None = None,
    selected_round: int | None = None,
) -> ModelVersion:
    """Publish the selected weights with config, the selected round's metrics (mean/std and per bank: the weights'
    own figures, not the last round's), history and privacy (``client_dp``: the accountant's card of the run's
    releases, or a plain ``dp: off``; ``feature_ldp``: the feature mechanism inside the banks,
    :func:`fedfraud.feature_store.privacy.feature_ldp_card`).
    """
    if not history:
        raise ValueError("nothing to publish: no completed round")
    last = history[-1]
    chosen = selected_record(history, selected_round)
    metrics: dict[str, Any] = {
        "mode": mode,
        "rounds": last.round,
        "selected_round": chosen.round,
        **{k: v for k, v in chosen.summary.items()},
        "per_bank": {str(b): m for b, m in chosen.per_bank.items()},
        "seconds_per_round": float(np.mean([r.seconds for r in history])),
        "history": [
            {
                "round": r.round,
                "train_loss": r.train_loss,
                "val_loss_mean": r.summary.get("val_loss_mean"),
                "f1_mean": r.summary.get("f1_mean"),
                "roc_auc_mean": r.summary.get("roc_auc_mean"),
            }
            for r in history
        ],
    }
    version = publish_anomaly_model(
        registry,
        dict(state_dict),
        anomaly_cfg=anomaly_cfg,
        encoder_cfg=encoder_cfg,
        ego_cfg=ego_cfg,
        config=config,
        metrics=metrics,
        privacy=privacy_report(privacy, client_dp, feature_ldp),
        card=_card(mode, anomaly_cfg, last.round, chosen),
    )
    logger.info(
        "published=%s mode=%s rounds=%d selected_round=%d f1=%.4f",
        version.tag,
        mode,
        last.round,
        chosen.round,
        chosen.summary.get("f1_mean", float("nan")),
    )
    return version


def selected_record(history: list[RoundRecord], selected_round: int | None) -> RoundRecord:
    """The record of the published round (the last one when none was selected); a round not in the history is an
    error, not the last round's figures under another round's weights.
    """
    if selected_round is None:
        return history[-1]
    found = next((r for r in history if r.round == selected_round), None)
    if found is None:
        raise ValueError(f"selected round {selected_round} is not in the history ({[r.round for r in history]})")
    return found

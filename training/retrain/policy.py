"""The promotion policy: challenger vs champion on the same labelled transactions, decided on evidence.

Both models scored every shadowed transaction (the champion decided, the
challenger only scored), so the comparison is paired. Once ``min_frauds``
labelled frauds have both scores, a cardholder bootstrap (the resampling unit
is the cardholder: a fraud spell is many rows of one card) gives 95 %
intervals of the *differences* challenger − champion in PR-AUC and in recall
at ``fpr_target``. The challenger is promoted only when the PR-AUC
difference interval lies above zero and the recall difference is not below
zero beyond its interval; otherwise the champion stays and the challenger is
retired. Either way the registry's audit log records the decision and its
figures.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedfraud.feature_store.outcomes import OutcomeStore
from fedfraud.training.bootstrap import RankedScores, bootstrap_counts, interval, weighted_metrics
from fedfraud.training.registry import ModelRegistry, RegistryError
from fedfraud.training.retrain.config import RetrainConfig

__all__ = ["PolicyDecision", "compare", "decide_promotion", "verdict"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PolicyDecision:
    """``promote``, ``keep`` (challenger retired) or ``wait`` (too few labelled frauds), and why."""

    action: str
    reason: str
    champion: str | None = None
    challenger: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def compare(pairs: pd.DataFrame, cfg: RetrainConfig) -> dict[str, Any]:
    """Point figures and paired bootstrap intervals of challenger − champion on ``pairs``.

    ``pairs`` has ``cardholder``, ``is_fraud``, ``champion_score``, ``challenger_score`` (one row per transaction).
    """
    y = pairs["is_fraud"].to_numpy(bool)
    codes, holders = pd.factorize(pairs["cardholder"].astype(str))
    ranked = {m: RankedScores.of(y, pairs[f"{m}_score"].to_numpy(np.float64), np.inf)
              for m in ("champion", "challenger")}
    ones = np.ones(len(y))
    point = {m: weighted_metrics(r, ones, cfg.fpr_target) for m, r in ranked.items()}
    counts = bootstrap_counts(len(holders), cfg.bootstrap_reps, cfg.seed)
    diffs: dict[str, list[float]] = {"pr_auc": [], "recall_at_fpr": []}
    for rep in counts:
        w = rep[codes]
        got = {m: weighted_metrics(r, w, cfg.fpr_target) for m, r in ranked.items()}
        for metric in diffs:
            diffs[metric].append(got["challenger"][metric] - got["champion"][metric])
    out: dict[str, Any] = {"transactions": int(len(y)), "frauds": int(y.sum()), "cardholders": int(len(holders)),
                           "bootstrap_reps": cfg.bootstrap_reps, "fpr_target": cfg.fpr_target}
    for metric, draws in diffs.items():
        ci = interval([point["challenger"][metric] - point["champion"][metric]], np.asarray([draws]))
        out[metric] = {"champion": point["champion"][metric], "challenger": point["challenger"][metric],
                       "difference": ci.value, "difference_95ci": [ci.low, ci.high]}
    return out


def verdict(figures: dict[str, Any]) -> tuple[str, str]:
    """``("promote" | "keep", reason)`` from :func:`compare`'s figures: promote only when the PR-AUC gain's 95%
    interval lies above zero and recall at the FPR target is not worse beyond its interval.
    """
    pr, rec, frauds = figures["pr_auc"], figures["recall_at_fpr"], figures["frauds"]
    ci = f"[{pr['difference_95ci'][0]:+.3f}, {pr['difference_95ci'][1]:+.3f}]"
    if pr["difference_95ci"][0] > 0 and rec["difference_95ci"][1] >= 0:
        return "promote", (f"challenger PR-AUC {pr['challenger']:.3f} vs champion {pr['champion']:.3f}, difference "
                           f"{pr['difference']:+.3f} with 95% CI {ci} above zero on {frauds} labelled frauds")
    why = ("its PR-AUC gain's interval includes zero" if pr["difference_95ci"][0] <= 0
           else "its recall at the FPR target is worse beyond the interval")
    return "keep", (f"champion kept: challenger PR-AUC {pr['challenger']:.3f} vs {pr['champion']:.3f} (difference "
                    f"{pr['difference']:+.3f}, 95% CI {ci}); {why}; {frauds} labelled frauds")


def decide_promotion(registry: Path | str, outcomes: Path | str, cfg: RetrainConfig, actor: str = "policy",
                     apply: bool = True) -> PolicyDecision:
    """Compare the registry's challenger pair with its champion on the labelled outcomes; promote, retire or wait.

    The pair is read once and holds the registry's retrain lock throughout, so
    no cycle can register a new challenger between the evaluation and the
    alias change (while a cycle runs, the policy waits). The pairs compared are
    the transactions this exact pair shadowed: the fraud model's and the GNN's
    tags both match. Unlabelled transactions older than ``label_maturity_days``
    count as genuine, as in the retrain cycle. With ``apply`` the decision is
    carried out (aliases moved, audit appended); ``wait`` changes nothing.
    Serving swaps the new champion pair in between micro-batches.
    """
    import time

    from fedfraud.training.retrain.cycle import RetrainBusy, cycle_lock

    reg = ModelRegistry(registry)
    try:
        with cycle_lock(Path(registry)):
            pair = {k: reg.aliases(k).get("challenger") for k in ("anomaly", "fraud")}
            if pair["fraud"] is None:
                return PolicyDecision("wait", "no challenger to evaluate")
            try:
                champion_v = reg.get("fraud", "champion")
            except RegistryError as exc:
                return PolicyDecision("wait", str(exc))
            challenger_v = reg.get("fraud", pair["fraud"])
            anomaly_tag = reg.get("anomaly", pair["anomaly"]).tag if pair["anomaly"] is not None else None
            mature = int((time.time() - cfg.label_maturity_days * 86_400) * 1e6)
            with OutcomeStore(outcomes) as store:
                pairs = store.labelled_pairs(champion_v.tag, challenger_v.tag, anomaly_tag, mature)
            frauds = int(pairs["is_fraud"].sum())
            base = {"champion": champion_v.tag, "challenger": challenger_v.tag}
            if frauds < cfg.min_frauds or frauds == len(pairs):
                return PolicyDecision("wait", f"{frauds} labelled frauds scored by both models; the policy needs "
                                      f"{cfg.min_frauds} (and genuine ones)", **base,
                                      evidence={"transactions": int(len(pairs)), "frauds": frauds})
            figures = compare(pairs, cfg)
            action, reason = verdict(figures)
            decision = PolicyDecision(action, reason, **base, evidence=figures)
            if apply:
                _carry_out(reg, decision, pair, actor)
    except RetrainBusy:
        return PolicyDecision("wait", "a retrain cycle is running; the policy decides once it has registered")
    log.info("promotion policy: %s: %s", action, reason)
    return decision


def _carry_out(reg: ModelRegistry, decision: PolicyDecision, pair: dict[str, int | None], actor: str) -> None:
    """Promote the evaluated challenger pair, or retire it (the caller holds the retrain lock)."""
    for kind, version in pair.items():
        if version is None:
            continue
        if decision.action == "promote":
            reg.promote(kind, version, actor=actor, reason=decision.reason, evidence=decision.evidence)
        else:
            reg.set_alias(kind, "challenger", None, actor=actor, reason=decision.reason, evidence=decision.evidence)

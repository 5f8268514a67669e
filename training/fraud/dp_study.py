"""``fedfraud eval fraud-dp``: what cardholder-level DP costs the fraud model, FL against FL-DP in one run.

Rows: the same feature rows and cardholder split as ``eval variants`` (no anomaly score; merchant-risk columns when
``fraud.merchant_risk_features`` is on). Models, all trained on the training cardholders of every bank:

* ``federated XGBoost``: the shipped default (histogram federation, no noise; its histograms leave the banks in
  clear inside libxgboost's collective);
* ``federated XGBoost, own-history columns``: the same federation without the columns a DP model may not read
  (computed from other cardholders' rows: :func:`~fedfraud.training.fraud.dp_boost.own_history_columns`): what
  dropping them costs;
* ``random trees, no noise``: the DP variant's trees with the noise switched off (ε = ∞): what the data-independent
  structure alone costs (the ablation);
* ``random trees, ε = …``: variant ``federated-dp`` at each ε (:mod:`fedfraud.training.fraud.dp_boost`), the
  threshold from the noised validation release.

Noise: the random trees and their DP noise are drawn ``seeds`` times (seeds ``fraud.seed + k``); a model's figure is
the mean over seeds. 95 % intervals from a bootstrap over test cardholders, every model on the same replicates
(metrics averaged over seeds inside each replicate), so the differences to ``federated XGBoost`` are paired.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from fedfraud.training.bootstrap import Interval, RankedScores, bootstrap_counts, interval, metric_draws
from fedfraud.training.fraud.config import FraudConfig
from fedfraud.training.fraud.features import FraudFeatures

__all__ = ["DPStudyReport", "dp_study", "run_dp_study"]

logger = logging.getLogger(__name__)

FL = "federated XGBoost"
FL_OWN = "federated XGBoost, own-history columns"
NO_NOISE = "random trees, no noise"
METRICS = ("pr_auc", "recall_at_fpr")
TITLES = {"pr_auc": "PR-AUC", "recall_at_fpr": "recall@1%FPR"}


def _dp_label(epsilon: float) -> str:
    return f"random trees, ε = {epsilon:g}"


@dataclass(frozen=True)
class DPStudyReport:
    """Intervals per model, paired differences to federated XGBoost, each DP model's card figures."""

    models: tuple[str, ...]
    single: dict[str, dict[str, Interval]]
    diff: dict[str, dict[str, Interval]]
    cards: dict[str, dict[str, Any]]
    info: dict[str, Any] = field(default_factory=dict)

    def to_markdown(self, more: str = "") -> str:
        i = self.info
        dp_models = [m for m in self.models if m in self.cards]
        summary = (
            f"{FL} {self.single[FL]['pr_auc'].fmt()} PR-AUC; on the own-history columns a DP model may read "
            f"{self.single[FL_OWN]['pr_auc'].fmt()} ({self.diff[FL_OWN]['pr_auc'].fmt(100, 1, True)} points); "
            "random trees without noise "
            f"{self.single[NO_NOISE]['pr_auc'].fmt()} ({self.diff[NO_NOISE]['pr_auc'].fmt(100, 1, True)} points); "
            "with cardholder-level DP at ε = " + " / ".join(f"{self.cards[m]['epsilon']:.3g}" for m in dp_models)
            + f" (δ {self.cards[dp_models[0]]['delta']:g}): " if dp_models else "")
        if dp_models:
            summary += (" / ".join(f"{self.single[m]['pr_auc'].value:.3f}" for m in dp_models) + " ("
                        + " / ".join(self.diff[m]["pr_auc"].fmt(100, 1, True) for m in dp_models)
                        + f" points against {FL})")
        summary += f"; pooled test cardholders, {i.get('test_frauds', '?')} test frauds, 95 % intervals in the table."
        lines = [summary, "", *([more, ""] if more else []),
                 "### The fraud model under cardholder-level DP: FL against FL-DP (eval fraud-dp)", "",
                 "| model (pooled test cardholders; mean over seeds [95 % interval]) | PR-AUC | recall@1%FPR "
                 "| PR-AUC − FL (points) | ε (training cardholders) | ε (validation cardholders) | δ |",
                 "|---|---:|---:|---:|---:|---:|---:|"]
        for m in self.models:
            card = self.cards.get(m)
            eps = (f"{card['epsilon']:.2f} | {card['epsilon_validation_cardholders']:.2f} | {card['delta']:g}"
                   if card and card.get("dp") == "on" else "∞ (no DP) | ∞ | –")
            d = self.diff[m]["pr_auc"].fmt(100, 1, True) if m in self.diff else "–"
            lines.append(f"| {m} | {self.single[m]['pr_auc'].fmt()} | {self.single[m]['recall_at_fpr'].fmt()} | {d} "
                         f"| {eps} |")
        lines += [""]
        lines.append(
            f"Data: {i.get('data', '?')}; banks={i.get('banks', '?')}; rows={i.get('rows', '?')}; training "
            f"cardholders={i.get('train_cardholders', '?')}; test cardholders={i.get('test_cardholders', '?')}; "
            f"**test frauds={i.get('test_frauds', '?')}**; bootstrap: {i.get('reps', '?')} replicates over test "
            f"cardholders; {i.get('features', '')}; {i.get('columns', '')}; DP trees: {i.get('dp', '?')}; "
            f"XGBoost: {i.get('xgb', '?')}; "
            f"wall {float(i.get('seconds', math.nan)):.0f} s; load average at start {i.get('load_start', '?')}, at "
            f"end {i.get('load_end', '?')}.")
        lines += ["", "**Paired differences to federated XGBoost** (points)", "",
                  "| comparison | " + " | ".join(TITLES[m] for m in METRICS) + " |", "|---|" + "---:|" * len(METRICS)]
        for name, d in self.diff.items():
            lines.append(f"| {name} − {FL} | " + " | ".join(d[m].fmt(100, 2, True) for m in METRICS) + " |")
        return "\n".join(lines) + "\n"


def _load() -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def run_dp_study(banks: Mapping[int, FraudFeatures], cfg: FraudConfig, epsilons: Sequence[float], *,
                 seeds: int = 3, reps: int | None = None, info: dict[str, Any] | None = None) -> DPStudyReport:
    """Train FL and the DP variant at each ε (plus without noise) on the same rows, score every bank's test
    cardholders, bootstrap over them.
    """
    from fedfraud.training.fraud.dp_boost import dp_boost_card, own_history_columns, to_booster, train_dp_boost
    from fedfraud.training.fraud.federated.hist import HistJob, federated_hist_train
    from fedfraud.training.fraud.metrics import classification_metrics
    from fedfraud.training.fraud.model import to_dmatrix, used_features

    started, load_start = time.perf_counter(), _load()
    reps = cfg.bootstrap_reps if reps is None else reps
    order = sorted(banks)
    if len(order) < 3:
        from fedfraud.core.errors import UserError

        raise UserError(f"the DP models need at least 3 banks (SecAgg+ sums a majority of them); the data has "
                        f"{len(order)}")
    if any(not banks[b].has_labels for b in order):
        raise ValueError("evaluation needs labels")
    names = next(iter(banks.values())).names
    used = own_history_columns(names)
    dropped = tuple(n for n in used_features(names, False) if n not in used)
    test = FraudFeatures.concat([banks[b].of_split("test") for b in order])
    runs: dict[str, list[tuple[np.ndarray, float]]] = {}
    cards: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    fls = federated_hist_train(dict(banks), cfg.model_copy(update={"nthread": 1}),
                               [HistJob("FL", None, cfg.seed), HistJob("own", None, cfg.seed, drop=dropped)],
                               tls=cfg.federated_tls, timeout_s=cfg.federated_timeout_s)
    runs[FL] = [(fls["FL"].scores(test.X), fls["FL"].threshold)]
    runs[FL_OWN] = [(fls["own"].scores(test.X), fls["own"].threshold)]
    seconds = {FL: (time.perf_counter() - t0) / 2, FL_OWN: (time.perf_counter() - t0) / 2}
    for eps in (math.inf, *epsilons):
        label = NO_NOISE if math.isinf(eps) else _dp_label(eps)
        dp = cfg.dp.model_copy(update={"epsilon": 1e9 if math.isinf(eps) else float(eps)})
        t0 = time.perf_counter()
        runs[label] = []
        for k in range(seeds):
            server, log = train_dp_boost(banks, dp, used, cfg.seed + k, noise_seed=cfg.seed + k)
            booster = to_booster(server.state, used)
            threshold = 0.5 if server.state.threshold is None else float(server.state.threshold)
            runs[label].append((booster.predict(to_dmatrix(test, used)), threshold))
        seconds[label] = (time.perf_counter() - t0) / seeds
        if not math.isinf(eps):
            cards[label] = dp_boost_card(server.boost)
        info = {**(info or {}), "train_cardholders": log["train_cardholders"]}
        logger.info("fraud_dp_study model=%r seconds=%.0f", label, seconds[label])
    models = tuple(runs)
    codes, holders = pd.factorize(test.cardholder.astype(str))
    counts = bootstrap_counts(len(holders), reps, cfg.seed)
    ranked = {m: [RankedScores.of(test.label, s, t) for s, t in r] for m, r in runs.items()}
    draws = metric_draws(ranked, codes, counts, cfg.fpr_target)
    points = {m: [classification_metrics(test.label, s, t, cfg.fpr_target) for s, t in r] for m, r in runs.items()}
    single = {m: {k: interval([getattr(p, k) for p in points[m]], draws[m][k]) for k in METRICS} for m in models}

    def mean_point(m: str, k: str) -> float:
        return float(np.mean([getattr(p, k) for p in points[m]]))

    diff = {m: {k: interval([mean_point(m, k) - mean_point(FL, k)], (draws[m][k].mean(0) - draws[FL][k][0])[None, :])
                for k in METRICS} for m in models if m != FL}
    d = cfg.dp
    info = dict(info or {})
    info.update({
        "banks": len(order), "rows": sum(len(f) for f in banks.values()), "test_cardholders": len(holders),
        "seeds": seeds,
        "test_frauds": int(test.label.sum()), "reps": reps, "seconds": time.perf_counter() - started,
        "load_start": load_start, "load_end": _load(), "train_seconds": seconds,
        "columns": f"{len(used)} own-history columns for the DP models and {FL_OWN!r} ({len(dropped)} dropped: "
                   + ", ".join(dropped) + ")",
        "dp": (f"{d.trees} totally random trees of depth {d.depth}, eta {d.eta:g}, λ {d.reg_lambda:g}·clip, clip "
               f"{d.clip:g}, fraud-row weight {d.positive_weight:g}, {d.candidates} candidate quantiles, "
               f"δ {d.delta:g}, {seeds} structure-and-noise seeds from {cfg.seed}"),
        "xgb": f"histogram federation, {cfg.num_boost_round} trees of depth {cfg.max_depth}, eta {cfg.eta:g}",
    })
    for m in models:
        logger.info("fraud_dp_study model=%r pr_auc=%s", m, single[m]["pr_auc"].fmt())
    return DPStudyReport(models, single, diff, cards, info)


def dp_study(cfg: Any, data: Any, epsilons: Sequence[float], seeds: int = 3, reps: int | None = None
             ) -> DPStudyReport:
    """``fedfraud eval fraud-dp`` on a dataset folder or a labelled CSV (``cfg``: the whole ``FedfraudConfig``)."""
    from contextlib import ExitStack
    from pathlib import Path

    from fedfraud.training.fraud.dataset import bank_features, labelled_banks, materialize

    fc = cfg.fraud
    with ExitStack() as stack:
        root = stack.enter_context(materialize(Path(data), cfg.ingest))
        frames = labelled_banks(root, data)
        banks = {b: bank_features(root, b, fc, cfg.encoder, cfg.privacy, None) for b in frames}
        if fc.merchant_risk_features:
            from fedfraud.training.merchant_risk.features import dataset_columns, with_merchant_columns

            merchant = dataset_columns(root, cfg.encoder, cfg.privacy, cfg.merchant_risk, cfg.merchant_noise)
            banks = {b: with_merchant_columns(f, merchant[b], cfg.merchant_risk) for b, f in banks.items()}
    shares = cfg.ingest.bank_shares
    info = {"data": f"{data}" + (f" (bank shares {','.join(f'{s:g}' for s in shares)})"
                                 if shares and not Path(data).is_dir() else ""),
            "features": f"{len(next(iter(banks.values())).names) - 1} columns (no anomaly score; merchant-risk "
                        f"columns {'on' if fc.merchant_risk_features else 'off'})"}
    return run_dp_study(banks, fc, epsilons, seeds=seeds, reps=reps, info=info)

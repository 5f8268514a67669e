"""``fedfraud eval variants``: federated XGBoost, FedAvg-GNN, FedRPDA and its two ablations on the same rows.

Every variant reads the same feature rows (:func:`fedfraud.training.fraud.dataset.bank_features`, plus the
merchant-risk columns when ``fraud.merchant_risk_features`` is on; no anomaly score, which needs a trained anomaly
model) and the same split by cardholder; the GNNs add each bank's transaction graph (:mod:`.graph`).

* ``federated XGBoost``: the shipped default, histogram federation
  (:func:`fedfraud.training.fraud.federated.hist.federated_hist_train`), the config's XGBoost settings;
* ``federated XGBoost + hin2vec`` (with ``hin2vec``): the same federation, in the same job, on the same rows plus
  the 16 G-HIN2Vec columns of :mod:`fedfraud.training.embeddings` (trained federated first, unsupervised);
* ``FedAvg-GNN``: the GNN with both FedRPDA strategies off;
* ``FedRPDA``: both on; ``FedRPDA − RA`` without risk-aware aggregation (diversified-risk augmentation only),
  ``FedRPDA − DRA`` without the augmentation and prototype loss (risk-aware aggregation only).

Hyperparameters are chosen on **validation** cardholders only: with ``tune``, λ (``prototype_weight``) on the
``FedRPDA − RA`` job and α (``risk_alpha``) on the ``FedRPDA − DRA`` job, by the validation PR-AUC the server
computes from the banks' summed validation histograms; FedRPDA takes both choices. Everything else is the config.

Noise: 95 % intervals from a bootstrap over test **cardholders** (:mod:`fedfraud.training.bootstrap`),
every variant on the same replicates, so differences are paired; GNN metrics are averaged over seeds inside
every replicate. F1-macro is the mean of the fraud and legit classes' F1 at the model's validation threshold.
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
from fedfraud.training.fraud.metrics import classification_metrics

__all__ = ["LABELS", "METRICS", "VariantsReport", "macro_f1", "run_variants"]

logger = logging.getLogger(__name__)

XGB = "federated XGBoost"
XGB_H2V = "federated XGBoost + hin2vec"
#: Row label of each GNN variant.
LABELS = {"fedavg-gnn": "FedAvg-GNN", "fedrpda": "FedRPDA", "fedrpda-no-ra": "FedRPDA − RA",
          "fedrpda-no-dra": "FedRPDA − DRA"}
METRICS = ("pr_auc", "recall_at_fpr", "f1_macro")
TITLES = {"pr_auc": "PR-AUC", "recall_at_fpr": "recall@1%FPR", "f1_macro": "F1-macro"}
#: Paired differences reported (label, a, b).
COMPARISONS = [
    ("FedRPDA − FedAvg-GNN", "FedRPDA", "FedAvg-GNN"),
    ("RA only (FedRPDA − DRA) − FedAvg-GNN", "FedRPDA − DRA", "FedAvg-GNN"),
    ("DRA only (FedRPDA − RA) − FedAvg-GNN", "FedRPDA − RA", "FedAvg-GNN"),
    ("FedRPDA − federated XGBoost", "FedRPDA", XGB),
    ("FedAvg-GNN − federated XGBoost", "FedAvg-GNN", XGB),
    ("federated XGBoost + hin2vec − federated XGBoost", XGB_H2V, XGB),
]
#: Validation grids (the paper searched λ in {0.1, 0.2, 0.5, 1, 2, 5}).
LAMBDA_GRID = (0.1, 0.5, 2.0)
ALPHA_GRID = (1.0, 3.0, 5.0)


def macro_f1(label: np.ndarray, decision: np.ndarray, weight: np.ndarray | None = None) -> float:
    """Mean of the fraud class's and the legit class's F1 at the given decisions (rows weighted)."""
    y = np.asarray(label).astype(bool)
    d = np.asarray(decision).astype(bool)
    w = np.ones(len(y)) if weight is None else np.asarray(weight, dtype=np.float64)
    tp, fp = float(w[y & d].sum()), float(w[~y & d].sum())
    fn, tn = float(w[y & ~d].sum()), float(w[~y & ~d].sum())
    f_pos = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn > 0 else 0.0
    f_neg = 2 * tn / (2 * tn + fp + fn) if tn + fp + fn > 0 else 0.0
    return (f_pos + f_neg) / 2


def _macro_f1_draws(label: np.ndarray, decision: np.ndarray, codes: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """F1-macro per bootstrap replicate: per-cardholder confusion counts, re-weighted by the draw counts."""
    y = np.asarray(label).astype(bool)
    d = np.asarray(decision).astype(bool)
    per = np.zeros((counts.shape[1], 4))
    for j, m in enumerate((y & d, ~y & d, y & ~d, ~y & ~d)):
        per[:, j] = np.bincount(codes[m], minlength=counts.shape[1])
    tp, fp, fn, tn = (counts @ per).T
    with np.errstate(invalid="ignore", divide="ignore"):
        f_pos = np.where(tp + fp + fn > 0, 2 * tp / (2 * tp + fp + fn), 0.0)
        f_neg = np.where(tn + fp + fn > 0, 2 * tn / (2 * tn + fp + fn), 0.0)
    out = (f_pos + f_neg) / 2
    return np.where(tp + fn > 0, out, np.nan)


@dataclass(frozen=True)
class VariantsReport:
    """Pooled and per-bank intervals of every variant, paired differences, tuning and provenance."""

    variants: tuple[str, ...]
    pooled: dict[str, dict[str, Interval]]
    pooled_diff: dict[str, dict[str, Interval]]
    per_bank: dict[int, dict[str, dict[str, Interval]]]
    bank_diff: dict[int, dict[str, dict[str, Interval]]]
    bank_info: dict[int, dict[str, Any]]
    tuning: list[dict[str, Any]]
    info: dict[str, Any] = field(default_factory=dict)

    def claims(self) -> list[tuple[str, str, str]]:
        """(claim, measured, verdict) of the paper's claims and the issue's small-bank target."""
        out = []

        def verdict(d: Interval) -> str:
            if d.low > 0:
                return "holds (interval above 0)"
            if d.high < 0:
                return "fails: worse (interval below 0)"
            return "not shown: interval contains 0" + (" (point above 0)" if d.value > 0 else " (point at or below 0)")

        for name, key in (("risk-aware aggregation alone beats FedAvg-GNN on PR-AUC",
                           "RA only (FedRPDA − DRA) − FedAvg-GNN"),
                          ("diversified-risk augmentation alone beats FedAvg-GNN on PR-AUC",
                           "DRA only (FedRPDA − RA) − FedAvg-GNN"),
                          ("FedRPDA beats FedAvg-GNN on PR-AUC", "FedRPDA − FedAvg-GNN")):
            d = self.pooled_diff[key]["pr_auc"]
            out.append((name + " (pooled)", f"{d.fmt(100, 2, True)} points", verdict(d)))
        h2v = self.pooled_diff.get("federated XGBoost + hin2vec − federated XGBoost")
        if h2v is not None:
            d = h2v["pr_auc"]
            out.append(("the hin2vec columns add >= +0.5 PR-AUC points to federated XGBoost (pooled, interval above 0)",
                        f"{d.fmt(100, 2, True)} points", "met" if d.value >= 0.005 and d.low > 0 else "NOT met"))
        small = min(self.bank_info, key=lambda b: self.bank_info[b]["cardholders"])
        d = self.bank_diff[small]["FedRPDA − FedAvg-GNN"]["pr_auc"]
        out.append((f"on the smallest bank ({small}, {self.bank_info[small]['share']}), FedRPDA >= FedAvg-GNN (PR-AUC)",
                    f"{d.fmt(100, 2, True)} points",
                    ("met" if d.value >= 0 else "NOT met") + (" (interval contains 0)" if not d.excludes_zero
                                                              else "")))
        return out

    def to_markdown(self, more: str = "") -> str:
        """The block; ``more``: a line put after the pooled table (the benchmark records' marker after which the
        data paragraph and the detail stay in the record; the page shows the run's verdicts as the record's targets).
        """
        i = self.info
        lines = [
            "### Fraud variants: federated XGBoost (+ hin2vec), FedAvg-GNN, FedRPDA and its ablations",
            "",
            "| variant (pooled over all banks' test cardholders; mean over seeds [95 % interval]) | "
            + " | ".join(TITLES[m] for m in METRICS) + " | training s |",
            "|---|" + "---:|" * (len(METRICS) + 1),
        ]
        data = (
            f"Data: {i.get('data', '?')}; banks={len(self.per_bank)}; rows={i.get('rows', '?')}; test cardholders="
            f"{i.get('test_cardholders', '?')}; **test frauds={i.get('test_frauds', '?')}**; GNN seeds="
            f"{i.get('seeds', '?')}; bootstrap: {i.get('reps', '?')} replicates over test cardholders; GNN: "
            f"{i.get('gnn', '?')}; XGBoost: {i.get('xgb', '?')}; wall {float(i.get('seconds', math.nan)):.0f} s "
            f"(features {float(i.get('feature_seconds', math.nan)):.0f} s, XGBoost "
            f"{float(i.get('xgb_seconds', math.nan)):.0f} s, GNN jobs {float(i.get('gnn_seconds', math.nan)):.0f} s); "
            f"load average at start {i.get('load_start', '?')}, at end {i.get('load_end', '?')}."
        )
        seconds = i.get("train_seconds", {})
        for v in self.variants:
            lines.append(f"| {v} | " + " | ".join(self.pooled[v][m].fmt() for m in METRICS)
                         + f" | {float(seconds.get(v, math.nan)):.0f} |")
        lines += ["", *([more, ""] if more else []), data]
        lines += ["", "**The paper's claims and the issue's targets, in plain numbers**", ""]
        for name, measured, verdict in self.claims():
            lines.append(f"- {name}: {measured} → **{verdict}**")
        lines += ["", "**Paired differences, pooled** (points)", "",
                  "| comparison | " + " | ".join(TITLES[m] for m in METRICS) + " |", "|---|" + "---:|" * len(METRICS)]
        for name, d in self.pooled_diff.items():
            lines.append(f"| {name} | " + " | ".join(d[m].fmt(100, 2, True) for m in METRICS) + " |")
        for m in METRICS:
            lines += ["", f"**Per bank, {TITLES[m]}** (point [95 % interval, the pooled replicates restricted to the "
                          "bank's cardholders])", "",
                      "| bank | share | test cardholders | test frauds | " + " | ".join(self.variants) + " |",
                      "|---|---:|---:|---:|" + "---:|" * len(self.variants)]
            for b in sorted(self.per_bank):
                info = self.bank_info[b]
                lines.append(f"| {b} | {info['share']} | {info['cardholders']} | {info['frauds']} | "
                             + " | ".join(self.per_bank[b][v][m].fmt() for v in self.variants) + " |")
        lines += ["", "**FedRPDA − FedAvg-GNN per bank** (PR-AUC points, paired)", ""]
        for b in sorted(self.bank_diff):
            parts = "; ".join(f"{k}: {d['pr_auc'].fmt(100, 2, True)}" for k, d in self.bank_diff[b].items())
            lines.append(f"- bank {b}: {parts}")
        if self.tuning:
            lines += ["", "**Chosen on validation cardholders** (seed 0; validation PR-AUC from the summed "
                          "histograms)", "", "| job | setting | validation PR-AUC | chosen |", "|---|---|---:|---|"]
            for t in self.tuning:
                lines.append(f"| {t['job']} | {t['setting']} | {t['valid_pr_auc']:.4f} | "
                             f"{'yes' if t['chosen'] else ''} |")
        return "\n".join(lines) + "\n"


def _load() -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def run_variants(
    banks: Mapping[int, FraudFeatures],
    frames: Mapping[int, pd.DataFrame],
    cfg: FraudConfig,
    *,
    seeds: int = 2,
    reps: int | None = None,
    tune: bool = True,
    shares: Sequence[float] | None = None,
    info: dict[str, Any] | None = None,
    hin2vec_banks: Mapping[int, FraudFeatures] | None = None,
) -> VariantsReport:
    """Train every variant on train/valid cardholders, score every bank's test cardholders, bootstrap.

    Args:
        banks: features per bank (the anomaly-score column is not used).
        frames: each bank's canonical rows (same order as its features): the graph's cardholders and merchants.
        cfg: fraud settings (XGBoost; ``cfg.gnn`` for the GNNs).
        seeds: GNN seeds (XGBoost histogram federation is deterministic: one model).
        reps: bootstrap replicates (default ``cfg.bootstrap_reps``).
        tune: choose λ and α on validation cardholders (else the config's).
        shares: the banks' cardholder shares (printed).
        info: provenance for the header.
        hin2vec_banks: ``banks`` with the G-HIN2Vec columns appended (same rows): adds ``federated XGBoost +
            hin2vec``, trained in the same federation job as ``federated XGBoost`` (which drops those columns).
    """
    from fedfraud.training.fraud.federated.hist import HistJob, federated_hist_train
    from fedfraud.training.fraud.gnn.graph import build_graph
    from fedfraud.training.fraud.gnn.trainer import train_gnn_jobs, variant_job

    started, load_start = time.perf_counter(), _load()
    reps = cfg.bootstrap_reps if reps is None else reps
    order = sorted(banks)
    if len(order) < 2:
        raise ValueError("the comparison needs at least 2 banks")
    if any(not banks[b].has_labels for b in order):
        raise ValueError("evaluation needs labels")
    info = dict(info or {})
    graphs = {b: build_graph(banks[b], frames[b], cfg.gnn.neighbors, b) for b in order}

    # --- federated XGBoost, the shipped default (no anomaly score: every variant reads the same columns)
    t0 = time.perf_counter()
    xgb_banks = banks if hin2vec_banks is None else hin2vec_banks
    extra = [n for n in next(iter(xgb_banks.values())).names if n not in next(iter(banks.values())).names]
    jobs = [HistJob("FL", None, cfg.seed, drop=tuple(extra))]
    jobs += [HistJob("FL+hin2vec", None, cfg.seed)] if extra else []
    xgbs = federated_hist_train(xgb_banks, cfg.model_copy(update={"nthread": 1}), jobs, tls=cfg.federated_tls,
                                timeout_s=cfg.federated_timeout_s)
    xgb_seconds = time.perf_counter() - t0

    # --- GNN jobs: tuning on validation (seed 0), then the remaining seeds with the choices
    tuning: list[dict[str, Any]] = []
    gnn_seconds = 0.0
    trained: dict[str, Any] = {}

    def train(jobs: list[Any]) -> None:
        nonlocal gnn_seconds
        t = time.perf_counter()
        trained.update(train_gnn_jobs(graphs, cfg, jobs, use_anomaly_score=False))
        gnn_seconds += time.perf_counter() - t

    lam, alpha = cfg.gnn.prototype_weight, cfg.gnn.risk_alpha
    if tune:
        grid = [variant_job("fedavg-gnn", 0)]
        grid += [variant_job("fedrpda-no-ra", 0, (("prototype_weight", v),), f"fedrpda-no-ra#0#lambda={v:g}")
                 for v in LAMBDA_GRID]
        grid += [variant_job("fedrpda-no-dra", 0, (("risk_alpha", v),), f"fedrpda-no-dra#0#alpha={v:g}")
                 for v in ALPHA_GRID]
        train(grid)
        best_lam = max(LAMBDA_GRID, key=lambda v: trained[f"fedrpda-no-ra#0#lambda={v:g}"].meta["valid_pr_auc"])
        best_alpha = max(ALPHA_GRID, key=lambda v: trained[f"fedrpda-no-dra#0#alpha={v:g}"].meta["valid_pr_auc"])
        for v in LAMBDA_GRID:
            tuning.append({"job": "FedRPDA − RA", "setting": f"λ = {v:g}", "chosen": v == best_lam,
                           "valid_pr_auc": trained[f"fedrpda-no-ra#0#lambda={v:g}"].meta["valid_pr_auc"]})
        for v in ALPHA_GRID:
            tuning.append({"job": "FedRPDA − DRA", "setting": f"α = {v:g}", "chosen": v == best_alpha,
                           "valid_pr_auc": trained[f"fedrpda-no-dra#0#alpha={v:g}"].meta["valid_pr_auc"]})
        lam, alpha = best_lam, best_alpha
        trained["fedrpda-no-ra#0"] = trained[f"fedrpda-no-ra#0#lambda={lam:g}"]
        trained["fedrpda-no-dra#0"] = trained[f"fedrpda-no-dra#0#alpha={alpha:g}"]
    chosen = (("prototype_weight", float(lam)), ("risk_alpha", float(alpha)))
    pending = [variant_job(v, k, chosen) for k in range(seeds) for v in LABELS if f"{v}#{k}" not in trained]
    if pending:
        train(pending)

    # --- test scores of every variant and seed
    xgb_runs = {XGB: xgbs["FL"], **({XGB_H2V: xgbs["FL+hin2vec"]} if extra else {})}
    variants = (*xgb_runs, *LABELS.values())
    tests = {b: graphs[b].mask("test") for b in order}
    label = np.concatenate([banks[b].label[tests[b]] for b in order])
    bank_of_row = np.concatenate([np.full(int(tests[b].sum()), b) for b in order])
    codes, holders = pd.factorize(np.concatenate([banks[b].cardholder[tests[b]] for b in order]).astype(str))
    counts = bootstrap_counts(len(holders), reps, cfg.seed)
    runs: dict[str, list[tuple[np.ndarray, float]]] = {
        v: [(np.concatenate([m.scores(xgb_banks[b].X[tests[b]]) for b in order]), m.threshold)]
        for v, m in xgb_runs.items()}
    train_seconds: dict[str, float] = {v: xgb_seconds / len(xgb_runs) for v in xgb_runs}
    for key, lab in LABELS.items():
        models = [trained[f"{key}#{k}"] for k in range(seeds)]
        runs[lab] = [(np.concatenate([m.scores(graphs[b], tests[b]) for b in order]), m.threshold) for m in models]
        train_seconds[lab] = float(np.mean([m.meta["seconds"] for m in models]))

    def measure(rows: np.ndarray) -> tuple[dict[str, list[dict[str, float]]], dict[str, dict[str, np.ndarray]]]:
        """Point per seed and bootstrap draws ``[seeds, reps]`` of every variant on ``rows``."""
        points: dict[str, list[dict[str, float]]] = {}
        ranked: dict[str, list[RankedScores]] = {}
        f1_draws: dict[str, np.ndarray] = {}
        for v in variants:
            pts, rks, f1s = [], [], []
            for scores, threshold in runs[v]:
                s, y = scores[rows], label[rows]
                m = classification_metrics(y, s, threshold, cfg.fpr_target)
                pts.append({"pr_auc": m.pr_auc, "recall_at_fpr": m.recall_at_fpr,
                            "f1_macro": macro_f1(y, s >= threshold)})
                rks.append(RankedScores.of(y, s, threshold))
                f1s.append(_macro_f1_draws(y, s >= threshold, codes[rows], counts))
            points[v], ranked[v], f1_draws[v] = pts, rks, np.stack(f1s)
        draws = metric_draws(ranked, codes[rows], counts, cfg.fpr_target)
        for v in variants:
            draws[v]["f1_macro"] = f1_draws[v]
        return points, draws

    def summarize(points: dict[str, list[dict[str, float]]], draws: dict[str, dict[str, np.ndarray]]
                  ) -> tuple[dict[str, dict[str, Interval]], dict[str, dict[str, Interval]]]:
        single = {v: {m: interval([p[m] for p in points[v]], draws[v][m]) for m in METRICS} for v in variants}
        diffs: dict[str, dict[str, Interval]] = {}
        for name, a, b in COMPARISONS:
            if a not in points or b not in points:
                continue
            pa, pb = points[a], points[b]
            if len(pb) == 1 and len(pa) > 1:  # XGBoost: one model against every GNN seed
                pb = pb * len(pa)
            diffs[name] = {}
            for m in METRICS:
                da, db = draws[a][m].mean(0), draws[b][m].mean(0)
                diffs[name][m] = interval([float(np.mean([p[m] for p in pa]) - np.mean([p[m] for p in pb]))],
                                          (da - db)[None, :])
        return single, diffs

    everything = np.ones(len(label), dtype=bool)
    pooled, pooled_diff = summarize(*measure(everything))
    per_bank: dict[int, dict[str, dict[str, Interval]]] = {}
    bank_diff: dict[int, dict[str, dict[str, Interval]]] = {}
    bank_info: dict[int, dict[str, Any]] = {}
    for b in order:
        rows = bank_of_row == b
        per_bank[b], diffs = summarize(*measure(rows))
        bank_diff[b] = {k: diffs[k] for k in ("FedRPDA − FedAvg-GNN", "RA only (FedRPDA − DRA) − FedAvg-GNN",
                                               "DRA only (FedRPDA − RA) − FedAvg-GNN")}
        share = f"{shares[order.index(b)]:.0%}" if shares is not None and len(shares) == len(order) else "?"
        bank_info[b] = {"cardholders": int(len(np.unique(codes[rows]))), "frauds": int(label[rows].sum()),
                        "rows": int(rows.sum()), "share": share}
    c = cfg.gnn
    info.update({
        "test_cardholders": len(holders), "test_frauds": int(label.sum()), "test_rows": int(label.size),
        "seeds": seeds, "reps": reps, "seconds": time.perf_counter() - started, "load_start": load_start,
        "load_end": _load(), "xgb_seconds": xgb_seconds, "gnn_seconds": gnn_seconds, "train_seconds": train_seconds,
        "rows": sum(len(f) for f in banks.values()),
        "gnn": (f"{c.engine} engine, {c.rounds} rounds x {c.local_epochs} local epoch(s), batch {c.batch_size}, "
                f"lr {c.lr:g}, hidden {c.hidden}, {c.layers} hops, k={c.neighbors} neighbours per relation; "
                f"λ={lam:g}, α={alpha:g}, τ={c.risk_tau:g}, m={c.stats_momentum:g}"),
        "xgb": (f"histogram federation, {cfg.num_boost_round} trees of depth {cfg.max_depth}, eta {cfg.eta:g}, "
                f"{'mutual TLS' if cfg.federated_tls else 'loopback relay'}"),
    })
    report = VariantsReport(variants, pooled, pooled_diff, per_bank, bank_diff, bank_info, tuning, info)
    for name, measured, verdict in report.claims():
        logger.info("variants_claim name=%r measured=%r verdict=%r", name, measured, verdict)
    return report


def variants_study(cfg: Any, data: Any, *, seeds: int = 2, reps: int | None = None, tune: bool = True,
                   hin2vec: bool = True) -> VariantsReport:
    """``fedfraud eval variants`` on a dataset folder or a labelled CSV (``cfg``: the whole ``FedfraudConfig``).

    Features per bank as the XGBoost path builds them (no anomaly score), with the merchant-risk columns when
    ``fraud.merchant_risk_features`` is on; the canonical rows give the graphs' cardholders and merchants. With
    ``hin2vec``, G-HIN2Vec is first trained federated on the same banks (``cfg.hin2vec``, a temporary registry)
    and its columns are computed for every row (:func:`hin2vec_columns`).
    """
    from contextlib import ExitStack
    from pathlib import Path

    from fedfraud.training.fraud.dataset import bank_features, labelled_banks, materialize

    fc = cfg.fraud
    t0 = time.perf_counter()
    with ExitStack() as stack:
        root = stack.enter_context(materialize(Path(data), cfg.ingest))
        frames = labelled_banks(root, data)
        ids = list(frames)
        banks = {b: bank_features(root, b, fc, cfg.encoder, cfg.privacy, None) for b in ids}
        if fc.merchant_risk_features:
            from fedfraud.training.merchant_risk.features import dataset_columns, with_merchant_columns

            merchant = dataset_columns(root, cfg.encoder, cfg.privacy, cfg.merchant_risk, cfg.merchant_noise)
            banks = {b: with_merchant_columns(f, merchant[b], cfg.merchant_risk) for b, f in banks.items()}
        h2v_banks = hin2vec_columns(cfg, root, banks, stack) if hin2vec else None
        feature_seconds = time.perf_counter() - t0
        shares = cfg.ingest.bank_shares
        info = {"data": f"{data}" + (f" (bank shares {','.join(f'{s:g}' for s in shares)})"
                                     if shares and not Path(data).is_dir() else ""),
                "feature_seconds": feature_seconds,
                "features": f"{len(next(iter(banks.values())).names) - 1} columns (no anomaly score; merchant-risk "
                            f"columns {'on' if fc.merchant_risk_features else 'off'})"}
        if h2v_banks is not None:
            extra = len(next(iter(h2v_banks.values())).names) - len(next(iter(banks.values())).names)
            info["features"] += f"; + hin2vec: {extra} G-HIN2Vec columns, the encoder trained federated first"
        report = run_variants(banks, frames, fc, seeds=seeds, reps=reps, tune=tune,
                              shares=shares if shares and not Path(data).is_dir() else None, info=info,
                              hin2vec_banks=h2v_banks)
    report.info["seconds"] = float(report.info["seconds"]) + feature_seconds
    return report


def hin2vec_columns(cfg: Any, root: Any, banks: Mapping[int, FraudFeatures], stack: Any) -> dict[int, FraudFeatures]:
    """``banks`` with the G-HIN2Vec columns appended: the encoder trained federated on ``root``'s banks (Flower
    simulation, ``cfg.hin2vec``) into a temporary registry that ``stack`` removes, then each row's embedding of its
    cardholder's ego graph before it (the columns ``train fraud --features +hin2vec`` reads).
    """
    import tempfile
    from pathlib import Path

    from fedfraud.training.embeddings.features import bank_embedding_columns, with_embeddings
    from fedfraud.training.embeddings.publish import load_hin2vec
    from fedfraud.training.embeddings.trainer import train_embeddings

    registry = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fedfraud-variants-h2v-")))
    t0 = time.perf_counter()
    train_embeddings(Path(root), registry, cfg.hin2vec, cfg.encoder, cfg.privacy, cfg.egograph)
    model = load_hin2vec(registry)
    out = {b: with_embeddings(f, bank_embedding_columns(Path(root), b, model.model, cfg.encoder, cfg.privacy,
                                                        cfg.egograph, progress=True)) for b, f in banks.items()}
    logger.info("variants_hin2vec model=%s seconds=%.0f", model.tag, time.perf_counter() - t0)
    return out

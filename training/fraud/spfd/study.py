"""``fedfraud eval heterogeneous``: FED-SPFD against the baselines on banks that hold different columns.

Every bank holds the shared fraud feature row (no anomaly score: it needs a trained anomaly model) and its private
sets (``banks.<k>.private_features``); the split is the project's, by cardholder.

* ``federated XGBoost (shared)``: histogram federation on the shared columns only
  (:func:`fedfraud.training.fraud.federated.hist.federated_hist_train`), the config's XGBoost settings;
* ``local XGBoost (all columns)``: each bank alone, on all the columns it holds (shared + its private), its
  threshold chosen on its own validation cardholders (:func:`fedfraud.training.fraud.model.fit_model`);
* ``FedAvg``: the FED-SPFD network without alignment and without the private part (shared columns only);
* ``FedPer``: the same with the classifier kept at each bank (shared body, private head);
* ``FED-SPFD − alignment``: FED-SPFD with λ_alg = 0 (the alignment's own effect);
* ``FED-SPFD``: shared encoder aligned to the global statistics, private autoencoder, federated classifier.

λ_alg is chosen on **validation** cardholders only (with ``tune``: the validation PR-AUC the server computes from
the banks' summed histograms, seed 0); everything else is the config's. Each bank's model scores its own test
rows; pooled figures concatenate them. 95 % intervals: a bootstrap over test **cardholders**
(:mod:`fedfraud.training.bootstrap`), every variant on the same replicates, so differences are paired;
network metrics are averaged over seeds inside every replicate.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from fedfraud.training.bootstrap import (
    Interval,
    RankedScores,
    bootstrap_counts,
    interval,
    metric_draws,
    weighted_metrics,
)
from fedfraud.training.fraud.config import FraudConfig
from fedfraud.training.fraud.features import FraudFeatures

__all__ = ["ALIGN_GRID", "HeterogeneousReport", "heterogeneous_study", "run_heterogeneous"]

logger = logging.getLogger(__name__)

XGB_FL = "federated XGBoost (shared)"
XGB_LOCAL = "local XGBoost (all columns)"
#: Row label of each network variant (:data:`.trainer.SPFD_JOBS`).
LABELS = {"fedavg": "FedAvg", "fedper": "FedPer", "fed-spfd-no-alg": "FED-SPFD − alignment",
          "fed-spfd": "FED-SPFD"}
METRICS = ("pr_auc", "recall_at_fpr")
TITLES = {"pr_auc": "PR-AUC", "recall_at_fpr": "recall@1%FPR"}
COMPARISONS = [
    ("FED-SPFD − FedAvg", "FED-SPFD", "FedAvg"),
    ("FED-SPFD − FedPer", "FED-SPFD", "FedPer"),
    ("FED-SPFD − federated XGBoost (shared)", "FED-SPFD", XGB_FL),
    ("FED-SPFD − local XGBoost (all columns)", "FED-SPFD", XGB_LOCAL),
    ("alignment: FED-SPFD − FED-SPFD without it", "FED-SPFD", "FED-SPFD − alignment"),
]
#: Validation grid of λ_alg.
ALIGN_GRID = (0.01, 0.1, 1.0)


@dataclass(frozen=True)
class HeterogeneousReport:
    """Pooled and per-bank intervals of every variant, paired differences, the λ_alg choice, provenance."""

    variants: tuple[str, ...]
    pooled: dict[str, dict[str, Interval]]
    pooled_diff: dict[str, dict[str, Interval]]
    per_bank: dict[int, dict[str, dict[str, Interval]]]
    bank_diff: dict[int, dict[str, dict[str, Interval]]]
    bank_info: dict[int, dict[str, Any]]
    tuning: list[dict[str, Any]]
    info: dict[str, Any] = field(default_factory=dict)

    def to_markdown(self, more: str = "") -> str:
        """The block; ``more``: a line put first (the benchmark records' marker after which the block stays in the
        record; the page shows the run's verdicts as the record's targets).
        """
        i = self.info
        lines = [
            *([more, ""] if more else []),
            "### Heterogeneous banks: FED-SPFD against federated XGBoost, local XGBoost, FedAvg and FedPer",
            "",
            "**Pooled over all banks' test cardholders** (mean over seeds [95 % interval])",
            "",
            "| variant | " + " | ".join(TITLES[m] for m in METRICS) + " | training s |",
            "|---|" + "---:|" * (len(METRICS) + 1),
        ]
        data = (
            f"Data: {i.get('data', '?')}; banks={len(self.per_bank)}; rows={i.get('rows', '?')}; test cardholders="
            f"{i.get('test_cardholders', '?')}; **test frauds={i.get('test_frauds', '?')}**; network seeds="
            f"{i.get('seeds', '?')}; bootstrap: {i.get('reps', '?')} replicates over test cardholders; networks: "
            f"{i.get('spfd', '?')}; wall {float(i.get('seconds', math.nan)):.0f} s."
            + (f" Skewed banks (`--skew`): {i['skew']}." if i.get("skew") else "")
        )
        seconds = i.get("train_seconds", {})
        for v in self.variants:
            lines.append(f"| {v} | " + " | ".join(self.pooled[v][m].fmt() for m in METRICS)
                         + f" | {float(seconds.get(v, math.nan)):.0f} |")
        lines += ["", data]
        lines += ["", "**Paired differences, pooled** (points)", "",
                  "| comparison | " + " | ".join(TITLES[m] for m in METRICS) + " |", "|---|" + "---:|" * len(METRICS)]
        for name, d in self.pooled_diff.items():
            lines.append(f"| {name} | " + " | ".join(d[m].fmt(100, 2, True) for m in METRICS) + " |")
        for m in METRICS:
            lines += ["", f"**Per bank, {TITLES[m]}** (point [95 % interval])", "",
                      "| bank | private columns | test cardholders | test frauds | " + " | ".join(self.variants) + " |",
                      "|---|---|---:|---:|" + "---:|" * len(self.variants)]
            for b in sorted(self.per_bank):
                info = self.bank_info[b]
                lines.append(f"| {b} | {info['private'] or '—'} | {info['cardholders']} | {info['frauds']} | "
                             + " | ".join(self.per_bank[b][v][m].fmt() for v in self.variants) + " |")
        lines += ["", "**FED-SPFD − each baseline per bank** (PR-AUC points, paired)", ""]
        for b in sorted(self.bank_diff):
            parts = "; ".join(f"{k}: {d['pr_auc'].fmt(100, 2, True)}" for k, d in self.bank_diff[b].items())
            lines.append(f"- bank {b}: {parts}")
        if self.tuning:
            lines += ["", "**λ_alg chosen on validation cardholders** (seed 0)", "",
                      "| λ_alg | validation PR-AUC | chosen |", "|---:|---:|---|"]
            for t in self.tuning:
                lines.append(f"| {t['lambda_alg']:g} | {t['valid_pr_auc']:.4f} | {'yes' if t['chosen'] else ''} |")
        return "\n".join(lines) + "\n"


def _test_rows(model: Any, table: FraudFeatures, test: np.ndarray) -> np.ndarray:
    return table.X[:, [table.names.index(n) for n in model.input_names]][test]


def run_heterogeneous(
    banks: Mapping[int, FraudFeatures],
    tables: Mapping[int, FraudFeatures],
    private: Mapping[int, tuple[str, ...]],
    cfg: FraudConfig,
    *,
    seeds: int = 2,
    reps: int | None = None,
    tune: bool = True,
    info: dict[str, Any] | None = None,
) -> HeterogeneousReport:
    """Train every variant on train/valid cardholders, score every bank's test cardholders, bootstrap.

    Args:
        banks: each bank's fraud feature rows (one layout for every bank: federated XGBoost's input).
        tables: the same rows with each bank's demographics when it holds them (:func:`.publish.heterogeneous_tables`).
        private: each bank's private columns.
        cfg: fraud settings (XGBoost; ``cfg.spfd`` for the networks).
        seeds: network seeds (the histogram federation is deterministic: one model).
        reps: bootstrap replicates (default ``cfg.bootstrap_reps``).
        tune: choose λ_alg on validation cardholders (else the config's).
        info: provenance for the header.
    """
    from fedfraud.training.fraud.federated.hist import HistJob, federated_hist_train
    from fedfraud.training.fraud.model import fit_model
    from fedfraud.training.fraud.spfd.columns import held_columns, shared_columns
    from fedfraud.training.fraud.spfd.trainer import spfd_job, train_spfd_jobs

    started = time.perf_counter()
    reps = cfg.bootstrap_reps if reps is None else reps
    order = sorted(tables)
    if len(order) < 2 or sorted(banks) != order:
        raise ValueError("the comparison needs at least 2 banks, the same in banks and tables")
    if any(not tables[b].has_labels for b in order):
        raise ValueError("evaluation needs labels")
    names = banks[order[0]].names
    shared = shared_columns(names, use_anomaly_score=False)

    t0 = time.perf_counter()  # --- federated XGBoost on the shared columns
    fl = federated_hist_train(banks, cfg.model_copy(update={"nthread": 1}),
                              [HistJob("FL", None, cfg.seed, drop=tuple(n for n in names if n not in shared))],
                              tls=cfg.federated_tls, timeout_s=cfg.federated_timeout_s)["FL"]
    train_seconds: dict[str, float] = {XGB_FL: time.perf_counter() - t0}
    t0 = time.perf_counter()  # --- local XGBoost on all of each bank's columns
    held = {b: held_columns(tables[b], shared, private.get(b, ())) for b in order}
    local = {b: fit_model(held[b].of_split("train"), held[b].of_split("valid"), False, cfg, "local") for b in order}
    train_seconds[XGB_LOCAL] = (time.perf_counter() - t0) / len(order)

    trained: dict[str, dict[int, Any]] = {}
    tuning: list[dict[str, Any]] = []
    lam = cfg.spfd.lambda_alg
    if tune:
        grid = [spfd_job("fed-spfd", 0, (("lambda_alg", v),), f"fed-spfd#0#alg={v:g}") for v in ALIGN_GRID]
        trained.update(train_spfd_jobs(tables, private, cfg, grid, use_anomaly_score=False))
        score = {v: trained[f"fed-spfd#0#alg={v:g}"][order[0]].meta["valid_pr_auc"] for v in ALIGN_GRID}
        lam = max(ALIGN_GRID, key=lambda v: score[v])
        tuning = [{"lambda_alg": v, "valid_pr_auc": score[v], "chosen": v == lam} for v in ALIGN_GRID]
        trained["fed-spfd#0"] = trained[f"fed-spfd#0#alg={lam:g}"]
    chosen = (("lambda_alg", float(lam)),)
    pending = [spfd_job(v, k, chosen) for k in range(seeds) for v in LABELS if f"{v}#{k}" not in trained]
    if pending:
        trained.update(train_spfd_jobs(tables, private, cfg, pending, use_anomaly_score=False))

    tests = {b: tables[b].split == "test" for b in order}
    label = np.concatenate([tables[b].label[tests[b]] for b in order])
    bank_of_row = np.concatenate([np.full(int(tests[b].sum()), b) for b in order])
    codes, holders = pd.factorize(np.concatenate([tables[b].cardholder[tests[b]] for b in order]).astype(str))
    counts = bootstrap_counts(len(holders), reps, cfg.seed)

    def run_of(models: Mapping[int, Any]) -> tuple[np.ndarray, np.ndarray]:
        """A per-bank set of models: (scores, thresholds) of every test row, each bank's model on its rows."""
        scores = np.concatenate([models[b].scores(_test_rows(models[b], tables[b], tests[b])) for b in order])
        thresholds = np.concatenate([np.full(int(tests[b].sum()), models[b].threshold) for b in order])
        return scores, thresholds

    runs: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {
        XGB_FL: [(np.concatenate([fl.scores(banks[b].X[tests[b]]) for b in order]), np.full(len(label), fl.threshold))],
        XGB_LOCAL: [run_of(local)],
    }
    for key, lab in LABELS.items():
        per_seed = [trained[f"{key}#{k}"] for k in range(seeds)]
        runs[lab] = [run_of(models) for models in per_seed]
        train_seconds[lab] = float(np.mean([m[order[0]].meta["seconds"] for m in per_seed]))
    variants = tuple(runs)

    def measure(rows: np.ndarray) -> tuple[dict[str, list[dict[str, float]]], dict[str, dict[str, np.ndarray]]]:
        points: dict[str, list[dict[str, float]]] = {}
        ranked: dict[str, list[RankedScores]] = {}
        for v in variants:
            rks = [RankedScores.of(label[rows], s[rows], t[rows]) for s, t in runs[v]]
            points[v] = [weighted_metrics(r, np.ones(int(rows.sum())), cfg.fpr_target) for r in rks]
            ranked[v] = rks
        return points, metric_draws(ranked, codes[rows], counts, cfg.fpr_target)

    def summarize(points: dict[str, list[dict[str, float]]], draws: dict[str, dict[str, np.ndarray]]
                  ) -> tuple[dict[str, dict[str, Interval]], dict[str, dict[str, Interval]]]:
        single = {v: {m: interval([p[m] for p in points[v]], draws[v][m]) for m in METRICS} for v in variants}
        diffs: dict[str, dict[str, Interval]] = {}
        for name, a, b in COMPARISONS:
            diffs[name] = {m: interval([float(np.mean([p[m] for p in points[a]]) - np.mean([p[m] for p in points[b]]))],
                                       (draws[a][m].mean(0) - draws[b][m].mean(0))[None, :]) for m in METRICS}
        return single, diffs

    pooled, pooled_diff = summarize(*measure(np.ones(len(label), dtype=bool)))
    per_bank: dict[int, dict[str, dict[str, Interval]]] = {}
    bank_diff: dict[int, dict[str, dict[str, Interval]]] = {}
    bank_info: dict[int, dict[str, Any]] = {}
    for b in order:
        rows = bank_of_row == b
        per_bank[b], bank_diff[b] = summarize(*measure(rows))
        bank_info[b] = {"cardholders": int(len(np.unique(codes[rows]))), "frauds": int(label[rows].sum()),
                        "rows": int(rows.sum()), "private": ", ".join(private.get(b, ()))}
    c = cfg.spfd
    info = dict(info or {})
    info.update({
        "test_cardholders": len(holders), "test_frauds": int(label.sum()), "seeds": seeds, "reps": reps,
        "rows": sum(len(t) for t in tables.values()), "train_seconds": train_seconds,
        "seconds": time.perf_counter() - started,
        "spfd": (f"{c.engine} engine, {c.warm_rounds} warm-start + {c.rounds} rounds x {c.local_epochs} local "
                 f"epoch(s), batch {c.batch_size}, lr {c.lr:g}, h_s={c.embed_dim}, h_p={c.private_dim}, hidden "
                 f"{c.hidden}; λ_alg={lam:g}, λ_p-n={c.lambda_pn:g}, λ_rec={c.lambda_rec:g}"),
    })
    return HeterogeneousReport(variants, pooled, pooled_diff, per_bank, bank_diff, bank_info, tuning, info)


def heterogeneous_study(cfg: Any, data: Any, *, seeds: int = 2, reps: int | None = None,
                        tune: bool = True) -> HeterogeneousReport:
    """``fedfraud eval heterogeneous`` on a dataset folder or a labelled CSV (``cfg``: the whole config; its
    ``banks`` section says which columns each bank holds, and a CSV is ingested keeping them).
    """
    from contextlib import ExitStack
    from pathlib import Path

    from fedfraud.training.fraud.dataset import bank_features, labelled_banks, materialize
    from fedfraud.training.fraud.spfd.publish import heterogeneous_tables

    fc = cfg.fraud
    t0 = time.perf_counter()
    with ExitStack() as stack:
        root = stack.enter_context(materialize(Path(data), cfg.ingest, cfg.banks))
        frames = labelled_banks(root, data)
        banks = {b: bank_features(root, b, fc, cfg.encoder, cfg.privacy, None) for b in frames}
        if fc.merchant_risk_features:
            from fedfraud.training.merchant_risk.features import dataset_columns, with_merchant_columns

            merchant = dataset_columns(root, cfg.encoder, cfg.privacy, cfg.merchant_risk, cfg.merchant_noise)
            banks = {b: with_merchant_columns(f, merchant[b], cfg.merchant_risk) for b, f in banks.items()}
        tables, private = heterogeneous_tables(cfg, banks, root)
        info: dict[str, Any] = {"data": str(data)}
        if cfg.ingest.skew is not None:
            from fedfraud.training.data.skew import describe_skew, skew_summary

            info["skew"] = describe_skew(skew_summary(root))
        report = run_heterogeneous(banks, tables, private, fc, seeds=seeds, reps=reps, tune=tune, info=info)
    report.info["seconds"] = time.perf_counter() - t0
    return report



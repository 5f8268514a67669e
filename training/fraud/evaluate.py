"""The federation and stacking study behind ``fedfraud eval stacking``: does federation beat a bank alone,
does a stacked score add anything, and is either difference larger than the noise?

Variants, all scored on every bank's **test** cardholders (never used to fit
a model, pick a threshold or fit a stacked score's model):

* ``Local``: each bank alone (its own rows, its own threshold);
* ``FL``: histogram-based federated XGBoost (:mod:`fedfraud.training.fraud.federated.hist`);
* ``Central``: all banks' rows pooled (the upper bound FL should reach);
* ``FL+<score>``: FL with a stacked score in the ``anomaly_score`` column:
  ``AS`` (the anomaly score, cross-fitted over cardholder folds), ``Pos``
  (positive control: a label-free score known to be informative) and
  ``Perm`` (negative control: ``Pos`` permuted within each bank, one
  permutation per seed);
* ``FL−vel`` / ``FL−vel+Pos``: the positive control's own base, FL without
  the amount-velocity columns (``amount_1h/24h/7d``), with and without
  ``Pos`` stacked: there the score carries information the base lacks, so
  the study must find a gain (``FL+Pos`` on the full base shows whether the
  score is redundant with the hand features);
* ``FL−prev`` / ``FL−prev+AS``: FL without the previous-transaction columns
  (today's weaker base), with and without the AS: stacking over both bases on
  the same replicates;
* optionally ``FL-bagging`` (the Flower FedXgbBagging baseline).

Noise: every metric comes with a 95 % interval from a bootstrap over test
**cardholders** (:mod:`fedfraud.training.bootstrap`), averaged over the model
seeds; differences are paired (same replicates). Decisions use the pooled
intervals; per-bank figures are printed for the bank's-eye view.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from fedfraud.training.bootstrap import METRICS, Interval, RankedScores, bootstrap_counts, interval, metric_draws
from fedfraud.training.fraud.config import FraudConfig
from fedfraud.training.fraud.features import ANOMALY_FEATURE, FraudFeatures
from fedfraud.training.fraud.metrics import ClassificationMetrics, classification_metrics
from fedfraud.training.fraud.model import FraudModel

__all__ = ["StudyReport", "evaluate_model", "run_study", "with_score"]

logger = logging.getLogger(__name__)

#: Targets of issue 11, in PR-AUC points.
FL_CENTRAL_GAP = 1.0
SMALL_BANK_GAIN = 5.0
STACKING_GAIN = 1.0
#: Issue 34: the stacking gain over the base with the previous-transaction features.
STRONG_BASE_STACKING_GAIN = 0.5
POSITIVE_CONTROL_GAIN = 2.0
METRIC_TITLES = {"pr_auc": "PR-AUC", "recall_at_fpr": "recall@1%FPR", "f1": "F1"}


def evaluate_model(model: FraudModel, data: FraudFeatures, max_fpr: float) -> ClassificationMetrics:
    """Metrics of ``model`` at its own threshold on labelled rows."""
    if not data.has_labels:
        raise ValueError("evaluation needs labelled rows")
    return classification_metrics(data.label, model.scores(data.X), model.threshold, max_fpr)


def with_score(data: FraudFeatures, score: np.ndarray | None) -> FraudFeatures:
    """``data`` with its ``anomaly_score`` column replaced by ``score`` (one per row); unchanged for None."""
    if score is None:
        return data
    score = np.asarray(score, dtype=np.float32)
    if score.shape != (len(data),):
        raise ValueError(f"need one score per row ({len(data)}), got {score.shape}")
    X = data.X.copy()
    X[:, data.names.index(ANOMALY_FEATURE)] = score
    return FraudFeatures(X, data.names, data.transaction_id, data.cardholder, data.label, data.split)


@dataclass(frozen=True)
class StudyReport:
    """Pooled and per-bank intervals of every variant and of the differences that matter."""

    variants: tuple[str, ...]
    pooled: dict[str, dict[str, Interval]]
    pooled_diff: dict[str, dict[str, Interval]]
    per_bank: dict[int, dict[str, dict[str, Interval]]]
    bank_diff: dict[int, dict[str, Interval]]
    bank_info: dict[int, dict[str, float]]
    seed_points: dict[str, list[float]]
    info: dict[str, object] = field(default_factory=dict)

    def targets(self) -> list[tuple[str, str, bool | None]]:
        """(target, measured, met) of issue 11; met is None where it could not be measured."""
        out: list[tuple[str, str, bool | None]] = []
        gap = self.pooled_diff["FL − Central"]["pr_auc"]
        out.append((f"FL within {FL_CENTRAL_GAP:g} PR-AUC point of Central (pooled)",
                    f"FL − Central = {gap.fmt(100, 2, True)} points", abs(100 * gap.value) <= FL_CENTRAL_GAP))
        gains = {b: d["FL − Local"] for b, d in self.bank_diff.items()}
        worse = [b for b, g in gains.items() if g.value <= 0]
        unmeasured = [b for b, g in gains.items() if not math.isfinite(g.value)]  # no test fraud in the bank
        out.append(("FL above Local for every bank (PR-AUC)",
                    "; ".join(f"bank {b}: {g.fmt(100, 1, True)}" if math.isfinite(g.value) else
                              f"bank {b}: no test fraud" for b, g in sorted(gains.items())),
                    False if worse else (None if unmeasured else True)))
        small = min(self.bank_info, key=lambda b: self.bank_info[b]["test_cardholders"])
        g = gains[small]
        out.append((f"smallest bank ({small}) gains >= {SMALL_BANK_GAIN:g} PR-AUC points from FL",
                    f"{g.fmt(100, 1, True)} points",
                    100 * g.value >= SMALL_BANK_GAIN if math.isfinite(g.value) else None))
        if "FL+AS − FL" in self.pooled_diff:
            d = self.pooled_diff["FL+AS − FL"]["pr_auc"]
            out.append((f"FL+AS − FL >= +{STACKING_GAIN:g} point, 95 % interval above 0 (pooled)",
                        f"{d.fmt(100, 2, True)} points ({self.info.get('as_source', '?')})",
                        100 * d.value >= STACKING_GAIN and d.low > 0))
        else:
            out.append((f"FL+AS − FL >= +{STACKING_GAIN:g} point (pooled)", "not measured (no AS source)", None))
        if "FL+AS − FL" in self.pooled_diff and "FL−prev+AS − FL−prev" in self.pooled_diff:
            d = self.pooled_diff["FL+AS − FL"]["pr_auc"]
            out.append((f"issue 34: over the strong base (previous-transaction features), FL+AS − FL >= "
                        f"+{STRONG_BASE_STACKING_GAIN:g} point, interval above 0 (pooled)",
                        f"{d.fmt(100, 2, True)} points; over the weaker base "
                        f"{self.pooled_diff['FL−prev+AS − FL−prev']['pr_auc'].fmt(100, 2, True)}",
                        100 * d.value >= STRONG_BASE_STACKING_GAIN and d.low > 0))
        if "FL+Perm − FL" in self.pooled_diff:
            d = self.pooled_diff["FL+Perm − FL"]["pr_auc"]
            out.append(("negative control: FL+Perm − FL ≈ 0 (interval contains 0)", f"{d.fmt(100, 2, True)} points",
                        not d.excludes_zero))
        pos_key = next((k for k in ("FL−vel+Pos − FL−vel", "FL+Pos − FL") if k in self.pooled_diff), None)
        if pos_key is not None:
            d = self.pooled_diff[pos_key]["pr_auc"]
            out.append((f"positive control: design detects a +{POSITIVE_CONTROL_GAIN:g}-point effect "
                        f"({pos_key} >= {POSITIVE_CONTROL_GAIN:g}, interval above 0)", f"{d.fmt(100, 2, True)} points",
                        100 * d.value >= POSITIVE_CONTROL_GAIN and d.low > 0))
        return out

    def to_markdown(self) -> str:
        """The block for ``docs/benchmarks.md`` (new file ``docs/benchmarks-fraud-section.md``)."""
        i = self.info
        lines = [
            "### Fraud model: federation and stacking, cardholder-bootstrap intervals",
            "",
            f"Data: {i.get('data', '?')}; banks={len(self.per_bank)}; rows={i.get('rows', '?')}; "
            f"test cardholders={i.get('test_cardholders', '?')}; **test frauds={i.get('test_frauds', '?')}**; "
            f"seeds={i.get('seeds', '?')} ({i.get('seed_note', '')}); bootstrap: {i.get('reps', '?')} replicates "
            f"over test cardholders; stacked AS: {i.get('as_source', 'none')}; federated: {i.get('protocol', '?')}; "
            f"wall {float(i.get('seconds', math.nan)):.0f} s; load average at start {i.get('load_start', '?')}, "
            f"at end {i.get('load_end', '?')}.",
            "",
            "**Pooled over all banks' test cardholders** (mean over seeds [95 % interval])",
            "",
            "| variant | " + " | ".join(METRIC_TITLES[m] for m in METRICS) + " |",
            "|---|" + "---:|" * len(METRICS),
        ]
        for v in self.variants:
            lines.append(f"| {v} | " + " | ".join(self.pooled[v][m].fmt() for m in METRICS) + " |")
        lines += ["", "**Differences, pooled** (points; paired bootstrap)", "",
                  "| comparison | " + " | ".join(METRIC_TITLES[m] for m in METRICS) + " | PR-AUC interval excludes 0 |",
                  "|---|" + "---:|" * (len(METRICS) + 1)]
        for name, d in self.pooled_diff.items():
            lines.append(f"| {name} | " + " | ".join(d[m].fmt(100, 2, True) for m in METRICS)
                         + f" | {'yes' if d['pr_auc'].excludes_zero else 'no'} |")
        cols = [v for v in ("Local", "FL", "FL+AS", "Central") if v in self.variants]
        pairs = list(next(iter(self.bank_diff.values()), {}))
        lines += ["", "**Bank's-eye view** (each bank's rows and fraud rate; PR-AUC on the bank's own test "
                  "cardholders; differences in points, paired bootstrap)", "",
                  "| bank | rows | fraud rate | test cardholders | test frauds | " + " | ".join(cols) + " | "
                  + " | ".join(f"{p} [95 %]" for p in pairs) + " |",
                  "|---|---:|---:|---:|---:|" + "---:|" * (len(cols) + len(pairs))]
        for b in sorted(self.per_bank):
            info = self.bank_info[b]
            rate = f"{100 * info['fraud_rate']:.2f} %" if "fraud_rate" in info else "?"
            none = not info["test_frauds"]  # no fraud among the bank's test cardholders: nothing to measure
            lines.append(f"| {b} | {info.get('rows', '?')} | {rate} | {info['test_cardholders']} | "
                         f"{info['test_frauds']} | "
                         + " | ".join("—" if none else f"{self.per_bank[b][v]['pr_auc'].value:.3f}" for v in cols)
                         + " | " + " | ".join("—" if none else self.bank_diff[b][p].fmt(100, 1, True) for p in pairs)
                         + " |")
        if self.info.get("skew"):
            lines += ["", f"Skewed banks (`--skew`): {self.info['skew']}"]
        lines += ["", "Per bank, recall@1%FPR and F1 (Local → FL):", ""]
        for b in sorted(self.per_bank):
            r = self.per_bank[b]
            lines.append(f"- bank {b}: recall@1%FPR {r['Local']['recall_at_fpr'].value:.3f} → "
                         f"{r['FL']['recall_at_fpr'].value:.3f}; F1 {r['Local']['f1'].value:.3f} → "
                         f"{r['FL']['f1'].value:.3f}")
        lines += ["", "Seed spread of pooled PR-AUC (min..max over seeds):", ""]
        for v, pts in self.seed_points.items():
            lines.append(f"- {v}: {min(pts):.4f}..{max(pts):.4f}")
        lines += ["", "**Targets** (issue 11)", ""]
        for name, measured, met in self.targets():
            verdict = "not measured" if met is None else ("met" if met else "NOT met")
            lines.append(f"- {name}: {measured} → **{verdict}**")
        return "\n".join(lines) + "\n"


def _load() -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def run_study(
    banks: Mapping[int, FraudFeatures],
    cfg: FraudConfig,
    sources: Mapping[str, Sequence[Mapping[int, np.ndarray]]],
    *,
    seeds: int | None = None,
    reps: int | None = None,
    with_bagging: bool = False,
    ablate: Sequence[str] = (),
    positive: str = "Pos",
    num_cpus: int = 2,
    info: dict[str, object] | None = None,
    weaker_base: Sequence[str] = (),
) -> StudyReport:
    """Train every variant on train/valid cardholders and bootstrap their test metrics over cardholders.

    Args:
        banks: features per bank; the ``anomaly_score`` column is ignored (replaced per source).
        cfg: model settings (as chosen on validation cardholders).
        sources: stacked score name (``AS``, ``Pos``, ``Perm``) → one per-bank score array per seed
            (or a single one used for every seed); rows align with ``banks[b]``.
        seeds: model seeds (default ``cfg.eval_seeds``); seed k is ``cfg.seed + k``.
        reps: bootstrap replicates (default ``cfg.bootstrap_reps``).
        with_bagging: also train the Flower FedXgbBagging baseline (``FL-bagging``).
        ablate: features left out of the positive control's base (``FL−vel``); the ``positive`` score is
            then stacked onto that base (``FL−vel+Pos``), where it carries information the base lacks.
        positive: the source name of the positive control.
        num_cpus: Ray CPUs for the bagging simulation.
        info: provenance printed in the report header.
        weaker_base: features the strong base adds (the previous-transaction columns): FL and FL+AS are also
            trained without them (``FL−prev``, ``FL−prev+AS``), so a stacking gain is measured over both bases.
    """
    from fedfraud.training.fraud.federated.hist import HistJob, federated_hist_train
    from fedfraud.training.fraud.train import train_centralized, train_federated, train_local

    started, load_start = time.perf_counter(), _load()
    seeds = cfg.eval_seeds if seeds is None else seeds
    reps = cfg.bootstrap_reps if reps is None else reps
    order = sorted(banks)
    if len(order) < 2:
        raise ValueError("the study needs at least 2 banks")
    if any(not banks[b].has_labels for b in order):
        raise ValueError("evaluation needs labels")
    seed_values = [cfg.seed + k for k in range(seeds)]
    # with no row/column sampling XGBoost is deterministic: a seed changes nothing, so train once
    deterministic = cfg.subsample == 1.0 and cfg.colsample_bytree == 1.0

    def per_seed(name: str, k: int) -> Mapping[int, np.ndarray]:
        arrays = sources[name]
        return arrays[k] if len(arrays) > 1 else arrays[0]

    def slots(name: str | None) -> list[int]:
        """Seed slots that need their own model (a score that changes per seed, or a sampling seed)."""
        varies = name is not None and len(sources[name]) > 1
        return list(range(seeds)) if (varies or not deterministic) else [0]

    # --- federated: one session, every job. (label, stacked score, dropped features) per FL variant
    fl_specs: list[tuple[str, str | None, tuple[str, ...]]] = [("FL", None, ())]
    fl_specs += [(f"FL+{n}", n, ()) for n in sources]
    if ablate and positive in sources:
        fl_specs += [("FL−vel", None, tuple(ablate)), (f"FL−vel+{positive}", positive, tuple(ablate))]
    if weaker_base:
        fl_specs += [("FL−prev", None, tuple(weaker_base))]
        fl_specs += [("FL−prev+AS", "AS", tuple(weaker_base))] if "AS" in sources else []
    jobs: list[HistJob] = []
    extra: dict[str, dict[int, np.ndarray]] = {}
    for label_, name, drop in fl_specs:
        for k in slots(name):
            key = None if name is None else f"{name}#{k}"
            if key is not None and key not in extra:
                extra[key] = {b: np.asarray(per_seed(name, k)[b], dtype=np.float32) for b in order}
            jobs.append(HistJob(f"{label_}#{k}", key, seed_values[k], drop))
    t0 = time.perf_counter()
    fl = federated_hist_train(banks, cfg.model_copy(update={"nthread": 1}), jobs, extra_columns=extra,
                              tls=cfg.federated_tls, timeout_s=cfg.federated_timeout_s)
    fl_seconds = time.perf_counter() - t0

    # --- variant -> per seed slot: (per bank model, stacked score name or None, seed slot)
    variants: dict[str, list[tuple[dict[int, FraudModel], str | None, int]]] = {}
    local_cache: dict[int, dict[int, FraudModel]] = {}
    central_cache: dict[int, FraudModel] = {}
    for k in range(seeds):
        mk = 0 if deterministic else k
        c = cfg.model_copy(update={"seed": seed_values[mk], "nthread": 1})
        if mk not in local_cache:
            local_cache[mk] = {b: train_local(banks[b], False, c, b) for b in order}
            central_cache[mk] = train_centralized(dict(banks), False, c)
        variants.setdefault("Local", []).append((local_cache[mk], None, k))
        variants.setdefault("Central", []).append((dict.fromkeys(order, central_cache[mk]), None, k))
        for label_, name, _ in fl_specs:
            slot = k if k in slots(name) else 0
            variants.setdefault(label_, []).append((dict.fromkeys(order, fl[f"{label_}#{slot}"]), name, k))
    if with_bagging:
        bag = train_federated(dict(banks), cfg, ("base",), num_cpus=num_cpus)["base"]
        variants["FL-bagging"] = [(dict.fromkeys(order, bag), None, k) for k in range(seeds)]
    names = ["Local", "FL", *[f"FL+{n}" for n in sources], "Central",
             *[lab for lab, _, drop in fl_specs if drop], *(["FL-bagging"] if with_bagging else [])]

    # --- test scores
    tests = {b: banks[b].of_split("test") for b in order}
    test_masks = {b: banks[b].split == "test" for b in order}
    bank_of_row = np.concatenate([np.full(len(tests[b]), b) for b in order])
    label = np.concatenate([tests[b].label for b in order])
    holder_codes, holders = pd.factorize(np.concatenate([tests[b].cardholder for b in order]).astype(str))
    counts = bootstrap_counts(len(holders), reps, cfg.seed)
    ranked: dict[str, list[RankedScores]] = {}
    ranked_bank: dict[int, dict[str, list[RankedScores]]] = {b: {} for b in order}
    points: dict[str, list[dict[str, float]]] = {}
    bank_points: dict[int, dict[str, list[dict[str, float]]]] = {b: {} for b in order}
    cache: dict[tuple[object, ...], tuple[RankedScores, dict[str, float], dict[int, RankedScores],
                                           dict[int, dict[str, float]]]] = {}
    for v in names:
        for models, name, k in variants[v]:
            key = (v, *(id(models[b]) for b in order), k if name is not None and len(sources[name]) > 1 else 0)
            if key in cache:  # the same model and score column as an earlier seed: same numbers
                r_all, p_all, r_bank, p_bank = cache[key]
                ranked.setdefault(v, []).append(r_all)
                points.setdefault(v, []).append(p_all)
                for b in order:
                    ranked_bank[b].setdefault(v, []).append(r_bank[b])
                    bank_points[b].setdefault(v, []).append(p_bank[b])
                continue
            scores, thresholds = [], []
            for b in order:
                col = None if name is None else np.asarray(per_seed(name, k)[b])[test_masks[b]]
                s = models[b].scores(with_score(tests[b], col).X)
                scores.append(s)
                thresholds.append(np.full(len(s), models[b].threshold))
                rb = RankedScores.of(tests[b].label, s, models[b].threshold)
                ranked_bank[b].setdefault(v, []).append(rb)
                m = classification_metrics(tests[b].label, s, models[b].threshold, cfg.fpr_target)
                bank_points[b].setdefault(v, []).append({"pr_auc": m.pr_auc, "recall_at_fpr": m.recall_at_fpr,
                                                         "f1": m.f1})
            s_all, t_all = np.concatenate(scores), np.concatenate(thresholds)
            ranked.setdefault(v, []).append(RankedScores.of(label, s_all, t_all))
            m = classification_metrics(label, s_all - t_all + 0.5, 0.5, cfg.fpr_target)  # own bank's threshold
            threshold_free = classification_metrics(label, s_all, 0.5, cfg.fpr_target)
            points.setdefault(v, []).append({"pr_auc": threshold_free.pr_auc,
                                             "recall_at_fpr": threshold_free.recall_at_fpr, "f1": m.f1})
            cache[key] = (ranked[v][-1], points[v][-1], {b: ranked_bank[b][v][-1] for b in order},
                          {b: bank_points[b][v][-1] for b in order})
    draws = metric_draws(ranked, holder_codes, counts, cfg.fpr_target)

    def summarize(pts: list[dict[str, float]], dr: dict[str, np.ndarray]) -> dict[str, Interval]:
        return {m: interval([p[m] for p in pts], dr[m]) for m in METRICS}

    def diff(pts_a: list[dict[str, float]], pts_b: list[dict[str, float]], dr_a: dict[str, np.ndarray],
             dr_b: dict[str, np.ndarray]) -> dict[str, Interval]:
        return {m: interval([a[m] - b[m] for a, b in zip(pts_a, pts_b, strict=True)], dr_a[m] - dr_b[m])
                for m in METRICS}

    pooled = {v: summarize(points[v], draws[v]) for v in names}
    comparisons = [("FL − Local", "FL", "Local"), ("FL − Central", "FL", "Central")]
    comparisons += [(f"FL+{n} − FL", f"FL+{n}", "FL") for n in sources]
    if "FL−vel" in names:
        comparisons.append((f"FL−vel+{positive} − FL−vel", f"FL−vel+{positive}", "FL−vel"))
    if "FL−prev" in names:
        comparisons.append(("FL − FL−prev", "FL", "FL−prev"))
    if "FL−prev+AS" in names:
        comparisons.append(("FL−prev+AS − FL−prev", "FL−prev+AS", "FL−prev"))
    if with_bagging:
        comparisons.append(("FL − FL-bagging", "FL", "FL-bagging"))
    pooled_diff = {label_: diff(points[a], points[b], draws[a], draws[b]) for label_, a, b in comparisons}
    per_bank: dict[int, dict[str, dict[str, Interval]]] = {}
    bank_diff: dict[int, dict[str, Interval]] = {}
    bank_info: dict[int, dict[str, float]] = {}
    # per bank, paired intervals of what federating, stacking and pooling add: which method helps which bank
    bank_pairs = [(n, a, c) for n, a, c in (("FL − Local", "FL", "Local"), ("FL+AS − FL", "FL+AS", "FL"),
                                            ("Central − FL", "Central", "FL")) if a in names]
    for b in order:
        rows = bank_of_row == b
        sub = {v: ranked_bank[b][v] for v in dict.fromkeys(v for _, a, c in bank_pairs for v in (a, c))}
        bd = metric_draws(sub, holder_codes[rows], counts, cfg.fpr_target)
        per_bank[b] = {v: {m: interval([p[m] for p in bank_points[b][v]], np.full((1, 1), np.nan))
                           for m in METRICS} for v in names}
        bank_diff[b] = {n: diff(bank_points[b][a], bank_points[b][c], bd[a], bd[c])["pr_auc"]
                        for n, a, c in bank_pairs}
        bank_info[b] = {"test_cardholders": int(len(np.unique(tests[b].cardholder))),
                        "test_frauds": int(tests[b].label.sum()), "test_rows": len(tests[b]),
                        "rows": len(banks[b]), "fraud_rate": float(np.mean(banks[b].label)) if len(banks[b]) else 0.0}
    seed_points = {v: [p["pr_auc"] for p in points[v]] for v in names}
    meta = {
        "test_cardholders": len(holders), "test_frauds": int(label.sum()), "test_rows": int(label.size),
        "seeds": seeds, "reps": reps,
        "seed_note": ("subsample = colsample_bytree = 1, so XGBoost is deterministic: Local/FL/Central/FL+AS/FL+Pos "
                      "are one model each; seeds vary the Perm control's permutation" if deterministic
                      else "each seed a new XGBoost sampling seed"),
        "protocol": (f"xgboost.federated histogram aggregation, "
                     f"{'mutual TLS' if cfg.federated_tls else 'banks in clear to a loopback relay, then mutual TLS'}, "
                     f"{len(jobs)} models in one session of {fl_seconds:.0f} s"),
        "seconds": time.perf_counter() - started, "load_start": load_start, "load_end": _load(),
        **(info or {}),
    }
    report = StudyReport(tuple(names), pooled, pooled_diff, per_bank, bank_diff, bank_info, seed_points, meta)
    for name, measured, met in report.targets():
        logger.info("study_target name=%r measured=%r met=%s", name, measured, met)
    return report

"""Label-free fraud detection on third-party data: the anomaly model beside label-free baselines, in one run.

``fedfraud bench anomaly --csv ../shared/data/sparkov_dev_1000cards_2022H1.csv.gz``
runs :func:`run_detection_bench` and prints :meth:`DetectionBench.to_markdown`
for ``docs/benchmarks.md``.

Protocol:

* the CSV is ingested into 5 banks (hash partition by cardholder);
* cardholders are split by a keyed hash: 60% train, 15% validation, 25% test
  (:func:`fedfraud.feature_store.layout.split_of`); the models train on train
  cardholders only and the round is selected on validation loss; labels are
  never used in training or selection;
* the federated model (Flower simulation on Ray, FedProx) and the centralized
  one (same settings, all banks in one process) are trained with the same
  budget and published to their own registries;
* every transaction of the validation and test cardholders is scored by the
  published models through :meth:`AnomalyScorer.score_frame` (the replay
  serving's ego graphs use), and by the causal label-free baselines of
  :mod:`fedfraud.training.anomaly.baselines` (each bank fits their
  population statistics on its training cardholders);
* the rank combination's weights and *the* baseline (the highest ROC-AUC
  among all baselines) are chosen on validation cardholders, never on test;
* ROC-AUC and PR-AUC on the test cardholders with 95% bootstrap intervals
  over cardholders (paired: the same draws for every detector), each
  model − the chosen baseline and federated − centralized differences with
  their intervals, and the number of test frauds and fraud incidents;
  validation figures are printed too, since settings were chosen on them;
* with scenario labels (``--scenarios FILE``: ``trans_num`` → scenario, or a
  generated dataset's ``labels.parquet``), one ROC-AUC per scenario and
  detector: that scenario's frauds against all legitimate rows;
* ``--skip-model`` trains nothing and evaluates the baselines on validation
  cardholders only: a cheap look that prints no test figure.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedfraud.bench.harness import fraud_incidents, machine_line, paired_difference_rows, table, test_line
from fedfraud.training.bootstrap import Interval, bootstrap_by_group
from fedfraud.training.data.scenarios import all_finite, load_scenarios, roc_auc, scenario_aucs, scenario_column

__all__ = [
    "DETECTION_SETTINGS",
    "DetectionBench",
    "best_on_validation",
    "choose_rank_weights",
    "evaluate_published",
    "ingested",
    "load_scenarios",
    "run_detection_bench",
    "scenario_aucs",
    "scenario_column",
    "score_split",
    "split_counts",
    "train_run",
]

logger = logging.getLogger(__name__)

#: Training budget of the bench runs (CPU-sized); every key is a RunSettings key.
DETECTION_SETTINGS: dict[str, Any] = {
    "rounds": 10,
    "local-epochs": 10,
    "samples-per-epoch": 1024,
    "batch-size": 128,
    "max-train-pairs": 12000,
    "max-test-pairs": 2000,
    "max-eval-normal": 1000,
    "client-cpus": 1.0,
    "ray-cpus": 2,
}


@dataclass
class DetectionBench:
    """Results of one run: per-split metric intervals, counts, timings and the settings."""

    source: str
    settings: dict[str, Any]
    test: dict[str, dict[str, Interval]] = field(default_factory=dict)
    val: dict[str, dict[str, Interval]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    models: dict[str, str] = field(default_factory=dict)
    #: split → scenario → ``frauds`` (that scenario's frauds scored) and each detector's ROC-AUC.
    scenario_aucs: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    #: The baseline with the highest validation ROC-AUC: the one the models' paired differences are taken against.
    baseline: str = ""
    #: The rank combination's weights, chosen on validation.
    rank_weights: dict[str, float] = field(default_factory=dict)
    resamples: int = 500

    def _rows(self, table_: dict[str, dict[str, Interval]], frauds: int | None = None) -> list[str]:
        count = [] if frauds is None else [f"{frauds:,}"]
        rows = [[f"{name}{' (chosen on validation)' if name == self.baseline else ''}", m["roc_auc"], m["pr_auc"],
                 *count] for name, m in table_.items() if "pr_auc" in m]
        return (table(["detector", "ROC-AUC [95% CI]", "PR-AUC [95% CI]", *(["frauds"] if count else [])], rows, "lllr")
                + paired_difference_rows(table_, "paired difference"))

    def _split_section(self, split: str, heading: str) -> list[str]:
        """One split's table, its paired differences and, with scenario labels, its per-scenario ROC-AUCs."""
        table_ = self.test if split == "test" else self.val
        if not table_:
            return [f"### {heading}", "", "Not evaluated in this run.", ""]
        c = self.counts
        lines = [f"### {heading}", "",
                 f"{c.get(f'{split}_transactions', 0):,} transactions of {c.get(f'{split}_cardholders', 0)} "
                 f"cardholders, {c.get(f'{split}_frauds', 0):,} frauds in {c.get(f'{split}_incidents', 0)} "
                 "incidents.", "", *self._rows(table_, c.get(f"{split}_frauds")), ""]
        scen = self.scenario_aucs.get(split)
        if scen:
            detectors = [d for d in next(iter(scen.values())) if d != "frauds"]
            lines += ["Per fraud scenario (each scenario's frauds against all legitimate transactions), ROC-AUC:", "",
                      *table(["scenario", "frauds", *detectors], ([k, f"{int(v['frauds']):,}",
                                                                   *(f"{v[d]:.3f}" for d in detectors)]
                                                                  for k, v in scen.items()),
                             "l" + "r" * (len(detectors) + 1)), ""]
        return lines

    def targets(self) -> list[str]:
        """The issue's targets, each with its measured figure and verdict."""
        t = self.test
        out: list[str] = []
        if "GNN federated" not in t:
            return out
        fed = t["GNN federated"]["roc_auc"]
        out.append(f"- federated ROC-AUC ≥ 0.93: {fed.value:.3f} — **{'met' if fed.value >= 0.93 else 'missed'}**")
        if self.baseline in t:
            best = self.baseline
            b = t[best]["roc_auc"]
            gap = fed.value - b.value
            disjoint = fed.low > b.high
            ok = gap >= 0.03 and disjoint
            out.append(
                f"- beats the baseline chosen on validation ({best.split(':', 1)[1]}, {b.value:.3f}) by ≥ 0.03 with "
                f"disjoint 95% intervals: {gap:+.3f}, intervals {'disjoint' if disjoint else 'overlap'} — "
                f"**{'met' if ok else 'missed'}**"
            )
        if "GNN centralized" in t:
            cen = t["GNN centralized"]["roc_auc"].value
            out.append(
                f"- federated within 0.02 of centralized: {fed.value - cen:+.3f} — "
                f"**{'met' if cen - fed.value <= 0.02 else 'missed'}**"
            )
        scen = {k: v["GNN federated"] for k, v in self.scenario_aucs.get("test", {}).items() if "GNN federated" in v}
        if scen:
            worst = min(scen, key=lambda k: scen[k])
            w = scen[worst]
            out.append(f"- every fraud scenario ROC-AUC ≥ 0.80: lowest {worst} {w:.3f} — "
                       f"**{'met' if w >= 0.80 else 'missed'}**")
        if "score_ms_per_tx" in self.timings:
            out.append(f"- scoring cost: {self.timings['score_ms_per_tx']:.2f} CPU ms per transaction (batch replay)")
        return out

    def to_markdown(self) -> str:
        s, c = self.settings, self.counts
        if self.models:
            models = (f"Models: {', '.join(f'{k} = `{v}`' for k, v in self.models.items())}, readout "
                      f"`{s.get('readout')}`, pooling `{s.get('pooling')}`, {s.get('rounds')} rounds × "
                      f"{s.get('local-epochs')} local epochs × {s.get('samples-per-epoch')} transitions, batch "
                      f"{s.get('batch-size')}, round selected on validation loss.")
        else:
            models = "No model trained (`--skip-model`): label-free baselines only."
        weights = ", ".join(f"{k} × {v:g}" for k, v in self.rank_weights.items()) or "equal"
        tested = test_line(c) + " " if self.test else "Test split not evaluated. "
        lines = [
            "## Label-free anomaly score on third-party data (`fedfraud bench anomaly`)",
            "",
            f"{machine_line()} Data: `{self.source}`, 5 banks, split by cardholder 60/15/25 (train/validation/test). "
            f"{tested}{models} "
            f"Intervals: 95% bootstrap over cardholders, {self.resamples} paired resamples. Labels are used only "
            "here. Baselines are causal (a transaction's score reads only its cardholder's earlier rows and "
            "statistics each bank fits on its training cardholders); the rank combination's weights "
            f"({weights}) and *the* baseline (`{self.baseline.split(':', 1)[-1] or '—'}`, the highest validation "
            "ROC-AUC) were chosen on validation.",
            "",
            *self._split_section("test", "Test cardholders (reported once)"),
            *self._split_section("val", "Validation cardholders (where settings were chosen)"),
            "### Timing",
            "",
            *[f"- {k}: {v:.1f}" if not k.endswith("per_tx") else f"- {k}: {v:.3f}" for k, v in self.timings.items()],
            "",
            *(["### Targets", "", *targets, ""] if (targets := self.targets()) else []),
        ]
        return "\n".join(lines)


def ingested(csv: Path, work: Path) -> Path:
    """The CSV ingested into 5 banks (hash partition by cardholder) under ``work/data``, once."""
    from fedfraud.training.data.config import IngestConfig
    from fedfraud.training.data.ingest import ingest_csv

    data = Path(work) / "data"
    if not (data / "manifest.json").exists():
        ingest_csv(Path(csv), data, IngestConfig(banks=5, partition="hash"), progress=True)
    return data


def train_run(
    data: Path, work: Path, mode: str, flat: dict[str, Any], name: str = "", observer: Any = None
) -> tuple[Path, float]:
    """Train and publish one model into ``work/registry-<name or mode>`` (ego-graph cache shared under ``work``);
    returns the registry and the wall seconds. ``observer``: shown the replies the server-side strategy receives
    (federated only; the attack bench reads the banks' real updates through it).
    """
    from fedfraud.training.anomaly.federated.task import RunSettings

    out = work / f"registry-{name or mode}"
    settings = RunSettings.from_flat(
        {**flat, "data-dir": str(data), "out-dir": str(out), "publish": True, "cache-dir": str(work / "cache")}
    )
    start = time.perf_counter()
    if mode == "federated":
        from fedfraud.training.anomaly.federated.trainer import run_federated

        run_federated(settings, observer=observer)
    else:
        from fedfraud.training.anomaly.centralized import run_centralized

        run_centralized(settings, threads=1)
    return out, time.perf_counter() - start


def score_split(
    data: Path,
    registries: dict[str, Path],
    privacy_cfg: Any,
    splits: tuple[str, ...],
    privacy_by_model: dict[str, Any] | None = None,
) -> tuple[pd.DataFrame, float]:
    """Every transaction of the cardholders in ``splits``, scored by each model and every baseline
    (``privacy_by_model``: the feature-privacy config a model was trained with, where it differs).
    """
    from fedfraud.feature_store.privacy import PrivateFeaturizer
    from fedfraud.training.anomaly.baselines import label_free_scores
    from fedfraud.training.anomaly.scorer import AnomalyScorer
    from fedfraud.feature_store.layout import list_banks, read_bank, split_of

    scorers = {name: AnomalyScorer.from_registry(path, device="cpu") for name, path in registries.items()}
    parts = []
    cpu = 0.0
    scored = 0
    for bank in list_banks(data):
        frame = read_bank(data, bank)
        split = frame["cardholder_id"].astype(str).map(lambda c: split_of(c, val_fraction=0.15))
        base = label_free_scores(frame, split.eq("train").to_numpy(), seed=bank)
        wanted = split.isin(splits).to_numpy()
        part = frame.loc[wanted, ["transaction_id", "cardholder_id", "timestamp", "is_fraud"]].copy()
        part["bank"], part["split"] = bank, split[wanted].to_numpy()
        for col in base.columns:
            part[col if col.startswith("rank:") else f"baseline:{col}"] = base.loc[wanted, col].to_numpy()
        for name, scorer in scorers.items():
            featurizer = PrivateFeaturizer.for_bank(
                scorer.encoder_cfg, (privacy_by_model or {}).get(name, privacy_cfg), bank
            )
            t0 = time.process_time()
            part[name] = scorer.score_frame(frame[wanted], featurizer)
            cpu += time.process_time() - t0
            scored += int(wanted.sum())
        parts.append(part)
        logger.info("detection_bench bank=%d rows=%d", bank, int(wanted.sum()))
    rows = pd.concat(parts, ignore_index=True)
    rows.attrs["rank_weights"] = choose_rank_weights(rows)
    return rows, 1000.0 * cpu / max(scored, 1)


def choose_rank_weights(rows: pd.DataFrame) -> dict[str, float]:
    """Set ``baseline:rank_combination`` to the weighting of the ``rank:`` columns with the highest validation
    ROC-AUC (equal weights when ``rows`` hold no validation frauds, e.g. a test-only scoring); returns it.

    Only validation rows' labels are read, so the test split stays unseen by the choice.
    """
    from fedfraud.training.anomaly.baselines import RANK_TERMS, combination_candidates, rank_combination

    ranks = rows[[f"rank:{t}" for t in RANK_TERMS]].rename(columns=lambda c: c.split(":", 1)[1])
    val = (rows["split"] == "val").to_numpy()
    label = rows["is_fraud"].fillna(False).astype(bool).to_numpy()[val]
    candidates = combination_candidates()
    best = candidates[0]
    if 0 < label.sum() < len(label):
        aucs = [roc_auc(label, rank_combination(ranks[val], w)) for w in candidates]
        best = candidates[int(np.nanargmax(aucs))]
        logger.info("rank_combination chosen on validation weights=%s roc_auc=%.4f", best, max(aucs))
    rows["baseline:rank_combination"] = rank_combination(ranks, best)
    return best


def run_detection_bench(
    csv: Path | None,
    work: Path,
    overrides: dict[str, Any] | None = None,
    modes: tuple[str, ...] = ("federated", "centralized"),
    resamples: int = 500,
    data: Path | None = None,
    splits: tuple[str, ...] = ("val", "test"),
    scenarios: Path | None = None,
) -> DetectionBench:
    """Ingest (or take ``data``, an ingested or generated dataset), train, score and compare under ``work``.

    ``modes`` empty trains nothing (baselines only); ``splits`` are the cardholder splits evaluated, so
    ``("val",)`` is a look that prints no test figure. ``scenarios``: a CSV mapping ``trans_num`` to a fraud
    scenario (else a generated dataset's ``labels.parquet``) for the per-scenario ROC-AUCs.
    """
    from fedfraud.config import FedfraudConfig
    from fedfraud.training.anomaly.federated.task import RunSettings

    work = Path(work)
    data = Path(data) if data is not None else ingested(Path(str(csv)), work)
    flat = {**RunSettings.defaults(), **DETECTION_SETTINGS, **(overrides or {})}
    bench = DetectionBench(source=str(csv or data), settings=flat, resamples=resamples)
    registries: dict[str, Path] = {}
    for mode in modes:
        registries[f"GNN {mode}"], seconds = train_run(data, work, mode, flat)
        bench.timings[f"{mode} training wall s"] = seconds
    t0 = time.perf_counter()
    rows, ms_per_tx = score_split(data, registries, FedfraudConfig().privacy, tuple(splits))
    bench.timings[f"scoring wall s ({' + '.join(splits)}, all models)"] = time.perf_counter() - t0
    if registries:
        bench.timings["score_ms_per_tx"] = ms_per_tx
    bench.rank_weights = dict(rows.attrs.get("rank_weights", {}))
    from fedfraud.training.registry import ModelRegistry

    bench.models = {name: ModelRegistry(path).get("anomaly", "latest").tag for name, path in registries.items()}
    baselines = [c for c in rows.columns if c.startswith("baseline:")]
    detectors = [*registries, *baselines]
    bench.baseline = best_on_validation(rows, baselines)
    pairs = [(m, bench.baseline) for m in registries if bench.baseline]
    if {"GNN federated", "GNN centralized"} <= set(registries):
        pairs.append(("GNN federated", "GNN centralized"))
    scenario = scenario_column(rows, data, scenarios)
    for split_name in ("test", "val"):
        if split_name not in splits:
            continue
        part = rows[rows["split"] == split_name]
        table = bootstrap_by_group(
            part["is_fraud"].astype(bool).to_numpy(),
            {d: part[d].to_numpy(dtype=np.float64) for d in detectors},
            part["cardholder_id"].astype(str).to_numpy(),
            resamples=resamples,
            pairs=tuple(pairs),
        )
        setattr(bench, split_name, table)
        bench.counts.update(split_counts(part, detectors, prefix=split_name))
        if scenario is not None:
            bench.scenario_aucs[split_name] = scenario_aucs(part, detectors, scenario.loc[part.index])
    return bench


def best_on_validation(rows: pd.DataFrame, detectors: list[str]) -> str:
    """The detector with the highest ROC-AUC on the validation rows ("" without validation frauds): *the*
    baseline the models are compared with, chosen where the test split cannot influence it.
    """
    val = rows[rows["split"] == "val"]
    label = val["is_fraud"].fillna(False).astype(bool).to_numpy()
    aucs = {d: roc_auc(label, val[d].to_numpy(dtype=np.float64)) for d in detectors}
    aucs = {d: a for d, a in aucs.items() if math.isfinite(a)}
    if not aucs:
        return ""
    best = max(aucs, key=lambda d: aucs[d])
    logger.info("baseline chosen on validation %s roc_auc=%.4f (of %s)", best, aucs[best],
                ", ".join(f"{d}={a:.4f}" for d, a in aucs.items()))
    return best


def bootstrap_splits(
    rows: pd.DataFrame, detectors: list[str], resamples: int, pairs: tuple[tuple[str, str], ...] = ()
) -> tuple[dict[str, dict[str, Interval]], dict[str, dict[str, Interval]], dict[str, int]]:
    """(test, validation) intervals of every detector over cardholders, with ``pairs``' paired differences, and
    the test split's counts: the tables of the benches that compare trained runs (privacy, adversary).
    """
    tables: dict[str, dict[str, dict[str, Interval]]] = {}
    counts: dict[str, int] = {}
    for split_name in ("test", "val"):
        part = rows[rows["split"] == split_name]
        tables[split_name] = bootstrap_by_group(
            part["is_fraud"].astype(bool).to_numpy(),
            {d: part[d].to_numpy(dtype=float) for d in detectors},
            part["cardholder_id"].astype(str).to_numpy(),
            resamples=resamples,
            pairs=pairs,
        )
        if split_name == "test":
            counts = split_counts(part, detectors)
    return tables["test"], tables["val"], counts


def split_counts(part: pd.DataFrame, detectors: list[str], prefix: str = "test") -> dict[str, int]:
    """Transactions, cardholders, frauds and fraud incidents of one split's rows that every detector scored,
    keyed ``<prefix>_transactions`` etc.
    """
    label = part["is_fraud"].astype(bool).to_numpy()
    ts = part["timestamp"].astype("int64").to_numpy() / 1e6
    scored = all_finite(part, detectors)
    return {
        f"{prefix}_transactions": int(scored.sum()),
        f"{prefix}_cardholders": int(part["cardholder_id"].nunique()),
        f"{prefix}_frauds": int(label[scored].sum()),
        f"{prefix}_incidents": fraud_incidents(part["cardholder_id"].astype(str).to_numpy()[scored], ts[scored],
                                               label[scored]),
    }


def evaluate_published(
    data: Path, registry: Path, privacy_cfg: Any, resamples: int = 300, split: str = "test",
    labels_from: Path | None = None,
) -> dict[str, Any]:
    """The published anomaly model on one split's cardholders: intervals, baselines, counts, per scenario.

    Used by the demo report. Per-scenario ROC-AUC (each fraud scenario's
    transactions against all legitimate ones) is computed when the dataset
    has the generator's ``labels.parquet`` (or ``labels_from`` has, for a
    hold-out copy of a generated dataset).
    """
    rows, ms_per_tx = score_split(Path(data), {"GNN": Path(registry)}, privacy_cfg, (split,))
    label = rows["is_fraud"].fillna(False).astype(bool).to_numpy()
    detectors = ["GNN", *[c for c in rows.columns if c.startswith("baseline:")]]
    table = bootstrap_by_group(
        label, {d: rows[d].to_numpy(dtype=np.float64) for d in detectors},
        rows["cardholder_id"].astype(str).to_numpy(), resamples=resamples,
    )
    out: dict[str, Any] = {
        "roc_auc": table["GNN"]["roc_auc"],
        "pr_auc": table["GNN"]["pr_auc"],
        "baselines": {d.split(":", 1)[1]: table[d]["roc_auc"] for d in detectors if d != "GNN"},
        "frauds": int(label[np.isfinite(rows["GNN"].to_numpy())].sum()),
        "incidents": fraud_incidents(
            rows["cardholder_id"].astype(str).to_numpy(), rows["timestamp"].astype("int64").to_numpy() / 1e6, label
        ),
        "score_ms_per_tx": ms_per_tx,
    }
    per = per_scenario(rows, "GNN", Path(labels_from or data))
    if per:
        out["per_scenario"] = per
    return out


def per_scenario(rows: pd.DataFrame, detector: str, labels_root: Path) -> dict[str, dict[str, Any]]:
    """ROC-AUC of ``detector`` per fraud scenario (its frauds against all legitimate rows), from the generator's
    ``bank_<k>/labels.parquet``; empty when the dataset has none (third-party data).
    """
    scenario = scenario_column(rows, labels_root, None)
    if scenario is None:
        return {}
    table = scenario_aucs(rows, [detector], scenario)
    return {k: {"frauds": int(v["frauds"]), "roc_auc": v[detector]} for k, v in table.items()}



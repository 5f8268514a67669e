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
  :mod:`fedfraud.training.anomaly.baselines`;
* ROC-AUC and PR-AUC on the test cardholders with 95% bootstrap intervals
  over cardholders (paired: the same draws for every detector), the
  federated − best-baseline and federated − centralized differences with
  their intervals, and the number of test frauds and fraud incidents;
  validation figures are printed too, since settings were chosen on them.
"""

from __future__ import annotations

import logging
import math
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedfraud.bench.intervals import Interval, bootstrap_by_group, fraud_incidents, paired_difference_rows

__all__ = [
    "DETECTION_SETTINGS",
    "DetectionBench",
    "evaluate_published",
    "ingested",
    "run_detection_bench",
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
    scenarios: dict[str, dict[str, Any]] = field(default_factory=dict)

    def _rows(self, table: dict[str, dict[str, Interval]]) -> list[str]:
        out = ["| detector | ROC-AUC [95% CI] | PR-AUC [95% CI] |", "|---|---|---|"]
        for name, m in table.items():
            if "pr_auc" in m:
                out.append(f"| {name} | {m['roc_auc']} | {m['pr_auc']} |")
        return out + paired_difference_rows(table, "paired difference")

    def targets(self) -> list[str]:
        """The issue's targets, each with its measured figure and verdict."""
        t = self.test
        out: list[str] = []
        if "GNN federated" not in t:
            return out
        fed = t["GNN federated"]["roc_auc"]
        out.append(f"- federated ROC-AUC ≥ 0.93: {fed.value:.3f} — **{'met' if fed.value >= 0.93 else 'missed'}**")
        base = {k: v for k, v in t.items() if k.startswith("baseline:")}
        if base:
            best = max(base, key=lambda k: base[k]["roc_auc"].value)
            b = base[best]["roc_auc"]
            gap = fed.value - b.value
            disjoint = fed.low > b.high
            ok = gap >= 0.03 and disjoint
            out.append(
                f"- beats the best baseline ({best.split(':', 1)[1]}, {b.value:.3f}) by ≥ 0.03 with disjoint 95% "
                f"intervals: {gap:+.3f}, intervals {'disjoint' if disjoint else 'overlap'} — "
                f"**{'met' if ok else 'missed'}**"
            )
        if "GNN centralized" in t:
            cen = t["GNN centralized"]["roc_auc"].value
            out.append(
                f"- federated within 0.02 of centralized: {fed.value - cen:+.3f} — "
                f"**{'met' if cen - fed.value <= 0.02 else 'missed'}**"
            )
        if self.scenarios:
            worst = min(self.scenarios, key=lambda k: self.scenarios[k]["roc_auc"])
            w = self.scenarios[worst]["roc_auc"]
            out.append(f"- every fraud scenario ROC-AUC ≥ 0.80: lowest {worst} {w:.3f} — "
                       f"**{'met' if w >= 0.80 else 'missed'}**")
        if "score_ms_per_tx" in self.timings:
            out.append(f"- scoring cost: {self.timings['score_ms_per_tx']:.2f} CPU ms per transaction (batch replay)")
        return out

    def to_markdown(self) -> str:
        s, c = self.settings, self.counts
        lines = [
            "## Label-free anomaly score on third-party data (`fedfraud bench anomaly`)",
            "",
            f"Machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}. Data: "
            f"`{self.source}`, 5 banks, split by cardholder 60/15/25 (train/validation/test). Test: "
            f"{c.get('test_transactions', 0):,} transactions of {c.get('test_cardholders', 0)} cardholders, "
            f"**{c.get('test_frauds', 0):,} frauds in {c.get('test_incidents', 0)} incidents**. Models: "
            f"{', '.join(f'{k} = `{v}`' for k, v in self.models.items())}, readout `{s.get('readout')}`, pooling "
            f"`{s.get('pooling')}`, {s.get('rounds')} rounds × {s.get('local-epochs')} local epochs × "
            f"{s.get('samples-per-epoch')} transitions, batch {s.get('batch-size')}, round selected on validation "
            "loss. Intervals: 95% bootstrap over cardholders, 500 paired resamples. Labels are used only here.",
            "",
            "### Test cardholders (reported once)",
            "",
            *self._rows(self.test),
            "",
            "### Validation cardholders (where settings were chosen)",
            "",
            *self._rows(self.val),
            "",
            *(
                ["### Per fraud scenario (test cardholders, federated model; each scenario's frauds vs all "
                 "legitimate transactions)", "", "| scenario | test frauds | ROC-AUC |", "|---|---:|---:|",
                 *[f"| {k} | {v['frauds']} | {v['roc_auc']:.3f} |" for k, v in self.scenarios.items()], ""]
                if self.scenarios else []
            ),
            "### Timing",
            "",
            *[f"- {k}: {v:.1f}" if not k.endswith("per_tx") else f"- {k}: {v:.3f}" for k, v in self.timings.items()],
            "",
            "### Targets",
            "",
            *self.targets(),
            "",
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
    from fedfraud.training.anomaly.baselines import causal_baselines, isolation_forest_scores
    from fedfraud.training.anomaly.scorer import AnomalyScorer
    from fedfraud.feature_store.layout import list_banks, read_bank, split_of

    scorers = {name: AnomalyScorer.from_registry(path, device="cpu") for name, path in registries.items()}
    parts = []
    cpu = 0.0
    scored = 0
    for bank in list_banks(data):
        frame = read_bank(data, bank)
        split = frame["cardholder_id"].astype(str).map(lambda c: split_of(c, val_fraction=0.15))
        base = causal_baselines(frame)
        wanted = split.isin(splits).to_numpy()
        part = frame.loc[wanted, ["transaction_id", "cardholder_id", "timestamp", "is_fraud"]].copy()
        part["bank"], part["split"] = bank, split[wanted].to_numpy()
        for col in ("spend_24h_surprise", "amount_surprise", "new_node_edge"):
            part[f"baseline:{col}"] = base.loc[wanted, col].to_numpy()
        train_rows = split.eq("train").to_numpy()
        part["baseline:isolation_forest"] = isolation_forest_scores(base[train_rows], base[wanted], seed=bank)
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
    return pd.concat(parts, ignore_index=True), 1000.0 * cpu / max(scored, 1)


def run_detection_bench(
    csv: Path | None,
    work: Path,
    overrides: dict[str, Any] | None = None,
    modes: tuple[str, ...] = ("federated", "centralized"),
    resamples: int = 500,
    data: Path | None = None,
) -> DetectionBench:
    """Ingest (or take ``data``, an ingested or generated dataset), train, score and compare under ``work``."""
    from fedfraud.config import FedfraudConfig
    from fedfraud.training.anomaly.federated.task import RunSettings

    work = Path(work)
    data = Path(data) if data is not None else ingested(Path(str(csv)), work)
    flat = {**RunSettings.defaults(), **DETECTION_SETTINGS, **(overrides or {})}
    bench = DetectionBench(source=str(csv or data), settings=flat)
    registries: dict[str, Path] = {}
    for mode in modes:
        registries[f"GNN {mode}"], seconds = train_run(data, work, mode, flat)
        bench.timings[f"{mode} training wall s"] = seconds
    t0 = time.perf_counter()
    rows, ms_per_tx = score_split(data, registries, FedfraudConfig().privacy, ("val", "test"))
    bench.timings["scoring wall s (val + test, all models)"] = time.perf_counter() - t0
    bench.timings["score_ms_per_tx"] = ms_per_tx
    from fedfraud.training.registry import ModelRegistry

    bench.models = {name: ModelRegistry(path).get("anomaly", "latest").tag for name, path in registries.items()}
    detectors = [*registries, *[c for c in rows.columns if c.startswith("baseline:")]]
    for split_name in ("test", "val"):
        part = rows[rows["split"] == split_name]
        label = part["is_fraud"].astype(bool).to_numpy()
        scores = {d: part[d].to_numpy(dtype=np.float64) for d in detectors}
        pairs: list[tuple[str, str]] = []
        if "GNN federated" in registries:
            best = max(
                (d for d in detectors if d.startswith("baseline:")),
                key=lambda d: _auc(label, scores[d]),
            )
            pairs.append(("GNN federated", best))
            if "GNN centralized" in registries:
                pairs.append(("GNN federated", "GNN centralized"))
        table = bootstrap_by_group(
            label, scores, part["cardholder_id"].astype(str).to_numpy(), resamples=resamples, pairs=tuple(pairs)
        )
        setattr(bench, split_name, table)
        if split_name == "test":
            bench.counts = split_counts(part, detectors)
            if "GNN federated" in registries:
                bench.scenarios = per_scenario(part, "GNN federated", data)
    return bench


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


def split_counts(part: pd.DataFrame, detectors: list[str]) -> dict[str, int]:
    """Transactions, cardholders, frauds and fraud incidents of one split's rows that every detector scored."""
    label = part["is_fraud"].astype(bool).to_numpy()
    ts = part["timestamp"].astype("int64").to_numpy() / 1e6
    scored = np.all(np.isfinite(np.c_[[part[d].to_numpy(dtype=np.float64) for d in detectors]].T), axis=1)
    return {
        "test_transactions": int(scored.sum()),
        "test_cardholders": int(part["cardholder_id"].nunique()),
        "test_frauds": int(label[scored].sum()),
        "test_incidents": fraud_incidents(part["cardholder_id"].astype(str).to_numpy()[scored], ts[scored],
                                          label[scored]),
    }


def _auc(label: np.ndarray, score: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    keep = np.isfinite(score)
    return float(roc_auc_score(label[keep], score[keep])) if 0 < label[keep].sum() < keep.sum() else math.nan


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
    from fedfraud.feature_store.layout import bank_dir

    banks = sorted(rows["bank"].unique())
    paths = [bank_dir(labels_root, int(b)) / "labels.parquet" for b in banks]
    if not paths or not all(p.exists() for p in paths):
        return {}
    scen = pd.concat([pd.read_parquet(p).assign(bank=int(b)) for p, b in zip(paths, banks, strict=True)])
    merged = rows.merge(scen, on=["bank", "transaction_id"], how="left")
    score = merged[detector].to_numpy(dtype=np.float64)
    finite = np.isfinite(score)
    fraud = merged["is_fraud"].fillna(False).astype(bool).to_numpy()
    legit = finite & ~fraud
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(merged.loc[fraud, "scenario"].dropna().unique()):
        pos = finite & (merged["scenario"] == name).to_numpy()
        keep = pos | legit
        out[str(name)] = {"frauds": int(pos.sum()), "roc_auc": _auc(pos[keep], score[keep])}
    return out

"""Ablations of the anomaly model (readouts, negative mixes, encoder parts), on validation cardholders only.

``fedfraud bench anomaly-ablation --csv FILE`` loads the five banks once,
trains every variant centrally with the same budget (same seed, same steps),
and scores each bank's validation transitions (a seeded reservoir of
``max-test-pairs`` per bank, every label kept for evaluation only). The test
cardholders are not touched: this is where settings are chosen.

Two groups of variants (``--group``): ``readout`` (readouts and negative mixes) and ``graph`` (issue 34: what
the ego graph adds; each variant is one ``anomaly.ablate`` switch of the product model). Every variant's ROC-AUC
is compared with the full model's as a paired bootstrap difference over the same validation cardholders, beside
the strongest causal label-free baseline on the same rows; with ``--scenarios FILE`` (``trans_num`` → scenario)
per scenario too.
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
from sklearn.metrics import roc_auc_score

from fedfraud.bench.harness import signed, table
from fedfraud.training.bootstrap import Interval, bootstrap_by_group
from fedfraud.core.errors import UserError

__all__ = ["ABLATION_GROUPS", "ABLATION_VARIANTS", "FULL_MODEL", "GRAPH_VARIANTS", "AblationBench", "run_ablation"]

logger = logging.getLogger(__name__)

_ALL = "swap=1,amount=1,burst=1,geo=1,hour=1,category=1,new-high=1,spell=1"


def _without(family: str) -> str:
    return ",".join(p for p in _ALL.split(",") if not p.startswith(family + "="))


#: The product model's default configuration: the row every other variant's paired difference is taken against.
FULL_MODEL = "full model (next-event, default heads)"

#: Variant name → AnomalyConfig overrides.
ABLATION_VARIANTS: dict[str, dict[str, Any]] = {
    FULL_MODEL: {},
    "next-event + distance, new-merchant heads": {"heads": "category,amount,amount-rel,hour,gap,distance,new-merchant"},
    "next-event, category head only": {"heads": "category"},
    "next-event, amount head only": {"heads": "amount"},
    "contrastive, all 8 families": {"readout": "contrastive", "negatives": _ALL},
    "contrastive, swap only": {"readout": "contrastive", "negatives": "swap=1"},
    **{
        f"contrastive, all but {f}": {"readout": "contrastive", "negatives": _without(f)}
        for f in ("swap", "amount", "burst", "geo", "hour", "category", "new-high", "spell")
    },
    "thesis f(q_prev, q_cur), graph negatives": {"readout": "thesis"},
}

#: What the ego graph adds (issue 34): one ``anomaly.ablate`` switch each, the rest of the model unchanged.
GRAPH_VARIANTS: dict[str, dict[str, Any]] = {
    FULL_MODEL: {},
    "history summary only (no graph)": {"ablate": "no-graph"},
    "graph only (no history summary)": {"ablate": "no-history"},
    "graph, merchant table frozen": {"ablate": "freeze-merchants"},
    "graph without L′/T′ (merchant table only)": {"ablate": "no-location-time"},
}

#: ``--group`` name → its variants.
ABLATION_GROUPS: dict[str, dict[str, dict[str, Any]]] = {"graph": GRAPH_VARIANTS, "readout": ABLATION_VARIANTS}


@dataclass
class AblationBench:
    """Validation ROC-AUC / PR-AUC of each variant with intervals, paired differences against the full model, the
    strongest label-free baseline on the same rows, per-scenario ROC-AUCs, and each variant's training time.
    """

    source: str
    steps: int
    #: variant (and baseline) → metric → interval; ``"a − b"`` keys hold paired ROC-AUC differences
    rows: dict[str, dict[str, Interval]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    frauds: int = 0
    transitions: int = 0
    cardholders: int = 0
    banks: int = 5
    rounds: int = 1
    #: the baseline column with the highest ROC-AUC on these rows ("" when none scored)
    baseline: str = ""
    #: scenario → ``frauds`` and each detector's ROC-AUC (that scenario's frauds against all legitimate rows)
    scenarios: dict[str, dict[str, float]] = field(default_factory=dict)
    #: scenario → ``"variant − full"`` → paired difference of ROC-AUC on that scenario's rows
    scenario_diffs: dict[str, dict[str, Interval]] = field(default_factory=dict)
    #: variant → ROC-AUC of each training seed (the first is the seed of the tables), when more than one was run
    seed_aucs: dict[str, list[float]] = field(default_factory=dict)
    resamples: int = 300

    def _diff(self, name: str, table_: dict[str, Interval] | None = None) -> str:
        """``name − full model`` from ``table_`` (default: the pooled rows), signed; "—" where there is none."""
        d = (table_ if table_ is not None else {k: v["roc_auc"] for k, v in self.rows.items()}).get(
            f"{name} − {FULL_MODEL}")
        return "—" if d is None else signed(d)

    def _seed_cells(self, name: str) -> list[str]:
        """The seed-spread cells of one row (none with one seed): its ROC-AUC range and its per-seed Δ range."""
        aucs = self.seed_aucs.get(name)
        if not aucs:
            return []
        full = self.seed_aucs.get(FULL_MODEL, [])
        deltas = [a - f for a, f in zip(aucs, full, strict=False)] if name != FULL_MODEL else []
        return [f"{min(aucs):.3f}–{max(aucs):.3f}", f"{min(deltas):+.3f} to {max(deltas):+.3f}" if deltas else "—"]

    def _recipe(self) -> str:
        """How each variant was trained, in words, for the table's preamble."""
        if self.rounds <= 1:
            return "constant learning rate, the last step's weights"
        return (f"{self.rounds} rounds on the product's learning-rate schedule, the round with the lowest mean "
                "validation loss kept")

    def to_markdown(self) -> str:
        seeds = len(next(iter(self.seed_aucs.values()), []))
        lines = [
            f"### Anomaly ablation (`fedfraud bench anomaly-ablation`) on `{self.source}`",
            "",
            f"{self.banks} banks; every variant trained centrally for {self.steps} steps of 128 transitions (same "
            f"seed; {self._recipe()}), scored on **validation** cardholders' transitions ({self.transitions:,} "
            f"transitions of {self.cardholders} cardholders, **{self.frauds} frauds**; a seeded reservoir per bank). "
            f"95% bootstrap over cardholders, {self.resamples} resamples; Δ = variant − full model, paired (the same "
            "cardholder draws). The baseline is the causal label-free score with the highest ROC-AUC on these same "
            "rows (an optimistic choice in its favour). The test cardholders are not used here."
            + (f" Seed spread: every variant also trained from {seeds} seeds (the tables use the first)."
               if seeds else ""),
            "",
            *table(["variant", "val ROC-AUC [95% CI]", "val PR-AUC [95% CI]", "Δ ROC-AUC vs full [95% CI]",
                    "train s", *([f"ROC-AUC, {seeds} seeds (min–max)", "Δ per seed (min to max)"] if seeds else [])],
                   [*([name, self.rows[name]["roc_auc"], self.rows[name]["pr_auc"], self._diff(name), f"{secs:.0f}",
                       *self._seed_cells(name)] for name, secs in self.seconds.items()),
                    *([[f"strongest label-free baseline: `{self.baseline.split(':', 1)[-1]}`",
                        self.rows[self.baseline]["roc_auc"], self.rows[self.baseline]["pr_auc"],
                        self._diff(self.baseline), "—", *(["—", "—"] if seeds else [])]] if self.baseline else [])]),
        ]
        if self.scenarios:
            names = [*self.seconds, *([self.baseline] if self.baseline else [])]
            scen = sorted(self.scenarios)

            def cell(name: str, s: str) -> str:
                diff = self._diff(name, self.scenario_diffs.get(s, {}))
                return f"{self.scenarios[s].get(name, float('nan')):.3f}" + ("" if diff == "—" else f"; Δ {diff}")

            lines += ["", "Per scenario (validation ROC-AUC of that scenario's frauds against all legitimate rows; "
                      "Δ vs full with its paired 95% interval):", "",
                      *table(["variant", *(f"{s} ({int(self.scenarios[s]['frauds'])} frauds)" for s in scen)],
                             ([f"baseline `{name.split(':', 1)[-1]}`" if name == self.baseline else name,
                               *(cell(name, s) for s in scen)] for name in names))]
        return "\n".join(lines + [""])


def _dataset(csv: Path, work: Path) -> Path:
    """``work/data``: the CSV ingested into 5 banks once; refuses a ``work`` that holds another CSV's banks."""
    from fedfraud.feature_store.layout import read_manifest
    from fedfraud.training.data.config import IngestConfig
    from fedfraud.training.data.ingest import ingest_csv

    data = Path(work) / "data"
    if not (data / "manifest.json").exists():
        ingest_csv(Path(csv), data, IngestConfig(banks=5, partition="hash"), progress=True)
    source = read_manifest(data).get("source")
    if source and Path(source) != Path(csv).resolve():
        raise UserError(f"{data} holds {source}, not {csv}: pass another --work for each CSV")
    return data


def _validation_rows(data: Path, banks: list[Any], val_fraction: float) -> pd.DataFrame:
    """One row per scored validation transition (bank, transaction, cardholder pseudonym, label) with every causal
    label-free baseline of its bank (``baseline:<name>`` and ``rank:<term>`` columns), fitted on training
    cardholders, and the rank combination's weights chosen on these rows.
    """
    from fedfraud.bench.detection import choose_rank_weights
    from fedfraud.feature_store.layout import read_bank, split_of
    from fedfraud.training.anomaly.baselines import label_free_scores

    parts = []
    for b in banks:
        v = b.val
        if v.transactions is None or v.cardholders is None or v.labels is None:
            raise ValueError("validation pairs without transaction ids (a bank-data cache from an older version)")
        part = pd.DataFrame({"bank": b.bank, "transaction_id": v.transactions.astype(str),
                             "cardholder_id": v.cardholders.astype(str), "is_fraud": v.labels.astype(bool),
                             "split": "val"})
        frame = read_bank(data, b.bank)
        train = frame["cardholder_id"].astype(str).map(lambda c: split_of(c, val_fraction=val_fraction)).eq("train")
        base = label_free_scores(frame, train.to_numpy(), seed=b.bank)
        base.index = frame["transaction_id"].astype(str).to_numpy()
        base = base[~base.index.duplicated()].reindex(part["transaction_id"])
        for col in base.columns:
            part[col if col.startswith("rank:") else f"baseline:{col}"] = base[col].to_numpy()
        parts.append(part)
    rows = pd.concat(parts, ignore_index=True)
    choose_rank_weights(rows)
    return rows


def _train_and_score(
    variant: dict[str, Any], base: Any, cfg: Any, banks: list[Any], steps: int, seed: int, rounds: int = 1
) -> tuple[np.ndarray, float]:
    """One variant trained centrally from ``seed`` for ``steps`` steps; its validation scores and training seconds.

    ``rounds`` > 1 follows the product's recipe instead of one constant-rate run: the steps split into rounds, the
    learning rate on the configured schedule over them, and the weights of the round with the lowest mean
    validation loss (the label-free next-event NLL) kept, so a variant that overfits sooner is not judged past it.
    """
    import copy

    import torch

    from fedfraud.training.anomaly.engine import evaluate_selection, sources_of, train_model
    from fedfraud.training.anomaly.federated.task import lr_factor
    from fedfraud.training.anomaly.model import AnomalyModel, score_pairs

    anomaly = base.model_copy(update=variant)
    anomaly = type(anomaly).model_validate(anomaly.model_dump())  # re-validate the overridden fields
    torch.manual_seed(seed)
    model = AnomalyModel(anomaly, cfg.encoder, cfg.egograph.max_nodes)
    sources = sources_of(banks, anomaly, cfg.egograph.max_nodes)
    t0 = time.perf_counter()
    if rounds <= 1:
        train_model(model, sources, epochs=steps // 8, samples_per_epoch=8 * 128, batch_size=128, lr=anomaly.lr,
                    seed=seed)
    else:
        best, state, optimizer = math.inf, copy.deepcopy(model.state_dict()), None
        for rnd in range(1, rounds + 1):
            _, optimizer = train_model(model, sources, epochs=max(1, steps // (8 * rounds)),
                                       samples_per_epoch=8 * 128, batch_size=128,
                                       lr=anomaly.lr * lr_factor(anomaly, rnd, rounds), seed=[seed, rnd],
                                       optimizer_state=optimizer)
            losses = [evaluate_selection(model, b).get("val_loss", math.nan) for b in banks]
            loss = float(np.nanmean(losses)) if np.isfinite(losses).any() else -float(rnd)  # no val task: last
            if loss < best:
                best, state = loss, copy.deepcopy(model.state_dict())
            logger.debug("ablation round=%d val_loss=%.4f", rnd, loss)
        model.load_state_dict(state)
    seconds = time.perf_counter() - t0
    val = [b.val for b in banks]
    return np.concatenate([score_pairs(model, v.previous, v.current, 256, v.priors, v.events) for v in val]), seconds


def run_ablation(
    csv: Path | None,
    work: Path,
    steps: int = 240,
    variants: dict[str, dict[str, Any]] | None = None,
    resamples: int = 300,
    scenarios: Path | None = None,
    seeds: int = 1,
    data: Path | None = None,
    rounds: int = 1,
) -> AblationBench:
    """Train and score every variant (default: both groups); the banks' pairs are built once (no disk cache).

    ``data``: an ingested or generated dataset instead of ``csv`` (a generated one brings its scenario labels).
    ``scenarios``: a ``trans_num`` → scenario CSV for per-scenario ROC-AUCs; ``seeds`` > 1 retrains every variant
    from further seeds and reports the spread of its ROC-AUC and of its difference to the full model. ``rounds`` > 1:
    the product's schedule and validation-loss selection over that many rounds (:func:`_train_and_score`).
    """
    from fedfraud.bench.detection import DETECTION_SETTINGS, best_on_validation, scenario_aucs, scenario_column
    from fedfraud.config import FedfraudConfig
    from fedfraud.feature_store.layout import list_banks
    from fedfraud.training.anomaly.data import load_bank_data

    variants = dict(variants or {**GRAPH_VARIANTS, **ABLATION_VARIANTS})
    if seeds < 1:
        raise UserError("--seeds must be at least 1")
    if (csv is None) == (data is None):
        raise UserError("give exactly one of a CSV or an ingested dataset")
    data = Path(data) if data is not None else _dataset(Path(str(csv)), Path(work))
    cfg = FedfraudConfig()
    base = cfg.anomaly.model_copy(
        update={"max_train_pairs": DETECTION_SETTINGS["max-train-pairs"], "max_test_pairs": 2000,
                "max_eval_normal": 200, "batch_size": 128}
    )
    banks = [load_bank_data(data, b, base, cfg.encoder, cfg.privacy, cfg.egograph, progress=True)
             for b in list_banks(data)]
    rows = _validation_rows(data, banks, base.val_fraction)
    label = rows["is_fraud"].to_numpy(dtype=bool)
    group = rows["cardholder_id"].to_numpy()
    bench = AblationBench(str(csv or data), steps, rounds=rounds, frauds=int(label.sum()), transitions=len(label),
                          cardholders=int(rows["cardholder_id"].nunique()), banks=len(banks), resamples=resamples)
    bench.baseline = best_on_validation(rows, [c for c in rows.columns if c.startswith("baseline:")])
    for name, update in variants.items():
        aucs = []
        for k in range(seeds):
            score, seconds = _train_and_score(update, base, cfg, banks, steps, base.seed + k, rounds)
            aucs.append(float(roc_auc_score(label, score)))
            if k == 0:
                rows[name], bench.seconds[name] = score, seconds
        if seeds > 1:
            bench.seed_aucs[name] = aucs
        logger.info("ablation variant=%r val_roc_auc=%s seconds=%.0f", name, aucs, bench.seconds[name])
    detectors = [*variants, *([bench.baseline] if bench.baseline else [])]
    pairs = tuple((d, FULL_MODEL) for d in detectors if d != FULL_MODEL) if FULL_MODEL in variants else ()
    columns = {d: rows[d].to_numpy(dtype=np.float64) for d in detectors}
    bench.rows = bootstrap_by_group(label, columns, group, resamples=resamples, pairs=pairs)
    scenario = scenario_column(rows, data, scenarios)
    if scenario is not None:
        bench.scenarios = scenario_aucs(rows, detectors, scenario)
        name = scenario.reindex(rows.index).astype("string")
        for s in bench.scenarios:  # that scenario's frauds against every legitimate row, paired as above
            keep = (~label | name.eq(s).fillna(False).to_numpy(dtype=bool))
            table = bootstrap_by_group(label[keep], {d: v[keep] for d, v in columns.items()}, group[keep],
                                       resamples=resamples, pairs=pairs)
            bench.scenario_diffs[s] = {k: m["roc_auc"] for k, m in table.items() if "pr_auc" not in m}
    return bench

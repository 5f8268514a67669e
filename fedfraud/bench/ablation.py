"""Readout and negative-mix ablation of the anomaly model, on validation cardholders only.

``fedfraud bench anomaly-ablation --csv FILE`` loads the five banks once,
trains every variant centrally with the same budget (same seed, same steps),
and scores each bank's validation transitions (a seeded reservoir of
``max-test-pairs`` per bank, every label kept for evaluation only). The test
cardholders are not touched: this is where settings are chosen.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedfraud.bench.intervals import Interval, bootstrap_by_group

__all__ = ["ABLATION_VARIANTS", "AblationBench", "run_ablation"]

logger = logging.getLogger(__name__)

_ALL = "swap=1,amount=1,burst=1,geo=1,hour=1,category=1,new-high=1,spell=1"


def _without(family: str) -> str:
    return ",".join(p for p in _ALL.split(",") if not p.startswith(family + "="))


#: Variant name → AnomalyConfig overrides.
ABLATION_VARIANTS: dict[str, dict[str, Any]] = {
    "next-event (default heads)": {},
    "next-event + distance, new-merchant heads": {"heads": "category,amount,hour,gap,distance,new-merchant"},
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


@dataclass
class AblationBench:
    """Validation ROC-AUC / PR-AUC of each variant with intervals, and its training time."""

    source: str
    steps: int
    rows: dict[str, dict[str, Interval]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    frauds: int = 0
    transitions: int = 0

    def to_markdown(self) -> str:
        lines = [
            "## Anomaly readout and negative-mix ablation (`fedfraud bench anomaly-ablation`)",
            "",
            f"Data: `{self.source}`, 5 banks; every variant trained centrally for {self.steps} steps of 128 "
            "transitions (same seed), scored on **validation** cardholders' transitions "
            f"({self.transitions:,}, {self.frauds} frauds; a seeded reservoir per bank). 95% bootstrap over "
            "cardholders. The test cardholders are not used here.",
            "",
            "| variant | val ROC-AUC [95% CI] | val PR-AUC [95% CI] | train s |",
            "|---|---|---|---|",
        ]
        for name, m in self.rows.items():
            lines.append(f"| {name} | {m['roc_auc']} | {m['pr_auc']} | {self.seconds[name]:.0f} |")
        return "\n".join(lines + [""])


def run_ablation(
    csv: Path, work: Path, steps: int = 240, variants: dict[str, dict[str, Any]] | None = None, resamples: int = 300
) -> AblationBench:
    """Train and score every variant; the banks' pairs are built once (no disk cache)."""
    import torch

    from fedfraud.bench.detection import DETECTION_SETTINGS
    from fedfraud.config import FedfraudConfig
    from fedfraud.training.anomaly.data import load_bank_data
    from fedfraud.training.anomaly.engine import sources_of, train_model
    from fedfraud.training.anomaly.model import AnomalyModel, score_pairs
    from fedfraud.training.data.config import IngestConfig
    from fedfraud.training.data.ingest import ingest_csv
    from fedfraud.feature_store.layout import list_banks

    work = Path(work)
    data = work / "data"
    if not (data / "manifest.json").exists():
        ingest_csv(Path(csv), data, IngestConfig(banks=5, partition="hash"), progress=True)
    cfg = FedfraudConfig()
    base = cfg.anomaly.model_copy(
        update={"max_train_pairs": DETECTION_SETTINGS["max-train-pairs"], "max_test_pairs": 2000,
                "max_eval_normal": 200, "batch_size": 128}
    )
    banks = [load_bank_data(data, b, base, cfg.encoder, cfg.privacy, cfg.egograph, progress=True)
             for b in list_banks(data)]
    val = [b.val for b in banks]
    label = np.concatenate([v.labels for v in val])
    group = np.concatenate([v.cardholders for v in val]).astype(str)
    bench = AblationBench(str(csv), steps, frauds=int(label.sum()), transitions=len(label))
    for name, update in (variants or ABLATION_VARIANTS).items():
        anomaly = base.model_copy(update=update)
        anomaly = type(anomaly).model_validate(anomaly.model_dump())  # re-validate the overridden fields
        torch.manual_seed(anomaly.seed)
        model = AnomalyModel(anomaly, cfg.encoder, cfg.egograph.max_nodes)
        t0 = time.perf_counter()
        train_model(model, sources_of(banks, anomaly, cfg.egograph.max_nodes), epochs=steps // 8,
                    samples_per_epoch=8 * 128, batch_size=128, lr=anomaly.lr, seed=anomaly.seed)
        bench.seconds[name] = time.perf_counter() - t0
        score = np.concatenate([score_pairs(model, v.previous, v.current, 256, v.priors, v.events) for v in val])
        bench.rows[name] = bootstrap_by_group(label, {name: score}, group, resamples=resamples)[name]
        logger.info("ablation variant=%r val_roc_auc=%s seconds=%.0f", name, bench.rows[name]["roc_auc"],
                    bench.seconds[name])
    return bench

"""The main job end to end on embedded defaults: what ``make demo`` / ``fedfraud demo`` runs.

Each stage is a small function that calls the product's public APIs and
returns a :class:`StageResult`; :func:`run_demo` runs them in order, keeps
their numbers and writes ``summary.json`` plus an HTML report with plots.
Nothing here implements product logic: if a stage needs a helper, the
helper belongs in the product package.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedfraud.config import FedfraudConfig

__all__ = ["DemoArgs", "DemoReport", "StageResult", "run_demo"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DemoArgs:
    """Sizes of the demo run; defaults keep the whole job under 10 minutes on 2 cores."""

    out: Path
    cardholders: int = 1000
    days: int = 30
    banks: int = 5
    seed: int = 7

    def __post_init__(self) -> None:
        if self.cardholders < 10 or self.days < 3 or self.banks < 2:
            raise ValueError("demo needs at least 10 cardholders, 3 days and 2 banks")


@dataclass
class StageResult:
    """What one stage did: its wall time and the figures worth showing."""

    name: str
    seconds: float
    summary: dict[str, Any]
    plots: dict[str, Any] = field(default_factory=dict)


@dataclass
class DemoReport:
    """All stage results plus where the artifacts went."""

    out: Path
    stages: list[StageResult] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.stages)

    def to_json(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
            "seconds": round(self.seconds, 2),
            "stages": [{"name": s.name, "seconds": round(s.seconds, 2), **s.summary} for s in self.stages],
        }


# ---------------------------------------------------------------------------- stages


def _stage_generate(cfg: FedfraudConfig, args: DemoArgs, ctx: dict[str, Any]) -> StageResult:
    from fedfraud.config import update_section
    from training.data.synthetic import generate_dataset

    cfg = update_section(
        cfg, "generate", banks=args.banks, cardholders=args.cardholders, days=args.days, seed=args.seed
    )
    out = args.out / "data"
    report = generate_dataset(out, cfg.generate, raw_csv=True, progress=False)
    ctx["data"] = out
    ctx["raw_csv"] = report.raw_csv
    return StageResult(
        "generate",
        report.seconds,
        {
            "transactions": report.transactions,
            "fraud": report.fraud,
            "banks": len(report.per_bank),
            "scenarios": report.scenarios,
        },
        plots={"scenarios": report.scenarios, "per_bank": report.per_bank},
    )


def _stage_ingest(cfg: FedfraudConfig, args: DemoArgs, ctx: dict[str, Any]) -> StageResult:
    """Re-ingest the raw Sparkov CSV with a few corrupt lines appended, to show rejects keep reasons."""
    import shutil

    from fedfraud.config import update_section
    from training.data.ingest import ingest_csv

    raw: Path = ctx["raw_csv"]
    dirty = args.out / "raw_with_bad_rows.csv"
    shutil.copyfile(raw, dirty)
    header = raw.open(encoding="utf-8").readline().rstrip("\n").split("|")
    good = dict(zip(header, raw.open(encoding="utf-8").readlines()[1].rstrip("\n").split("|"), strict=False))
    bad_rows = []
    for field_name, value in (("amt", "-12.50"), ("merch_lat", "123.4"), ("trans_date", "not-a-date"), ("amt", "nan")):
        row = dict(good)
        row[field_name] = value
        row["trans_num"] = f"bad-{field_name}-{len(bad_rows)}"
        bad_rows.append(row)
    bad_rows.append(dict(good))  # duplicate transaction id
    with dirty.open("a", encoding="utf-8") as fh:
        for row in bad_rows:
            fh.write("|".join(row.get(h, "") for h in header) + "\n")
    t0 = time.perf_counter()
    ingest_cfg = update_section(cfg, "ingest", banks=args.banks).ingest
    report = ingest_csv(dirty, args.out / "ingested", ingest_cfg, progress=False)
    return StageResult(
        "ingest",
        time.perf_counter() - t0,
        {
            "accepted": report.accepted,
            "rejected": report.rejected,
            "rejects_by_reason": report.rejects_by_reason,
            "rows_per_s": round(report.rows_per_s),
        },
    )


def _stage_features(cfg: FedfraudConfig, args: DemoArgs, ctx: dict[str, Any]) -> StageResult:
    """Each bank computes its private features with its own secret; report its μ-GDP budget."""
    from feature_store.privacy import PrivateFeaturizer, mu_gdp
    from training.data.layout import list_banks, read_bank

    t0 = time.perf_counter()
    per_bank: dict[str, Any] = {}
    vectors = 0
    for bank in list_banks(ctx["data"]):
        frame = read_bank(ctx["data"], bank)
        featurizer = PrivateFeaturizer.for_bank(cfg.encoder, cfg.privacy, bank)
        feats = featurizer.transform(frame)
        vectors += 2 * len(feats)
        eps = featurizer.epsilon(frame["cardholder_id"].drop_duplicates())
        per_bank[f"bank_{bank}"] = {"rows": len(feats), "mu_gdp": round(mu_gdp(eps, cfg.privacy.delta), 4)}
    seconds = time.perf_counter() - t0
    return StageResult(
        "private features", seconds, {"vectors": vectors, "vectors_per_s": round(vectors / seconds), "banks": per_bank}
    )


def _stage_egographs(cfg: FedfraudConfig, args: DemoArgs, ctx: dict[str, Any]) -> StageResult:
    from feature_store.egograph import build_snapshot_pairs
    from feature_store.privacy import PrivateFeaturizer
    from training.data.layout import list_banks, read_bank

    t0 = time.perf_counter()
    nodes, edges, pairs = [], [], 0
    bank = list_banks(ctx["data"])[0]
    frame = read_bank(ctx["data"], bank)
    featurizer = PrivateFeaturizer.for_bank(cfg.encoder, cfg.privacy, bank)
    for pair in build_snapshot_pairs(frame, featurizer, cfg.egograph):
        pairs += 1
        nodes.append(pair.current.num_nodes)
        edges.append(pair.current.edge_index.shape[1])
    seconds = time.perf_counter() - t0
    return StageResult(
        "ego graphs",
        seconds,
        {
            "bank": bank,
            "snapshot_pairs": pairs,
            "pairs_per_s": round(pairs / seconds) if seconds else 0,
            "median_nodes": float(np.median(nodes)) if nodes else 0.0,
            "median_edges": float(np.median(edges)) if edges else 0.0,
        },
        plots={"nodes": nodes, "edges": edges},
    )


Stage = Callable[[FedfraudConfig, DemoArgs, dict[str, Any]], StageResult]

STAGES: list[Stage] = [_stage_generate, _stage_ingest, _stage_features, _stage_egographs]


def run_demo(cfg: FedfraudConfig, args: DemoArgs, progress: Callable[[str], None] | None = None) -> DemoReport:
    """Run every stage in order and write ``summary.json`` and ``report.html`` under ``args.out``."""
    from fedfraud.report import write_html_report

    args.out.mkdir(parents=True, exist_ok=True)
    report = DemoReport(out=args.out)
    ctx: dict[str, Any] = {}
    for stage in STAGES:
        name = stage.__name__.removeprefix("_stage_")
        if progress:
            progress(f"[{len(report.stages) + 1}/{len(STAGES)}] {name} ...")
        t0 = time.perf_counter()
        result = stage(cfg, args, ctx)
        log.info("demo stage=%s seconds=%.2f", result.name, time.perf_counter() - t0)
        report.stages.append(result)
    (args.out / "summary.json").write_text(json.dumps(report.to_json(), indent=2, default=str), encoding="utf-8")
    write_html_report(report, args.out / "report.html")
    return report


def summary_lines(report: DemoReport) -> list[str]:
    """One line per stage, ``name (Ns): key=value ...``, for the terminal."""
    lines = []
    for s in report.stages:
        parts = []
        for key, value in s.summary.items():
            if isinstance(value, dict):
                value = ", ".join(f"{k}={v}" for k, v in value.items())
                parts.append(f"{key}=[{value}]")
            else:
                parts.append(f"{key}={value}")
        lines.append(f"{s.name:>16} ({s.seconds:5.1f}s): " + " ".join(parts))
    return lines

"""``fedfraud eval``: evaluations that need labels. ``eval stacking`` is the thesis Table 4.2 study.

``eval stacking`` trains the fraud model locally (each bank alone), federated
(Flower FedXgbBagging on Ray) and centralized, each with and without the
federated anomaly score, and prints F1 / PR-AUC / recall at 1 % FPR per bank
as a markdown block for ``docs/benchmarks.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedfraud.cli.common import config_of
from fedfraud.config import update_section

__all__ = ["eval_app", "register"]

eval_app = typer.Typer(name="eval", help="Evaluations on labelled data (print markdown for docs/benchmarks.md).",
                       no_args_is_help=True)

DataOption = Annotated[Path, typer.Option("--data", help="dataset directory (bank_<k>/...) or a Sparkov/TabFormer CSV")]
FormatOption = Annotated[str | None, typer.Option("--format", help="CSV format: sparkov, tabformer or auto")]
BanksOption = Annotated[int | None, typer.Option("--banks", min=2, help="banks to split a CSV into")]
RegistryOption = Annotated[Path, typer.Option("--registry", help="model registry holding the anomaly model")]
AnomalyVersionOption = Annotated[str, typer.Option("--anomaly-version", help="anomaly model version (or latest)")]


@eval_app.command("stacking")
def stacking(
    ctx: typer.Context,
    data: DataOption,
    fmt: FormatOption = None,
    banks: BanksOption = None,
    registry: RegistryOption = Path("artifacts"),
    anomaly_version: AnomalyVersionOption = "latest",
    rounds: Annotated[int | None, typer.Option("--rounds", min=1, help="federated rounds")] = None,
    num_cpus: Annotated[int, typer.Option("--num-cpus", min=1, max=2, help="Ray CPUs for the simulation")] = 2,
    out: Annotated[Path | None, typer.Option("--out", help="also write the markdown block here")] = None,
) -> None:
    """Local / FL / centralized fraud models with and without the anomaly score (thesis Table 4.2)."""
    from fedfraud.cli.bench import emit
    from training.fraud.pipeline import stacking_study

    cfg = update_section(config_of(ctx), "ingest", format=fmt, banks=banks)
    if rounds is not None:
        cfg = update_section(cfg, "fraud", federated_rounds=rounds)
    report = stacking_study(cfg, data, registry, anomaly_version, num_cpus=num_cpus)
    emit(report.to_markdown(), out)


def register(app: typer.Typer) -> None:
    """Attach the ``eval`` group to the root CLI."""
    app.add_typer(eval_app, name="eval")

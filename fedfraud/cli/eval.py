"""``fedfraud eval``: evaluations that need labels. ``eval stacking`` is the thesis Table 4.2 study.

``eval stacking`` trains the fraud model locally (each bank alone), federated
(histogram-based XGBoost federation) and centralized, plus federated with a
stacked score (the cross-fitted anomaly score and two controls), and prints
PR-AUC / recall at 1 % FPR / F1 with 95 % cardholder-bootstrap intervals,
pooled and per bank, as a markdown block for ``docs/benchmarks.md``.
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
    bank_shares: Annotated[
        str | None,
        typer.Option("--bank-shares", help="CSV only: cardholder share per bank, e.g. 0.3,0.25,0.2,0.2,0.05"),
    ] = None,
    registry: RegistryOption = Path("artifacts"),
    anomaly_version: AnomalyVersionOption = "latest",
    anomaly_score: Annotated[
        str, typer.Option("--anomaly-score", help="crossfit (out-of-fold AS), registry (published model) or none")
    ] = "crossfit",
    controls: Annotated[bool, typer.Option("--controls/--no-controls", help="positive and permuted controls")] = True,
    with_bagging: Annotated[bool, typer.Option("--with-bagging", help="also Flower FedXgbBagging")] = False,
    seeds: Annotated[int | None, typer.Option("--seeds", min=1, help="model seeds (default fraud.eval_seeds)")] = None,
    reps: Annotated[int | None, typer.Option("--reps", min=50, help="bootstrap replicates (cardholders)")] = None,
    rounds: Annotated[int | None, typer.Option("--rounds", min=1, help="FedXgbBagging rounds (--with-bagging)")] = None,
    num_cpus: Annotated[int, typer.Option("--num-cpus", min=1, max=2, help="Ray CPUs for the simulation")] = 2,
    out: Annotated[Path | None, typer.Option("--out", help="also write the markdown block here")] = None,
) -> None:
    """Local / FL / Central, stacked scores and controls, with 95 % cardholder-bootstrap intervals."""
    from fedfraud.cli.bench import emit
    from fedfraud.cli.common import parse_shares
    from fedfraud.training.fraud.pipeline import stacking_study

    shares = parse_shares(bank_shares)
    if shares is not None and banks is None:
        banks = len(shares)
    cfg = update_section(config_of(ctx, needs_secret=True), "ingest", format=fmt, banks=banks, bank_shares=shares)
    if rounds is not None:
        cfg = update_section(cfg, "fraud", federated_rounds=rounds)
    report = stacking_study(cfg, data, registry, anomaly_version, anomaly_source=anomaly_score, controls=controls,
                            with_bagging=with_bagging, seeds=seeds, reps=reps, num_cpus=num_cpus)
    emit(report.to_markdown(), out)


def register(app: typer.Typer) -> None:
    """Attach the ``eval`` group to the root CLI."""
    app.add_typer(eval_app, name="eval")

"""``fedfraud eval heterogeneous``: FED-SPFD against federated XGBoost, local XGBoost, FedAvg and FedPer on banks
that hold different columns (``banks.<k>.private_features``), with 95 % cardholder-bootstrap intervals.

Registered into the ``eval`` group of :mod:`fedfraud.cli.eval` (see :func:`register`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import click
import typer

from fedfraud.cli.bench import RecordOption
from fedfraud.cli.common import config_of
from fedfraud.config import update_section

__all__ = ["heterogeneous", "register"]


def heterogeneous(
    ctx: typer.Context,
    data: Annotated[Path, typer.Option("--data", help="dataset directory (bank_<k>/...) or a labelled CSV")],
    fmt: Annotated[str | None, typer.Option("--format", help="CSV format (default: ingest.format)",
                                            click_type=click.Choice(["auto", "sparkov", "tabformer"]))] = None,
    banks: Annotated[int | None, typer.Option("--banks", min=2, help="banks to split a CSV into")] = None,
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="network seeds per variant")] = 2,
    reps: Annotated[int | None, typer.Option("--reps", min=50, help="bootstrap replicates (cardholders)")] = None,
    tune: Annotated[bool, typer.Option("--tune/--no-tune", help="choose λ_alg on validation cardholders")] = True,
    rounds: Annotated[int | None, typer.Option("--rounds", min=1, help="federated rounds of the networks")] = None,
    engine: Annotated[
        str, typer.Option("--engine", help="loopback (the Flower apps in this process) or simulation (Ray)",
                          click_type=click.Choice(["loopback", "simulation"]))
    ] = "loopback",
    bank_shares: Annotated[
        str | None,
        typer.Option("--bank-shares", help="CSV only: cardholder share per bank, e.g. 0.3,0.25,0.2,0.2,0.05"),
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="also write the markdown block here")] = None,
    record: RecordOption = None,
) -> None:
    """FED-SPFD, FedAvg, FedPer, federated XGBoost (shared columns), local XGBoost (all columns): pooled and per
    bank, PR-AUC and recall@1%FPR with 95 % intervals.
    """
    from fedfraud.cli.bench import emit, start_record
    from fedfraud.cli.common import parse_shares
    from fedfraud.training.fraud.spfd.study import heterogeneous_study

    if record is not None:
        start_record(ctx, record, "")
    shares = parse_shares(bank_shares)
    if shares is not None and banks is None:
        banks = len(shares)
    cfg = update_section(config_of(ctx, needs_secret=True), "ingest", format=fmt, banks=banks, bank_shares=shares)
    spfd = cfg.fraud.spfd.model_copy(update={"engine": engine, **({"rounds": rounds} if rounds else {})})
    cfg = update_section(cfg, "fraud", spfd=spfd)
    from fedfraud.bench.records import MORE

    emit(heterogeneous_study(cfg, data, seeds=seeds, reps=reps, tune=tune).to_markdown(MORE), out)


def register(app: typer.Typer) -> None:
    """Add ``heterogeneous`` to the ``eval`` group (the group itself is attached by :mod:`fedfraud.cli.eval`)."""
    from fedfraud.cli.eval import eval_app

    eval_app.command("heterogeneous")(heterogeneous)

"""``fedfraud eval variants``: federated XGBoost, FedAvg-GNN, FedRPDA and its ablations, with 95 % intervals.

Registered into the ``eval`` group of :mod:`fedfraud.cli.eval` (see :func:`register`).
"""

from __future__ import annotations

from typing import Annotated

import typer

from fedfraud.cli.bench import OutOption, RecordOption
from fedfraud.cli.eval import (
    BankSharesOption,
    BanksOption,
    DataOption,
    EngineOption,
    FormatOption,
    RepsOption,
    study_config,
)
from fedfraud.config import update_section

__all__ = ["register", "variants"]


def variants(
    ctx: typer.Context,
    data: DataOption,
    fmt: FormatOption = None,
    banks: BanksOption = None,
    bank_shares: BankSharesOption = None,
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="GNN seeds per variant")] = 2,
    reps: RepsOption = None,
    tune: Annotated[bool, typer.Option("--tune/--no-tune", help="choose λ and α on validation cardholders")] = True,
    rounds: Annotated[int | None, typer.Option("--rounds", min=1, help="GNN federated rounds")] = None,
    engine: EngineOption = "loopback",
    hin2vec: Annotated[
        bool, typer.Option("--hin2vec/--no-hin2vec", help="also federated XGBoost + G-HIN2Vec columns (trains the "
                           "encoder federated first, a few minutes)")
    ] = True,
    out: OutOption = None,
    record: RecordOption = None,
) -> None:
    """Federated XGBoost (+ hin2vec), FedAvg-GNN, FedRPDA and each ablation: pooled and per bank, 95 % intervals."""
    from fedfraud.cli.bench import emit, start_record
    from fedfraud.training.fraud.gnn.study import variants_study

    if record is not None:
        start_record(ctx, record, "")

    cfg = study_config(ctx, fmt, banks, bank_shares)
    gnn = cfg.fraud.gnn.model_copy(update={"engine": engine, **({"rounds": rounds} if rounds else {})})
    cfg = update_section(cfg, "fraud", gnn=gnn)
    report = variants_study(cfg, data, seeds=seeds, reps=reps, tune=tune, hin2vec=hin2vec)
    from fedfraud.bench.records import MORE

    emit(report.to_markdown(MORE), out)


def register(app: typer.Typer) -> None:
    """Add ``variants`` to the ``eval`` group (the group itself is attached by :mod:`fedfraud.cli.eval`)."""
    from fedfraud.cli.eval import eval_app

    eval_app.command("variants")(variants)

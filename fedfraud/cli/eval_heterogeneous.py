"""``fedfraud eval heterogeneous``: FED-SPFD against federated XGBoost, local XGBoost, FedAvg and FedPer on banks
that hold different columns (``banks.<k>.private_features``), with 95 % cardholder-bootstrap intervals.

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
    PartitionOption,
    RepsOption,
    SkewOption,
    study_config,
)
from fedfraud.config import update_section

__all__ = ["heterogeneous", "register"]


def heterogeneous(
    ctx: typer.Context,
    data: DataOption,
    fmt: FormatOption = None,
    banks: BanksOption = None,
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="network seeds per variant")] = 2,
    reps: RepsOption = None,
    tune: Annotated[bool, typer.Option("--tune/--no-tune", help="choose λ_alg on validation cardholders")] = True,
    rounds: Annotated[int | None, typer.Option("--rounds", min=1, help="federated rounds of the networks")] = None,
    engine: EngineOption = "loopback",
    bank_shares: BankSharesOption = None,
    skew: SkewOption = False,
    partition: PartitionOption = None,
    out: OutOption = None,
    record: RecordOption = None,
) -> None:
    """FED-SPFD, FedAvg, FedPer, federated XGBoost (shared columns), local XGBoost (all columns): pooled and per
    bank, PR-AUC and recall@1%FPR with 95 % intervals.
    """
    from fedfraud.cli.bench import emit, start_record
    from fedfraud.training.fraud.spfd.study import heterogeneous_study

    if record is not None:
        start_record(ctx, record, "")
    cfg = study_config(ctx, fmt, banks, bank_shares, skew, partition)
    spfd = cfg.fraud.spfd.model_copy(update={"engine": engine, **({"rounds": rounds} if rounds else {})})
    cfg = update_section(cfg, "fraud", spfd=spfd)
    from fedfraud.bench.records import MORE

    emit(heterogeneous_study(cfg, data, seeds=seeds, reps=reps, tune=tune).to_markdown(MORE), out)


def register(app: typer.Typer) -> None:
    """Add ``heterogeneous`` to the ``eval`` group (the group itself is attached by :mod:`fedfraud.cli.eval`)."""
    from fedfraud.cli.eval import eval_app

    eval_app.command("heterogeneous")(heterogeneous)

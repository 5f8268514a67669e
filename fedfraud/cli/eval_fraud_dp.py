"""``fedfraud eval fraud-dp``: the fraud model with and without cardholder-level DP, in one run, 95 % intervals.

Registered into the ``eval`` group of :mod:`fedfraud.cli.eval` (see :func:`register`).
"""

from __future__ import annotations

from typing import Annotated

import typer

from fedfraud.cli.bench import OutOption, RecordOption
from fedfraud.cli.eval import BankSharesOption, BanksOption, DataOption, FormatOption, RepsOption, study_config

__all__ = ["fraud_dp", "register"]


def _epsilons(text: str) -> list[float]:
    from fedfraud.core.errors import UserError

    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"--epsilons {text!r}: give positive numbers separated by commas, e.g. 1,3,8") from None
    if not values or any(not v > 0 for v in values):
        raise UserError(f"--epsilons {text!r}: give positive numbers separated by commas, e.g. 1,3,8")
    return values


def fraud_dp(
    ctx: typer.Context,
    data: DataOption,
    fmt: FormatOption = None,
    banks: BanksOption = None,
    bank_shares: BankSharesOption = None,
    epsilons: Annotated[str, typer.Option("--epsilons", help="ε per cardholder of the DP models, comma-separated")
                        ] = "1,3,8",
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="draws of the random trees and their noise per ε")] = 3,
    reps: RepsOption = None,
    out: OutOption = None,
    record: RecordOption = None,
) -> None:
    """Federated XGBoost against the DP variant (random trees, noised leaf sums under SecAgg+) at each ε and
    without noise: PR-AUC and recall@1%FPR, paired differences, each model's (ε, δ).
    """
    from fedfraud.cli.bench import emit, start_record
    from fedfraud.training.fraud.dp_study import dp_study

    eps = _epsilons(epsilons)
    if banks is not None and banks < 3:
        from fedfraud.core.errors import UserError

        raise UserError(f"--banks {banks}: the DP models need at least 3 banks (SecAgg+ sums a majority of them)")
    if record is not None:
        start_record(ctx, record, "")
    cfg = study_config(ctx, fmt, banks, bank_shares)
    report = dp_study(cfg, data, eps, seeds=seeds, reps=reps)
    from fedfraud.bench.records import MORE

    emit(report.to_markdown(MORE), out)


def register(app: typer.Typer) -> None:
    """Add ``fraud-dp`` to the ``eval`` group (the group itself is attached by :mod:`fedfraud.cli.eval`)."""
    from fedfraud.cli.eval import eval_app

    eval_app.command("fraud-dp")(fraud_dp)

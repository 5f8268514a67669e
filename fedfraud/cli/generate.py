"""``fedfraud generate``: a seeded synthetic multi-bank dataset with labelled fraud scenarios."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedfraud.cli.common import config_of
from fedfraud.config import update_section


def register(app: typer.Typer) -> None:
    """Add the ``generate`` command to ``app``."""

    @app.command("generate")
    def generate(
        ctx: typer.Context,
        out: Annotated[Path, typer.Option("--out", "-o", help="dataset directory to write")] = Path("data/synthetic"),
        banks: Annotated[int | None, typer.Option("--banks", help="number of banks")] = None,
        cardholders: Annotated[int | None, typer.Option("--cardholders", help="number of cardholders")] = None,
        days: Annotated[int | None, typer.Option("--days", help="days of activity")] = None,
        seed: Annotated[int | None, typer.Option("--seed", help="random seed (same seed, same bytes)")] = None,
        fraud_rate: Annotated[
            float | None, typer.Option("--fraud-rate", help="share of fraudulent transactions")
        ] = None,
        raw_csv: Annotated[bool, typer.Option("--raw-csv/--no-raw-csv", help="also write raw/transactions.csv")] = True,
    ) -> None:
        """Generate a synthetic multi-bank dataset (canonical parquet per bank, labels, manifest)."""
        from fedfraud.training.data.synthetic import generate_dataset

        cfg = update_section(config_of(ctx), "generate", banks=banks, cardholders=cardholders, days=days, seed=seed,
                             fraud_rate=fraud_rate)
        report = generate_dataset(out, cfg.generate, raw_csv=raw_csv, banks_layout=cfg.banks)
        rate = report.fraud / report.transactions if report.transactions else 0.0
        typer.echo(f"wrote {out}: {report.transactions} transactions, {report.fraud} fraud ({rate:.2%}), "
                   f"{len(report.per_bank)} banks in {report.seconds:.1f}s")
        for bank, rows in sorted(report.per_bank.items()):
            typer.echo(f"  bank_{bank}: {rows} transactions")
        typer.echo("  scenarios: " + ", ".join(f"{k}={v}" for k, v in sorted(report.scenarios.items())))
        if report.raw_csv is not None:
            typer.echo(f"  raw Sparkov CSV: {report.raw_csv}")

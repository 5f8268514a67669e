"""``fedfraud ingest``: a Sparkov/Kaggle or TabFormer CSV into a canonical multi-bank dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import click
import typer

from fedfraud.cli.common import config_of, parse_shares, readable_file
from fedfraud.config import update_section


def register(app: typer.Typer) -> None:
    """Add the ``ingest`` command to ``app``."""

    @app.command("ingest")
    def ingest(
        ctx: typer.Context,
        path: Annotated[Path, typer.Argument(help="CSV file: Sparkov pipe, Kaggle fraudTrain.csv or TabFormer")],
        out: Annotated[Path, typer.Option("--out", "-o", help="dataset directory to write")] = Path("data/ingested"),
        fmt: Annotated[str | None, typer.Option("--format", help="CSV format; auto: by header (default: ingest.format)",
                                                click_type=click.Choice(["auto", "sparkov", "tabformer"]))] = None,
        banks: Annotated[int | None, typer.Option("--banks", help="number of banks")] = None,
        partition: Annotated[
            str | None, typer.Option("--partition", help="hash (IID by cardholder) or region (non-IID by home state)")
        ] = None,
        chunk_rows: Annotated[int | None, typer.Option("--chunk-rows", help="rows per chunk (bounds memory)")] = None,
        bank_shares: Annotated[
            str | None, typer.Option("--bank-shares", help="share of cardholders per bank, e.g. 0.3,0.25,0.2,0.2,0.05")
        ] = None,
    ) -> None:
        """Validate a transaction CSV and write it as per-bank canonical parquet plus rejects and manifest."""
        from fedfraud.training.data.ingest import ingest_csv
        from fedfraud.feature_store.layout import REJECTS_FILE

        readable_file(path)
        shares = parse_shares(bank_shares)
        if shares is not None and banks is None:
            banks = len(shares)
        cfg = update_section(config_of(ctx), "ingest", format=fmt, banks=banks, partition=partition,
                             chunk_rows=chunk_rows, bank_shares=shares)
        report = ingest_csv(path, out, cfg.ingest, banks_layout=cfg.banks)
        if cfg.ingest.skew is not None:  # a labelled study's skewed banks (--set ingest.skew=[low,high])
            from fedfraud.training.data.skew import skew_dataset

            for r in skew_dataset(out, *cfg.ingest.skew):
                typer.echo(f"  skew bank_{r.bank}: fraud rate {100 * r.rate_before:.2f} % -> {100 * r.rate:.2f} % "
                           f"(target {100 * r.target:.2f} %), rows {r.rows_before} -> {r.rows}, cardholders "
                           f"{r.cardholders_before} -> {r.cardholders} ({r.cleaned} cleaned, {r.dropped} dropped)")
        typer.echo(f"ingested {path} ({report.format}) into {out}: accepted={report.accepted} "
                   f"rejected={report.rejected} in {report.seconds:.1f}s ({report.rows_per_s:,.0f} rows/s)")
        for bank, rows in sorted(report.per_bank.items()):
            typer.echo(f"  bank_{bank}: {rows} accepted")
        if report.rejected:
            reasons = ", ".join(f"{k}={v}" for k, v in report.rejects_by_reason.items())
            typer.echo(f"  rejected by reason: {reasons} (see {out / REJECTS_FILE})")

"""``fedfraud score``: batch scoring and backtesting of a CSV or an ingested dataset with registered models."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedfraud.cli.common import config_of


def register(app: typer.Typer) -> None:
    """Add the ``score`` command to ``app``."""

    @app.command("score")
    def score(
        ctx: typer.Context,
        path: Annotated[Path, typer.Argument(help="CSV (any format `ingest` reads) or an ingested dataset directory")],
        registry: Annotated[Path, typer.Option("--registry", help="model registry (the --out of `train`)")] = Path(
            "artifacts"
        ),
        out: Annotated[Path, typer.Option("--out", "-o", help="output file, .csv or .parquet")] = Path(
            "out/scores.parquet"
        ),
        bank: Annotated[int, typer.Option("--bank", help="whose secret keys a CSV's pseudonyms and noise", min=0)] = 0,
        chunk_rows: Annotated[
            int, typer.Option("--chunk-rows", help="rows per scoring chunk (bounds memory)", min=1)
        ] = 50_000,
        workers: Annotated[int, typer.Option("--workers", help="scoring processes (one per core)", min=1)] = 1,
    ) -> None:
        """Score every transaction: anomaly score; fraud score, decision and reasons when a fraud model exists."""
        from fedfraud.serving.batch import score_path
        from fedfraud.serving.graph_fraud import fraud_kind

        cfg = config_of(ctx, needs_secret=True)
        report = score_path(
            path, registry, out, bank=bank, privacy_cfg=cfg.privacy, chunk_rows=chunk_rows, workers=workers,
            fraud_kind=fraud_kind(cfg.fraud.variant),
        )
        models = ", ".join(f"{k}={v}" for k, v in report.models.items())
        typer.echo(
            f"scored {report.rows:,} transactions of {path} into {out} ({models}) in {report.seconds:.1f}s "
            f"({report.rows_per_s:,.0f} tx/s); {report.rows - report.scored:,} without an anomaly score "
            "(a cardholder's first transaction)"
        )
        if report.rejected:
            typer.echo(f"  rejected {report.rejected:,} rows with reasons: see {report.rejects_path}")

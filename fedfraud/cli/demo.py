"""``fedfraud demo``: the main job end to end on embedded defaults, with a summary and an HTML report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedfraud.cli.common import config_of
from fedfraud.core.errors import UserError


def register(app: typer.Typer) -> None:
    """Add the ``demo`` command to ``app``."""

    @app.command("demo")
    def demo(
        ctx: typer.Context,
        out: Annotated[Path, typer.Option("--out", "-o", help="folder for data, models and the report")] = Path(
            "out/demo"
        ),
        cardholders: Annotated[int, typer.Option(help="cardholders to generate")] = 800,
        days: Annotated[int, typer.Option(help="days of activity")] = 30,
        banks: Annotated[int, typer.Option(help="number of banks")] = 5,
        seed: Annotated[int, typer.Option(help="random seed")] = 7,
        holdout_days: Annotated[float, typer.Option(help="last days streamed live instead of trained on")] = 7.0,
        rounds: Annotated[int, typer.Option(help="federated rounds of the anomaly model")] = 8,
        rate: Annotated[float, typer.Option(help="offered stream load in tx/s (0: as fast as possible)")] = 250.0,
        console: Annotated[bool, typer.Option(
            "--console/--no-console", help="serve the analyst's console on the demo's stream while it runs")] = True,
        console_port: Annotated[int, typer.Option(
            help="the console's port on 127.0.0.1 (taken, or 0: a free one)")] = 8600,
        hold_console: Annotated[bool, typer.Option(
            "--hold-console", help="keep the console and the demo's broker up after the run, until Ctrl-C")] = False,
    ) -> None:
        """Generate → ingest → hold out → private features → train anomaly (Flower) → train fraud →
        Feast → serve (Ray Serve + Kafka) → stream the held-out tail → summary and HTML report.
        """
        from fedfraud.demo import DemoArgs, run_demo, summary_lines

        try:
            args = DemoArgs(
                out=out,
                cardholders=cardholders,
                days=days,
                banks=banks,
                seed=seed,
                holdout_days=holdout_days,
                rounds=rounds,
                stream_rate=rate,
                console=console,
                console_port=console_port,
                hold_console=hold_console,
            )
        except ValueError as exc:
            raise UserError(str(exc)) from None
        report = run_demo(config_of(ctx), args, progress=typer.echo)
        try:
            typer.echo("")
            for line in summary_lines(report):
                typer.echo(line)
            typer.echo(f"\ntotal {report.seconds:.1f}s; report: {out / 'report.html'}; summary: {out / 'summary.json'}")
            for line in report.console:
                typer.echo(line)
        except BaseException:
            if report.live is not None:
                report.live.close()
            raise
        if report.live is not None:
            report.live.hold()  # --hold-console: until Ctrl-C; then the console and the broker stop

"""``fedfraud retrain run | schedule | evaluate`` and ``fedfraud labels join``: the retraining loop.

A bank's ML engineer runs, in this order of a day:

* ``fedfraud labels join`` (a service): labels, decisions and shadow scores into the bank's outcome store;
* ``fedfraud retrain schedule`` (a service): cycles on the cron schedule and on drift, the policy on a timer;
* ``fedfraud retrain run`` for one cycle by hand, ``fedfraud retrain evaluate`` for the policy's verdict now.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from fedfraud.cli.common import config_of, existing_dir, kafka_reachable
from fedfraud.config import update_section
from fedfraud.core.errors import UserError

__all__ = ["register"]

retrain_app = typer.Typer(name="retrain", help="Federated retraining cycles, their schedule and the promotion "
                          "policy.", no_args_is_help=True)
labels_app = typer.Typer(name="labels", help="Labels coming back from the bank (the fraud-labels topic).",
                         no_args_is_help=True)

DataOption = Annotated[Path, typer.Option("--data", help="the banks' offline stores (bank_<k>/transactions.parquet, "
                                                       "labels in bank_<k>/outcomes.sqlite)")]
RegistryOption = Annotated[
    Path | None, typer.Option("--registry", help="model registry (default: serving.registry_root)")]


def _outcomes(cfg, data: Path, outcomes: Path | None) -> Path:  # noqa: ANN001 - FedfraudConfig
    from fedfraud.feature_store.outcomes import OUTCOMES_FILE
    from fedfraud.feature_store.layout import bank_dir

    return outcomes or bank_dir(data, cfg.serving.bank_id) / OUTCOMES_FILE


@retrain_app.command("run")
def run(
    ctx: typer.Context,
    data: DataOption,
    registry: RegistryOption = None,
    window_days: Annotated[float | None, typer.Option("--window-days", min=0.01, help="days of history")] = None,
    rounds: Annotated[int | None, typer.Option("--rounds", min=1, help="federated rounds of the anomaly GNN")] = None,
    trigger: Annotated[str, typer.Option("--trigger", help="why this cycle runs (kept in the audit log)")] = "manual",
    as_json: Annotated[bool, typer.Option("--json", help="print the result as one JSON line")] = False,
) -> None:
    """One federated cycle (anomaly GNN, then fraud model) on the window; both registered as challenger."""
    from fedfraud.training.retrain.cycle import run_cycle

    cfg = update_section(config_of(ctx, needs_secret=True), "retrain", window_days=window_days, rounds=rounds)
    existing_dir(data, "data directory")
    result = run_cycle(cfg, data, registry or Path(cfg.serving.registry_root), trigger=trigger)
    if as_json:
        typer.echo(json.dumps(asdict(result)))
    else:
        typer.echo(f"cycle {result.cycle}: challenger anomaly={result.anomaly} fraud={result.fraud} "
                   f"rows={result.rows} frauds={result.frauds} labels_used={result.labels_used} "
                   f"seconds={result.seconds}")


@retrain_app.command("schedule")
def schedule(
    ctx: typer.Context,
    data: DataOption,
    registry: RegistryOption = None,
    outcomes: Annotated[Path | None, typer.Option("--outcomes", help="the serving bank's outcome store")] = None,
    cron: Annotated[str | None, typer.Option("--cron", help="crontab expression, UTC (default: retrain.schedule)")]
    = None,
    metrics_url: Annotated[
        str | None, typer.Option("--metrics-url", help="serving's /metrics, for the drift trigger")] = None,
) -> None:
    """Run cycles on the cron schedule and on drift, and the promotion policy, until interrupted."""
    from fedfraud.training.retrain.schedule import RetrainScheduler

    cfg = update_section(config_of(ctx, needs_secret=True), "retrain", schedule=cron, metrics_url=metrics_url)
    existing_dir(data, "data directory")
    scheduler = RetrainScheduler(cfg, data, registry or Path(cfg.serving.registry_root),
                                 _outcomes(cfg, data, outcomes)).start()
    typer.echo(f"retrain scheduler: cron {cfg.retrain.schedule!r} (next {scheduler.next_run()}), drift trigger "
               f"{'on ' + cfg.retrain.metrics_url if cfg.retrain.metrics_url else 'off'}; Ctrl-C stops")
    try:
        threading.Event().wait()
    finally:
        scheduler.shutdown()


@retrain_app.command("evaluate")
def evaluate(
    ctx: typer.Context,
    data: DataOption,
    registry: RegistryOption = None,
    outcomes: Annotated[Path | None, typer.Option("--outcomes", help="the serving bank's outcome store")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="report the verdict without moving aliases")] = False,
) -> None:
    """Challenger vs champion on the labelled outcomes: promote, keep (retire the challenger) or wait."""
    from fedfraud.training.retrain.policy import decide_promotion

    cfg = config_of(ctx, needs_secret=True)
    store = _outcomes(cfg, data, outcomes)
    if not store.exists():
        raise UserError(f"no outcome store at {store}: run `fedfraud labels join` first")
    decision = decide_promotion(registry or Path(cfg.serving.registry_root), store, cfg.retrain, actor="cli",
                                apply=not dry_run)
    typer.echo(f"{decision.action}: {decision.reason}")


@labels_app.command("join")
def join(
    ctx: typer.Context,
    outcomes: Annotated[Path, typer.Option("--outcomes", help="the bank's outcome store (SQLite file)")],
    bootstrap_servers: Annotated[
        str | None, typer.Option("--bootstrap-servers", help="Kafka (default: serving.bootstrap_servers)")] = None,
    idle_s: Annotated[
        float | None, typer.Option("--idle-s", min=0, help="stop once caught up and idle this long (default: run "
                                   "until interrupted)")] = None,
) -> None:
    """Join fraud-labels to the bank's decisions and shadow scores, exactly once per transaction id."""
    from fedfraud.feature_store.outcomes import OutcomeStore
    from fedfraud.serving.labels import LabelJoiner

    cfg = config_of(ctx, needs_secret=True)
    bootstrap = bootstrap_servers or cfg.serving.bootstrap_servers
    if bootstrap is None:
        raise UserError("no Kafka to read labels from: pass --bootstrap-servers")
    kafka_reachable(bootstrap)
    with OutcomeStore(outcomes) as store:
        joiner = LabelJoiner(bootstrap, store, cfg.serving.topics, cfg.serving.producer,
                             cfg.serving.guards.max_message_bytes, security=cfg.serving.kafka_security)
        try:
            stats = joiner.run(idle_s=idle_s)
        finally:
            joiner.close()
    typer.echo(f"labels={stats.labels} duplicate_labels={stats.duplicate_labels} decisions={stats.decisions} "
               f"shadow={stats.shadow} dead_lettered={stats.dead_lettered}")


def register(app: typer.Typer) -> None:
    """Attach the ``retrain`` and ``labels`` groups to the root CLI."""
    app.add_typer(retrain_app, name="retrain")
    app.add_typer(labels_app, name="labels")

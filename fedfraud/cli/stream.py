"""``fedfraud stream``: replay transactions into Kafka in timestamp order at a fixed rate."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedfraud.cli.common import config_of, kafka_reachable
from fedfraud.core.errors import UserError

__all__ = ["register"]


def stream_command(
    ctx: typer.Context,
    source: Annotated[Path, typer.Option("--data", "--source",
                                         help="dataset folder (bank_<k>/transactions.parquet) or CSV (--source: "
                                              "its old name)")],
    rate: Annotated[float, typer.Option("--rate", min=0, help="messages per second; 0 = as fast as possible")] = 0.0,
    bootstrap_servers: Annotated[
        str | None, typer.Option("--bootstrap-servers", help="Kafka cluster (default: serving.bootstrap_servers)")
    ] = None,
    bank: Annotated[int | None, typer.Option("--bank", help="replay only this bank of a dataset folder")] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="first N transactions only")] = None,
    labels_delay_days: Annotated[
        float | None, typer.Option("--labels-delay-days", min=0,
                                   help="also send each row's is_fraud to the labels topic this many event-time "
                                        "days after it (a chargeback feed)")
    ] = None,
    no_label_flush: Annotated[
        bool, typer.Option("--no-label-flush", help="drop the labels not yet due when the replay ends")
    ] = False,
) -> None:
    """Produce transactions keyed by pseudonymous cardholder, stamping the produce time for latency."""
    from fedfraud.feature_store.privacy import PrivateFeaturizer
    from fedfraud.serving.replay import LabelFeed, load_source, replay

    cfg = config_of(ctx, needs_secret=True)
    bootstrap = bootstrap_servers or cfg.serving.bootstrap_servers
    if bootstrap is None:
        raise UserError("no Kafka to stream to: pass --bootstrap-servers (fedfraud serve prints the embedded one)")
    frame = load_source(source, bank)
    kafka_reachable(bootstrap)
    if limit is not None:
        frame = frame.head(limit)
    featurizer = PrivateFeaturizer.for_bank(cfg.encoder, cfg.privacy, cfg.serving.bank_id)
    feed = None
    if labels_delay_days is not None:
        feed = LabelFeed(cfg.serving.topics.labels, labels_delay_days * 86_400.0, flush=not no_label_flush)
    stats = replay(frame, bootstrap, cfg.serving.topics.transactions, featurizer, rate, cfg.serving.producer,
                   labels=feed, security=cfg.serving.kafka_security)
    labelled = f", {stats.labels_sent} labels to {feed.topic}" if feed is not None else ""
    typer.echo(f"sent {stats.sent} transactions in {stats.seconds:.1f}s ({stats.rate:.0f}/s) to {bootstrap}{labelled}")


def register(app: typer.Typer) -> None:
    """Attach ``stream`` to the root CLI."""
    app.command("stream")(stream_command)

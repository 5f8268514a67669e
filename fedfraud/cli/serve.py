"""``fedfraud serve``: the streaming scorer (Ray Serve + Kafka), until Ctrl-C."""

from __future__ import annotations

import logging
import time
from typing import Annotated

import typer

from fedfraud.cli.common import config_of

__all__ = ["register"]

log = logging.getLogger(__name__)


def serve_command(
    ctx: typer.Context,
    bootstrap_servers: Annotated[
        str | None,
        typer.Option("--bootstrap-servers", help="Kafka cluster; omitted: start the embedded Tansu broker"),
    ] = None,
    registry: Annotated[str | None, typer.Option("--registry", help="model registry folder")] = None,
    port: Annotated[int | None, typer.Option("--port", help="HTTP port of /score, /healthz, /metrics")] = None,
    no_consume: Annotated[bool, typer.Option("--no-consume", help="HTTP only, do not read Kafka")] = False,
) -> None:
    """Score the ``transactions`` topic (and POST /score) with the registry's latest models; Ctrl-C stops."""
    from fedfraud.config import update_section
    from serving.runtime import start

    cfg = update_section(config_of(ctx), "serving", registry_root=registry, http_port=port,
                         bootstrap_servers=bootstrap_servers)
    rt = start(cfg, consume=not no_consume)
    where = f"embedded Tansu broker at {rt.bootstrap_servers}" if rt.embedded else f"Kafka at {rt.bootstrap_servers}"
    typer.echo(f"serving: {where}; HTTP {rt.url} (/score /healthz /metrics); Ctrl-C to stop", err=True)
    try:
        while True:
            time.sleep(10)
            log.info("serving %s", " ".join(f"{k}={v}" for k, v in rt.counters().items()))
    except KeyboardInterrupt:
        typer.echo("stopping", err=True)
    finally:
        rt.stop()


def register(app: typer.Typer) -> None:
    """Attach ``serve`` to the root CLI."""
    app.command("serve")(serve_command)

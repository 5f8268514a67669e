"""``fedfraud console``: the analyst's web console (queue, case view, labels, models), until Ctrl-C."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Annotated

import typer

from fedfraud.cli.common import config_of, kafka_reachable
from fedfraud.core.errors import UserError

__all__ = ["register"]

log = logging.getLogger(__name__)


def console_command(
    ctx: typer.Context,
    bootstrap_servers: Annotated[
        str | None,
        typer.Option("--bootstrap-servers", help="Kafka cluster the scorer writes to (default: "
                     "serving.bootstrap_servers; the address `fedfraud serve` printed for its embedded broker)"),
    ] = None,
    registry: Annotated[Path | None, typer.Option("--registry", help="model registry folder (default: "
                                                  "serving.registry_root)")] = None,
    repo: Annotated[Path | None, typer.Option("--repo", help="applied Feast repo of the bank (default: "
                                              "features.repo_dir)")] = None,
    host: Annotated[str, typer.Option("--host", help="address to listen on (loopback by default)")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="HTTP port")] = 8600,
    audit_log: Annotated[Path, typer.Option("--audit-log", help="JSON-lines log of every label given")] = Path(
        "out/console/audit.jsonl"),
    history: Annotated[
        int | None, typer.Option("--history", min=1, help="index only the last N records of each partition "
                                 "(default: everything the topics hold)")
    ] = None,
) -> None:
    """Serve the analyst's console: decisions from ``fraud-decisions``, cases, "Fraud"/"Genuine" labels to
    ``fraud-labels``, and the registry's models. Needs the scorer's API token ($FEDFRAUD_API_TOKEN or
    serving.auth.token_file); Ctrl-C stops.
    """
    from fedfraud.console.runtime import ConsoleServer, close_console, console_token, open_console
    from fedfraud.core.net import is_loopback

    cfg = config_of(ctx, needs_secret=True)
    token = console_token(cfg)  # before anything starts: no token, one line
    bootstrap = bootstrap_servers or cfg.serving.bootstrap_servers
    if not bootstrap:
        raise UserError("no Kafka to read: give --bootstrap-servers (the address `fedfraud serve` printed) or set "
                        "serving.bootstrap_servers")
    kafka_reachable(bootstrap)
    if registry is not None and not registry.is_dir():
        raise UserError(f"--registry {registry}: no such folder")
    if repo is not None and not repo.is_dir():
        raise UserError(f"--repo {repo}: no such folder")
    if audit_log.exists() and audit_log.is_dir():
        raise UserError(f"--audit-log {audit_log}: is a directory")
    if not is_loopback(host):
        log.warning("console listening on %s: plain HTTP; put TLS in front of it (docs/console.md)", host)
    console = open_console(cfg, bootstrap, audit_log, registry, repo, history, token=token)
    try:
        server = ConsoleServer(console, host, port).start()
    except BaseException:
        close_console(console)
        raise
    counts = console.index.counts()
    typer.echo(f"console: {server.url}/ ({counts['decisions']} decisions indexed from {bootstrap}; bearer token "
               f"or log in with it; audit log {audit_log}); Ctrl-C to stop", err=True)
    try:
        while True:
            time.sleep(10)
    except KeyboardInterrupt:
        typer.echo("stopping", err=True)
    finally:
        server.stop()
        close_console(console)


def register(app: typer.Typer) -> None:
    """Attach ``console`` to the root CLI."""
    app.command("console")(console_command)

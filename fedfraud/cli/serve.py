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
    port: Annotated[int | None, typer.Option(
        "--port", help="HTTP port of /score, /healthz, /readyz, /metrics (serving.http_port)")] = None,
    no_consume: Annotated[bool, typer.Option("--no-consume", help="HTTP only, do not read Kafka")] = False,
    insecure_no_auth: Annotated[bool, typer.Option(
        "--insecure-no-auth", help="local development only: /score and /metrics without a token")] = False,
) -> None:
    """Score the ``transactions`` topic (and POST /score) with the registry's latest models; Ctrl-C stops.

    /score and /metrics need ``Authorization: Bearer $FEDFRAUD_API_TOKEN`` (or the token in
    ``serving.auth.token_file``); without a token configured the command refuses to start.
    """
    from fedfraud.config import update_section
    from fedfraud.serving.runtime import start

    cfg = config_of(ctx, needs_secret=True)
    no_auth = cfg.serving.auth.model_copy(update={"disabled": True}) if insecure_no_auth else None
    cfg = update_section(cfg, "serving", registry_root=registry, http_port=port, bootstrap_servers=bootstrap_servers,
                         auth=no_auth)
    rt = start(cfg, consume=not no_consume)
    where = f"embedded Tansu broker at {rt.bootstrap_servers}" if rt.embedded else f"Kafka at {rt.bootstrap_servers}"
    auth = "NO AUTHENTICATION (--insecure-no-auth)" if rt.token is None else "bearer token on /score and /metrics"
    direct = (f" → direct ingress {' '.join(rt.direct_urls()) or '(no replica port yet)'}, Serve proxy on "
              f"{rt.proxy_url} as fallback" if rt.front is not None else "")
    typer.echo(f"serving: {where}; HTTP {rt.url}{direct} (/score /healthz /readyz /metrics; {auth}); Ctrl-C to "
               "stop", err=True)
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

"""``fedfraud doctor``: an operator's one-line-per-check review of a deployment (fedfraud/doctor.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from fedfraud.cli.common import config_of, existing_dir

__all__ = ["register"]

#: The repository's manifests, checked when the command runs in a checkout and no --manifests is given.
DEFAULT_MANIFESTS = Path("infra/k8s")


def doctor_command(
    ctx: typer.Context,
    pid: Annotated[list[int] | None, typer.Option(
        "--pid", help="a running `fedfraud serve` whose process tree's sockets to list (repeatable); default: "
        "every `fedfraud serve` found on this machine")] = None,
    manifests: Annotated[Path | None, typer.Option(
        "--manifests", help="Kubernetes manifests whose images to check (default: ./infra/k8s if present)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per check instead of lines")] = False,
) -> None:
    """Check the config in force for open listeners, missing secrets, plaintext transports, disabled
    authentication and unpinned images; one line per check, exit 1 when any check fails.
    """
    from fedfraud.doctor import run_checks

    cfg = config_of(ctx)
    folder = existing_dir(manifests, "--manifests") if manifests is not None else (
        DEFAULT_MANIFESTS if DEFAULT_MANIFESTS.is_dir() else None)
    checks = run_checks(cfg, folder, pid)
    for check in checks:
        typer.echo(json.dumps(check.as_dict()) if as_json else check.line())
    failed = sum(c.status == "fail" for c in checks)
    if not as_json:
        warned = sum(c.status == "warn" for c in checks)
        typer.echo(f"{len(checks)} checks: {failed} failed, {warned} warnings", err=True)
    raise typer.Exit(1 if failed else 0)


def register(app: typer.Typer) -> None:
    """Attach ``doctor`` to the root CLI."""
    app.command("doctor")(doctor_command)

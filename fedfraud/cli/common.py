"""Helpers shared by subcommands: config access and path checks that fail with one line."""

from __future__ import annotations

from pathlib import Path

import typer

from fedfraud.config import FedfraudConfig
from fedfraud.core.errors import UserError


def config_of(ctx: typer.Context, needs_secret: bool = False) -> FedfraudConfig:
    """The config loaded by the root callback.

    ``needs_secret``: the command pseudonymizes, noises or serves, so it refuses to start (one line naming
    the variable) unless a bank secret or a simulation secret is set; there is no default secret.
    """
    cfg = ctx.find_root().obj
    if not isinstance(cfg, FedfraudConfig):
        raise UserError("internal: configuration was not loaded")
    if needs_secret:
        import os

        from fedfraud.feature_store.privacy import SIMULATION_SECRET_ENV, require_secret

        require_secret(cfg.privacy)
        if cfg.privacy.secret_seed and not os.environ.get(SIMULATION_SECRET_ENV, "").strip():
            # Flower's ClientApps, Ray workers and retrain children see the run config, not this object
            os.environ[SIMULATION_SECRET_ENV] = cfg.privacy.secret_seed
    return cfg


def readable_file(path: Path) -> Path:
    """Return ``path`` if it is a non-empty readable file, else raise a one-line :class:`UserError`."""
    if not path.exists():
        raise UserError(f"{path}: no such file")
    if path.is_dir():
        raise UserError(f"{path}: is a directory, expected a file")
    try:
        with path.open("rb") as fh:
            if not fh.read(1):
                raise UserError(f"{path}: file is empty")
    except PermissionError:
        raise UserError(f"{path}: not readable (permission denied)") from None
    return path


def existing_dir(path: Path, what: str = "directory") -> Path:
    """Return ``path`` if it is an existing directory, else raise a one-line :class:`UserError`."""
    if not path.exists():
        raise UserError(f"{what} {path} does not exist")
    if not path.is_dir():
        raise UserError(f"{what} {path} is not a directory")
    return path


def parse_shares(text: str | None) -> tuple[float, ...] | None:
    """``"0.3,0.25,0.2,0.2,0.05"`` → a tuple of bank shares, or a one-line :class:`UserError`."""
    if text is None:
        return None
    try:
        shares = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise UserError(f"--bank-shares {text!r}: expected comma-separated numbers such as 0.5,0.5") from None
    if len(shares) < 2 or any(s <= 0 for s in shares) or abs(sum(shares) - 1.0) > 1e-6:
        raise UserError(f"--bank-shares {text!r}: need at least 2 positive shares that sum to 1")
    return shares


def kafka_reachable(bootstrap: str, timeout_s: float = 3.0) -> None:
    """One-line error unless some bootstrap server accepts a TCP connection (the Kafka client waits ~30 s)."""
    import socket

    for server in bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        if not port.isdigit():
            raise UserError(f"--bootstrap-servers {bootstrap!r}: expected host:port[,host:port]")
        try:
            with socket.create_connection((host.strip("[]") or "localhost", int(port)), timeout=timeout_s):
                return
        except OSError:
            continue
    raise UserError(f"no Kafka broker reachable at {bootstrap} (is it running? check --bootstrap-servers)")

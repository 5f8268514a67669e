"""Helpers shared by subcommands: config access and path checks that fail with one line."""

from __future__ import annotations

from pathlib import Path

import typer

from fedfraud.config import FedfraudConfig
from fedfraud.errors import UserError


def config_of(ctx: typer.Context) -> FedfraudConfig:
    """The config loaded by the root callback."""
    cfg = ctx.find_root().obj
    if not isinstance(cfg, FedfraudConfig):
        raise UserError("internal: configuration was not loaded")
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

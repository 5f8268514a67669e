"""Logging set-up for the CLI; library modules only call ``logging.getLogger``."""

from __future__ import annotations

import logging
import sys


def configure_logging(level: str = "INFO") -> None:
    """Send ``key=value`` style log lines to stderr at ``level``."""
    numeric = getattr(logging, level.upper(), None)
    if not isinstance(numeric, int):
        from fedfraud.errors import UserError

        raise UserError(f"unknown log level {level!r}; use DEBUG, INFO, WARNING or ERROR")
    logging.basicConfig(
        level=numeric,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )
    # Third-party libraries are chatty at INFO; keep them at WARNING.
    for noisy in ("ray", "flwr", "feast", "kafka", "urllib3", "filelock", "numexpr", "matplotlib", "PIL"):
        logging.getLogger(noisy).setLevel(max(numeric, logging.WARNING))

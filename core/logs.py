"""Logging set-up for the CLI; library modules only call ``logging.getLogger``."""

from __future__ import annotations

import logging
import sys


class _CurrentStderr(logging.StreamHandler):
    """A stream handler that writes to whatever ``sys.stderr`` is when a record is emitted.

    ``logging.StreamHandler`` keeps the stream it was given: after a caller (a
    test's capture, a notebook) swaps ``sys.stderr`` and closes the old one,
    every later record failed with "--- Logging error ---".
    """

    @property  # type: ignore[override]
    def stream(self):  # noqa: ANN201 - a text stream
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def configure_logging(level: str = "INFO") -> None:
    """Send ``key=value`` style log lines to stderr at ``level``."""
    numeric = getattr(logging, level.upper(), None)
    if not isinstance(numeric, int):
        from fedfraud.core.errors import UserError

        raise UserError(f"unknown log level {level!r}; use DEBUG, INFO, WARNING or ERROR")
    logging.basicConfig(
        level=numeric,
        handlers=[_CurrentStderr()],
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )
    # Third-party libraries are chatty at INFO; keep them at WARNING.
    for noisy in ("ray", "flwr", "feast", "kafka", "urllib3", "filelock", "numexpr", "matplotlib", "PIL"):
        logging.getLogger(noisy).setLevel(max(numeric, logging.WARNING))

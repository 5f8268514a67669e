"""Errors that the CLI turns into a one-line message instead of a traceback."""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix: bad argument, missing file, empty data.

    The CLI prints ``error: <message>`` and exits with status 2. Library code
    raises it (or a subclass) for anything caused by input rather than by a bug.
    """


class ConfigError(UserError):
    """The configuration file or a ``--set`` override is invalid."""

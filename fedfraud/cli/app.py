"""Root of the ``fedfraud`` CLI.

Every other module in this package is a subcommand (or subcommand group) and
exposes ``register(app: typer.Typer) -> None``. Modules import their heavy
dependencies (torch, ray, feast) inside the command body, so ``--help`` is fast
and a missing optional part only breaks the command that needs it.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import click
import typer
from typer.core import TyperGroup

from fedfraud.config import load_config
from fedfraud.core.errors import UserError
from fedfraud.core.logs import configure_logging

#: The help's panels, in the order a user works: each top-level command or group, by panel, in that order.
WORKFLOW: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Start", ("demo", "doctor")),
    ("Data", ("generate", "ingest", "inspect", "features")),
    ("Train", ("train", "eval", "tokenizer", "federation")),
    ("Serve", ("serve", "stream", "score")),
    ("Operate", ("models", "retrain", "labels", "console")),
    ("Benchmarks", ("bench",)),
)
_ORDER = [name for _, names in WORKFLOW for name in names]
_PANEL = {name: panel for panel, names in WORKFLOW for name in names}


class WorkflowGroup(TyperGroup):
    """The root group lists its commands in :data:`WORKFLOW` order (typer keeps creation order otherwise)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda n: (_ORDER.index(n) if n in _ORDER else len(_ORDER), n))


app = typer.Typer(
    name="fedfraud",
    help="Federated, privacy-preserving real-time card-fraud scoring.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=WorkflowGroup,
    rich_markup_mode="markdown",  # the docstrings' ``code`` renders as code, not as literal backticks
)

_NOT_COMMANDS = {"app", "common"}


@app.callback()
def _root(
    ctx: typer.Context,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="YAML config file (default: ./fedfraud.yaml if present)")
    ] = None,
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="override a config value, e.g. --set privacy.epsilon_max=5")
    ] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="DEBUG, INFO, WARNING or ERROR")] = "INFO",
) -> None:
    configure_logging(log_level)
    ctx.obj = load_config(config, overrides or [])


def _register_all() -> None:
    package = importlib.import_module("fedfraud.cli")
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name in _NOT_COMMANDS or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"fedfraud.cli.{info.name}")
        module.register(app)
    for command in app.registered_commands:
        command.rich_help_panel = _PANEL.get(command.name or "", "Other")
    for group in app.registered_groups:
        name = group.name or (group.typer_instance.info.name if group.typer_instance else None)
        group.rich_help_panel = _PANEL.get(name or "", "Other")


_register_all()


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """While inside, SIGTERM (``kill``, a container stop) unwinds the main thread like Ctrl-C.

    Without it Python dies on SIGTERM without running ``finally`` blocks, and what a command started in a
    session of its own (the embedded Kafka broker, a federation's processes) outlives it. The previous handler
    comes back on exit, so an in-process caller (a test) keeps its own.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: user errors become one line on stderr and exit status 2."""
    try:
        with sigterm_unwinds():
            # standalone_mode=False: click returns a command's typer.Exit code instead of raising it
            code = app(args=argv, standalone_mode=False, prog_name="fedfraud")
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"error: {exc.strerror}: {exc.filename}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        print("aborted", file=sys.stderr)
        return 1
    except Exception as exc:  # click usage errors when standalone_mode=False
        import click

        if isinstance(exc, click.BadParameter):  # a bad option value: one line, the valid choices in it
            print(f"error: {exc.format_message()}", file=sys.stderr)
            return 2
        if isinstance(exc, click.ClickException):
            exc.show()
            return exc.exit_code
        line = _input_error_line(exc)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 2
    return code if isinstance(code, int) and not isinstance(code, bool) else 0


def _input_error_line(exc: Exception) -> str | None:
    """One line for errors that mean "your input or your broker is bad", not "fedfraud has a bug".

    An empty or unparsable CSV, a corrupt parquet file, an unreachable Kafka:
    the user can fix each, and a traceback would only hide the cause.
    """
    import pandas as pd
    import pyarrow as pa

    if isinstance(exc, pd.errors.EmptyDataError):
        return f"the CSV has no columns: {exc}"
    if isinstance(exc, pd.errors.ParserError):
        return f"the CSV cannot be parsed: {str(exc).splitlines()[0]}"
    if isinstance(exc, (pa.ArrowInvalid, pa.ArrowIOError)):
        return f"the file cannot be read as parquet/arrow: {str(exc).splitlines()[0]}"
    from confluent_kafka import KafkaError, KafkaException

    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    code = err.code() if isinstance(err, KafkaError) else None
    if code in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE):
        return "no Kafka broker reachable at the bootstrap servers (is it running? check --bootstrap-servers)"
    if code in (KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT, KafkaError._MSG_TIMED_OUT):
        return f"Kafka did not answer in time ({err.str()}); check --bootstrap-servers"
    return None


if __name__ == "__main__":
    sys.exit(main())

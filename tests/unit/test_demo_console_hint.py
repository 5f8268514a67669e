"""The demo's closing lines on the analyst's console: the exact commands, and each one a command line the real CLI
parses (a renamed option or config key fails here, not in a reader's terminal)."""

from __future__ import annotations

import shlex
from pathlib import Path

import click
from typer.main import get_command

from fedfraud.cli.app import app
from fedfraud.config import load_config
from fedfraud.demo import console_commands


def _parse(argv: list[str]) -> tuple[str, dict[str, object], dict[str, object]]:
    """(subcommand, root options, subcommand options) as click parses ``fedfraud ARGV``, invoking nothing."""
    root = get_command(app)
    assert isinstance(root, click.Group)
    with root.make_context("fedfraud", list(argv)) as ctx:
        rest = [*ctx._protected_args, *ctx.args]
        name, command, args = root.resolve_command(ctx, rest)
        assert name is not None and command is not None
        with command.make_context(name, args, parent=ctx) as sub:
            return name, dict(ctx.params), dict(sub.params)


def test_console_commands_name_the_runs_files_and_parse(tmp_path: Path) -> None:
    out = tmp_path / "demo out"
    lines = console_commands(out, 0, out / "simulation-secret", out / "api-token")
    q = shlex.quote
    assert lines == [
        "console: the demo's broker stopped with its stream (embedded, memory only); to review its models' declines "
        "in the analyst's console, run in three terminals:",
        f'  export FEDFRAUD_SIMULATION_SECRET="$(cat {q(str(out / "simulation-secret"))})" '
        f'FEDFRAUD_API_TOKEN="$(cat {q(str(out / "api-token"))})"   # in each terminal',
        f"  fedfraud --set features.repo_dir={q(str(out / 'feature_repo'))} serve --registry "
        f"{q(str(out / 'registry'))}   # prints \"embedded Tansu broker at HOST:PORT\"",
        f"  fedfraud stream --data {q(str(out / 'data'))} --bank 0 --rate 100 --bootstrap-servers HOST:PORT",
        f"  fedfraud console --bootstrap-servers HOST:PORT --registry {q(str(out / 'registry'))} --repo "
        f"{q(str(out / 'feature_repo'))}",
        "  then open http://127.0.0.1:8600/ and log in with the API token (docs/console.md)",
    ]
    commands = [shlex.split(line, comments=True) for line in lines if line.lstrip().startswith("fedfraud ")]
    parsed = {name: (root, sub) for name, root, sub in (_parse(argv[1:]) for argv in commands)}
    assert set(parsed) == {"serve", "stream", "console"}
    root, serve = parsed["serve"]
    assert serve["registry"] == str(out / "registry")
    overrides = root["overrides"]
    assert isinstance(overrides, tuple | list)
    assert load_config(None, list(overrides)).features.repo_dir == str(out / "feature_repo")
    assert str(parsed["stream"][1]["source"]) == str(out / "data") and parsed["stream"][1]["bank"] == 0
    console = parsed["console"][1]
    assert (str(console["registry"]), str(console["repo"]), console["port"]) \
        == (str(out / "registry"), str(out / "feature_repo"), 8600)


def test_own_secret_and_token_are_not_overwritten(tmp_path: Path) -> None:
    """A caller who set their own secret and token gets no export line: the commands read theirs, as the demo did."""
    lines = console_commands(tmp_path, 3, None, None)
    assert not any("export" in line for line in lines)
    assert any("--bank 3 " in line for line in lines)

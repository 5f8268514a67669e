"""The CLI describes itself: help panels in workflow order, every command placed, shell completion, code spans."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from fedfraud.cli.app import WORKFLOW, app


def _help() -> str:
    result = CliRunner().invoke(app, ["--help"], prog_name="fedfraud", env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    return result.output


def test_every_command_sits_in_a_workflow_panel_in_order() -> None:
    text = _help()
    panels = [panel for panel, _ in WORKFLOW]
    positions = [text.index(f"─ {panel} ") for panel in panels]
    assert positions == sorted(positions), "panels are printed in workflow order"
    assert "─ Other " not in text and "─ Commands " not in text, "a command outside WORKFLOW"
    for panel, names in WORKFLOW:
        section = text[text.index(f"─ {panel} "):]
        section = section[:section.index("╰")]
        found = [line.split()[1] for line in section.splitlines()[1:] if line.startswith("│ ") and line[2] != " "]
        assert found == list(names), (panel, found)


def test_docstring_code_spans_are_not_printed_as_rst() -> None:
    result = CliRunner().invoke(app, ["serve", "--help"], prog_name="fedfraud", env={"COLUMNS": "100"})
    assert result.exit_code == 0 and "transactions" in result.output and "``" not in result.output


@pytest.mark.parametrize(("words", "cword", "expected"), [("fedfraud mo", 1, "models"),
                                                          ("fedfraud bench se", 2, "serving")])
def test_bash_completion_answers_from_the_real_entry_point(words: str, cword: int, expected: str) -> None:
    env = {**os.environ, "_FEDFRAUD_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(cword)}
    out = subprocess.run([sys.executable, "-m", "fedfraud", *words.split()[1:]], env=env, capture_output=True,
                         text=True, timeout=60, check=False)
    assert expected in out.stdout.split(), out.stdout + out.stderr


def test_completion_script_is_offered() -> None:
    assert "--install-completion" in _help() and "--show-completion" in _help()

"""``fedfraud retrain`` and ``fedfraud labels``: bad input is one line and status 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfraud.cli.app import main


@pytest.mark.parametrize(("argv", "message"), [
    (["--set", "retrain.schedule=every day", "retrain", "run", "--data", "."],
     "error: invalid configuration: retrain.schedule: Value error, not a crontab expression"),
    (["retrain", "schedule", "--data", ".", "--cron", "61 * * * *"],
     "error: invalid retrain option: schedule: Value error, not a crontab expression"),
    (["retrain", "run", "--data", "/no/such/dir"], "error: data directory /no/such/dir does not exist"),
    (["labels", "join", "--outcomes", "o.sqlite", "--bootstrap-servers", "127.0.0.1:1"],
     "error: no Kafka broker reachable at 127.0.0.1:1"),
    (["labels", "join", "--outcomes", "o.sqlite", "--bootstrap-servers", "nohost"],
     "error: --bootstrap-servers 'nohost': expected host:port"),
])
def test_bad_input_is_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(message), err


def test_evaluate_without_an_outcome_store_says_what_to_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "bank_0").mkdir()
    capsys.readouterr()
    assert main(["retrain", "evaluate", "--data", str(tmp_path), "--registry", str(tmp_path / "reg")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: no outcome store at {tmp_path / 'bank_0' / 'outcomes.sqlite'}: run `fedfraud labels join` first")

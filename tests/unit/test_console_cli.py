"""``fedfraud console``'s refusals: each bad start is one line on stderr and exit status 2, before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfraud.core import net
from fedfraud.cli.app import main
from fedfraud.core.credentials import API_TOKEN_ENV


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err.strip()


def test_no_token_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(API_TOKEN_ENV, raising=False)
    code, err = _run(["console", "--bootstrap-servers", "127.0.0.1:1"], capsys)
    assert code == 2 and err.count("\n") == 0
    assert err.startswith("error: no API token: set $FEDFRAUD_API_TOKEN")


def test_insecure_no_auth_does_not_open_the_console(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(API_TOKEN_ENV, "t" * 32)
    code, err = _run(["--set", "serving.auth.disabled=true", "console", "--bootstrap-servers", "127.0.0.1:1"], capsys)
    assert code == 2 and err.count("\n") == 0 and "the console always needs the API token" in err


@pytest.mark.parametrize(("argv", "expected"), [
    ([], "error: no Kafka to read: give --bootstrap-servers"),
    (["--bootstrap-servers", "nonsense"], "expected host:port"),
    (["--port", "0"], "error: Invalid value for '--port'"),
    (["--history", "0"], "error: Invalid value for '--history'"),
    (None, "error: no Kafka broker reachable at"),  # a closed port
])
def test_bad_options_are_one_line(argv: list[str] | None, expected: str, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(API_TOKEN_ENV, "t" * 32)
    if argv is None:
        argv = ["--bootstrap-servers", f"127.0.0.1:{net.free_port()}"]
    code, err = _run(["console", *argv], capsys)
    assert code == 2 and err.count("\n") == 0, err
    assert expected in err


def test_registry_that_is_not_a_folder_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """With a broker that answers, a missing registry folder is named."""
    import socket

    monkeypatch.setenv(API_TOKEN_ENV, "t" * 32)
    with socket.socket() as listener:  # anything that accepts TCP passes the reachability check
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code, err = _run(["console", "--bootstrap-servers", f"127.0.0.1:{port}", "--registry",
                          str(tmp_path / "nope")], capsys)
    assert code == 2 and err == f"error: --registry {tmp_path / 'nope'}: no such folder"


"""The bearer-token check and where the token comes from (issue 17). The endpoints over real HTTP are in
``tests/integration/test_streaming_pipeline.py`` and ``tests/integration/test_tokenizer_service.py``."""

from __future__ import annotations

import stat

import pytest
from fastapi import HTTPException

from fedfraud.cli.app import main
from fedfraud.core.credentials import API_TOKEN_ENV, read_secret, write_secret_file
from fedfraud.core.errors import UserError
from fedfraud.serving.auth import TOKEN_FILE, BearerAuth, api_token, per_run_token
from fedfraud.serving.config import AuthSettings


@pytest.fixture
def no_env_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_TOKEN_ENV, raising=False)


def _status(auth: BearerAuth, header: str | None) -> tuple[int, dict[str, str]]:
    try:
        auth.check(header)
    except HTTPException as exc:
        return exc.status_code, dict(exc.headers or {})
    return 200, {}


@pytest.mark.parametrize(("header", "status"), [
    (None, 401), ("", 401), ("Bearer", 401), ("Bearer   ", 401), ("Basic dXNlcjpwYXNz", 401), ("t0ken", 401),
    ("Bearer wrong", 403), ("Bearer t0ken-and-more", 403), ("Bearer t0ke", 403),
    ("Bearer t0ken", 200), ("bearer t0ken", 200), ("  Bearer   t0ken  ", 200),
])
def test_401_without_a_usable_header_403_for_a_wrong_token(header: str | None, status: int) -> None:
    code, headers = _status(BearerAuth("t0ken"), header)
    assert code == status
    assert (headers.get("WWW-Authenticate") == "Bearer") == (status == 401)


def test_disabled_auth_lets_everything_through() -> None:
    assert _status(BearerAuth(None), None) == (200, {})


def test_token_file_wins_over_the_environment(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_TOKEN_ENV, "from-env")
    assert api_token(AuthSettings()) == "from-env"
    secret = write_secret_file(tmp_path / "token", "from-file")
    assert api_token(AuthSettings(token_file=str(secret))) == "from-file"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600


def test_no_token_is_one_line_naming_the_variable(tmp_path, no_env_token: None) -> None:
    with pytest.raises(UserError, match=rf"^no API token: set \${API_TOKEN_ENV} or serving.auth.token_file"):
        api_token(AuthSettings())
    assert api_token(AuthSettings(disabled=True)) is None
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(UserError, match="is empty$"):
        read_secret(API_TOKEN_ENV, tmp_path / "empty")
    with pytest.raises(UserError, match="cannot be read"):
        read_secret(API_TOKEN_ENV, tmp_path / "missing")


def test_per_run_token_is_random_private_and_only_when_none_is_configured(tmp_path, no_env_token: None,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    first = per_run_token(AuthSettings(), tmp_path / "a")
    second = per_run_token(AuthSettings(), tmp_path / "b")
    assert first.token_file == str(tmp_path / "a" / TOKEN_FILE)
    tokens = {api_token(first), api_token(second)}
    assert len(tokens) == 2 and all(len(t) >= 40 for t in tokens)  # 256 random bits each, no fixed default
    assert stat.S_IMODE((tmp_path / "a" / TOKEN_FILE).stat().st_mode) == 0o600
    monkeypatch.setenv(API_TOKEN_ENV, "configured")
    assert per_run_token(AuthSettings(), tmp_path / "c") == AuthSettings()  # a configured token is used as is
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("argv", [["serve", "--no-consume"], ["tokenizer", "serve"]])
def test_serving_without_a_token_refuses_to_start_in_one_line(argv: list[str], no_env_token: None,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: no API token") and API_TOKEN_ENV in err
    assert "--insecure-no-auth" in err

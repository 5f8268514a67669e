"""No default secret: every key derives from a secret the operator set, or from a random per-run one."""

from __future__ import annotations

import os
import stat

import pytest
from typer.testing import CliRunner

from fedfraud.cli.app import app, main
from fedfraud.core.errors import UserError
from fedfraud.feature_store.config import EncoderConfig, PrivacyConfig
from fedfraud.feature_store.privacy import (
    FEDERATION_KEY_ENV,
    SECRET_ENV,
    SIMULATION_SECRET_ENV,
    PrivateFeaturizer,
    bank_secret,
    federation_key,
    per_run_secret,
    pseudonymize,
    shuffle_seed,
)

CARD = "4539578763621486"  # a Luhn-valid test number


@pytest.fixture
def no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (SECRET_ENV, FEDERATION_KEY_ENV, SIMULATION_SECRET_ENV):
        monkeypatch.delenv(name, raising=False)


def test_no_secret_is_a_one_line_error_naming_the_variable(no_secret: None) -> None:
    with pytest.raises(UserError, match=SECRET_ENV) as err:
        bank_secret(PrivacyConfig(), 0)
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match=SIMULATION_SECRET_ENV):
        federation_key(PrivacyConfig())


def test_the_old_public_default_no_longer_keys_anything(no_secret: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The attack of the issue: recompute a card's pseudonym from the public default and match it."""
    assert PrivacyConfig().secret_seed is None
    public = pseudonymize([CARD], bank_secret(PrivacyConfig(secret_seed="fedfraud-demo"), 0))
    monkeypatch.setenv(SIMULATION_SECRET_ENV, "a secret the operator chose")
    assert pseudonymize([CARD], bank_secret(PrivacyConfig(), 0)) != public


def test_simulation_secret_from_env_or_config(no_secret: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from_config = PrivacyConfig(secret_seed="s1")
    assert bank_secret(from_config, 0) != bank_secret(from_config, 1)  # banks of one simulation differ
    monkeypatch.setenv(SIMULATION_SECRET_ENV, "s1")
    assert bank_secret(PrivacyConfig(), 1) == bank_secret(from_config, 1)  # the env and the config are one secret
    assert "s1" not in repr(from_config)


def test_shuffle_permutation_is_keyed_by_the_federation(no_secret: None) -> None:
    enc = EncoderConfig()
    a, b = PrivacyConfig(secret_seed="one federation"), PrivacyConfig(secret_seed="another")
    assert shuffle_seed(a) != shuffle_seed(b)
    # every bank of one federation uses the same permutation (the model sees one coordinate order)
    def perm(cfg: PrivacyConfig, bank: int):
        return PrivateFeaturizer.for_bank(enc, cfg, bank).permutation

    assert (perm(a, 0) == perm(a, 3)).all() and (perm(a, 0) != perm(b, 0)).any()


def test_production_bank_needs_the_federation_key(no_secret: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, "bank 0's own secret")
    assert len(bank_secret(PrivacyConfig(), 0)) == 32
    with pytest.raises(UserError, match=FEDERATION_KEY_ENV):
        federation_key(PrivacyConfig())
    monkeypatch.setenv(FEDERATION_KEY_ENV, "shared by the banks")
    key = federation_key(PrivacyConfig())
    assert key == federation_key(PrivacyConfig(secret_seed="x"))  # production keys win over a simulation secret
    monkeypatch.setenv(FEDERATION_KEY_ENV, "another federation")
    assert federation_key(PrivacyConfig()) != key


def test_per_run_secret_is_random_private_and_announced(no_secret: None, tmp_path, caplog) -> None:
    path = per_run_secret(PrivacyConfig(), tmp_path)
    assert path is not None and stat.S_IMODE(path.stat().st_mode) == 0o600
    first = os.environ[SIMULATION_SECRET_ENV]
    assert path.read_text().strip() == first and len(first) >= 32
    assert "random simulation secret" in caplog.text and first not in caplog.text
    assert per_run_secret(PrivacyConfig(), tmp_path / "again") is None  # one is set now: left alone
    os.environ.pop(SIMULATION_SECRET_ENV)
    assert per_run_secret(PrivacyConfig(), tmp_path / "second") is not None
    assert os.environ[SIMULATION_SECRET_ENV] != first


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "anomaly", "--data", "nowhere"],
        ["train", "fraud", "--data", "nowhere"],
        ["serve", "--registry", "nowhere"],
        ["score", "nowhere.csv"],
        ["features", "get", CARD],
        ["features", "apply"],
        ["retrain", "evaluate", "--data", "nowhere"],
        ["stream", "--source", "nowhere.csv"],
        ["federation", "up", "--data-dir", "nowhere"],
    ],
)
def test_commands_that_key_or_serve_refuse_to_start(no_secret: None, argv: list[str], capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no bank secret") and SECRET_ENV in err and "\n" not in err


HELP = [["train", "anomaly", "--help"], ["generate", "--help"], ["features", "get", "--help"]]


@pytest.mark.parametrize("argv", HELP, ids=["train", "generate", "features"])
def test_help_needs_no_secret(no_secret: None, argv: list[str]) -> None:
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_generate_and_ingest_need_no_secret(no_secret: None, tmp_path) -> None:
    data = tmp_path / "data"
    assert main(["generate", "--out", str(data), "--cardholders", "20", "--days", "3", "--banks", "2"]) == 0
    assert any(data.rglob("*.csv")) or any(data.rglob("*.parquet"))


def test_a_secret_from_the_config_reaches_child_processes(no_secret: None, tmp_path, capsys) -> None:
    """Flower's ClientApps and Ray workers read the environment, not the CLI's config object."""
    assert main(["--set", "privacy.secret_seed=from-config", "stream", "--source", str(tmp_path / "no.csv")]) == 2
    assert "no Kafka to stream to" in capsys.readouterr().err  # it got past the secret check
    assert os.environ[SIMULATION_SECRET_ENV] == "from-config"

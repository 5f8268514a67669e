"""Run settings, the Flower app config in pyproject.toml, and one-line CLI errors before any Ray start."""

import tomllib
from pathlib import Path

import pandas as pd
import pytest

from fedfraud.cli.app import main
from fedfraud.config import FedfraudConfig
from fedfraud.core.errors import ConfigError
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.feature_store.layout import bank_dir
from fedfraud.training.data.synthetic import generate_dataset
from fedfraud.training.anomaly.federated.task import RunSettings

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_flower_app_config_matches_settings():
    flwr = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]
    assert flwr["app"]["components"] == {
        "serverapp": "fedfraud.training.anomaly.federated.server_app:app",
        "clientapp": "fedfraud.training.anomaly.federated.client_app:app",
    }
    defaults = RunSettings.defaults()
    for key, value in flwr["app"]["config"].items():
        assert key in defaults, key
        assert value == defaults[key], key
    RunSettings.from_flat(flwr["app"]["config"])


def test_settings_round_trip_and_errors():
    s = RunSettings.from_flat({"pooling": "sag", "rounds": 3, "privacy-epsilon-max": 5.0, "egograph-max-nodes": 16})
    assert s.anomaly.pooling == "sag" and s.federated.rounds == 3 and s.privacy.epsilon_max == 5.0
    assert RunSettings.from_flat(s.to_flat()) == s
    with pytest.raises(ConfigError, match="unknown anomaly run setting 'nope'"):
        RunSettings.from_flat({"nope": 1})
    with pytest.raises(ConfigError, match="local-epochs"):
        RunSettings.from_flat({"local-epochs": 0})
    cfg = FedfraudConfig()
    assert cfg.anomaly.layers == 2 and cfg.federated.proximal_mu >= 0



def test_dp_section_travels_as_dp_keys():
    from fedfraud.config import load_config

    cfg = load_config(overrides=["federated.dp.enabled=true", "federated.dp.target_epsilon=3", "federated.rounds=4"])
    s = RunSettings.from_config(cfg, Path("data"), Path("out"))
    flat = s.to_flat()
    assert flat["dp-enabled"] is True and flat["dp-target-epsilon"] == 3 and flat["rounds"] == 4
    assert RunSettings.from_flat(flat) == s and RunSettings.from_flat(flat).federated.dp == cfg.federated.dp
    with pytest.raises(ConfigError, match="invalid setting dp-clipping-norm"):
        RunSettings.from_flat({"dp-clipping-norm": 0})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    generate_dataset(root, GeneratorConfig(banks=2, cardholders=16, days=21, seed=6), raw_csv=False, progress=False)
    return root


def _one_line_error(capsys, monkeypatch, argv) -> str:
    """Run the CLI expecting a one-line error, and prove that neither Ray nor Flower was started.

    Another test in the session may already have started Ray, so the proof is that
    ``ray.init`` and ``run_simulation`` are never called, not that Ray is down.
    """
    import flwr.simulation
    import ray

    def forbidden(*args, **kwargs):
        raise AssertionError("Ray/Flower was started before the input was validated")

    monkeypatch.setattr(ray, "init", forbidden)
    monkeypatch.setattr(flwr.simulation, "run_simulation", forbidden)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) >= 1 and err[-1].startswith("error: ")
    return err[-1]


def test_cli_unknown_pooling(capsys, monkeypatch, tiny, tmp_path):
    line = _one_line_error(
        capsys, monkeypatch, ["train", "anomaly", "--data", str(tiny), "--pooling", "maxpool", "--out", str(tmp_path)]
    )
    assert "unknown pooling 'maxpool'" in line and "asap" in line


def test_cli_missing_data_dir(capsys, monkeypatch, tmp_path):
    line = _one_line_error(
        capsys, monkeypatch, ["train", "anomaly", "--data", str(tmp_path / "nope"), "--out", str(tmp_path)]
    )
    assert "does not exist" in line


def test_cli_dp_on_a_centralized_run(capsys, monkeypatch, tiny, tmp_path):
    argv = ["--set", "federated.dp.enabled=true", "train", "anomaly", "--data", str(tiny), "--out", str(tmp_path),
            "--centralized"]
    assert "client-level DP" in _one_line_error(capsys, monkeypatch, argv)


@pytest.mark.parametrize("centralized", [False, True])
def test_cli_empty_bank(capsys, monkeypatch, tiny, tmp_path, centralized):
    data = tmp_path / "data"
    for bank in (0, 1):
        bank_dir(data, bank).mkdir(parents=True)
        frame = pd.read_parquet(bank_dir(tiny, bank) / "transactions.parquet")
        (frame.iloc[:0] if bank == 1 else frame).to_parquet(bank_dir(data, bank) / "transactions.parquet")
    argv = ["train", "anomaly", "--data", str(data), "--out", str(tmp_path / "out")]
    line = _one_line_error(capsys, monkeypatch, argv + (["--centralized"] if centralized else []))
    assert "bank 1" in line and "no transactions" in line


def test_init_from_starts_from_the_published_weights_and_refuses_another_architecture(tmp_path):
    """Public pretraining: ``anomaly.init_from`` loads a published model's weights into the run's model."""
    import torch

    from fedfraud.training.anomaly.federated.task import build_model, initial_model
    from fedfraud.training.anomaly.scorer import publish_anomaly_model
    from fedfraud.training.registry import ModelRegistry

    source = RunSettings.from_flat({"seed": 3})
    pretrained = build_model(source)
    publish_anomaly_model(ModelRegistry(tmp_path / "reg"), pretrained.state_dict(), anomaly_cfg=source.anomaly,
                          encoder_cfg=source.encoder, ego_cfg=source.egograph, config={}, metrics={}, privacy={},
                          card="pretrained on public data")
    settings = RunSettings.from_flat({"seed": 7, "init-from": str(tmp_path / "reg")})
    started = initial_model(settings)
    fresh = build_model(RunSettings.from_flat({"seed": 7}))
    for key, value in pretrained.state_dict().items():
        assert torch.equal(started.state_dict()[key], value), key
    assert any(not torch.equal(fresh.state_dict()[k], v) for k, v in pretrained.state_dict().items())
    # a client builds the architecture only: it gets the weights in every message, the folder may not exist there
    client = build_model(settings).state_dict()
    assert any(not torch.equal(client[k], v) for k, v in pretrained.state_dict().items())
    with pytest.raises(ConfigError, match="does not fit this run's architecture"):
        initial_model(RunSettings.from_flat({"hidden": 32, "init-from": str(tmp_path / "reg")}))

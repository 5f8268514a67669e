"""`fedfraud features apply|materialize|get` end to end on the embedded SQLite profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfraud.cli.app import main
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.feature_store.layout import read_bank
from fedfraud.training.data.synthetic import generate_dataset

pytestmark = pytest.mark.integration


def test_apply_materialize_get(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, repo = tmp_path / "data", tmp_path / "repo"
    generate_dataset(data, GeneratorConfig(banks=1, cardholders=20, days=7, seed=5), raw_csv=False, progress=False)
    assert main(["features", "apply", "--data", str(data), "--repo", str(repo), "--store", "sqlite"]) == 0
    assert (repo / "feature_store.yaml").exists() and (repo / "definitions.py").exists()
    assert main(["features", "materialize", "--repo", str(repo), "--store", "sqlite"]) == 0
    raw_id = str(read_bank(data, 0)["cardholder_id"].iloc[0])
    capsys.readouterr()
    assert main(["features", "get", raw_id, "--bank", "0", "--repo", str(repo), "--store", "sqlite"]) == 0
    out = capsys.readouterr().out
    assert "not in the store" not in out and "tx_count:" in out and "time_embedding:" in out
    assert raw_id not in out  # only the pseudonym is shown


def test_unknown_store_is_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["features", "apply", "--repo", str(tmp_path / "r"), "--store", "cassandra"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: Invalid value for '--store': 'cassandra' is not one of 'sqlite', 'redis'."

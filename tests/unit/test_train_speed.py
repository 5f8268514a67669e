"""The training-speed bench runs the product's local training on every device present and reports it against the
same machine's CPU (on this machine: the CPU alone)."""

import torch

from fedfraud.bench.train_speed import main, run_train_speed_bench
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.training.data.synthetic import generate_dataset


def test_train_speed_times_every_device_against_the_same_machines_cpu(tmp_path, capsys):
    generate_dataset(tmp_path / "data", GeneratorConfig(banks=1, cardholders=40, days=30, seed=3), raw_csv=False,
                     progress=False)
    figures = run_train_speed_bench(tmp_path / "data", 0, epochs=1, samples_per_epoch=64)
    assert set(figures["devices"]) == ({"cpu", "cuda"} if torch.cuda.is_available() else {"cpu"})
    assert figures["devices"]["cpu"]["ratio_to_cpu"] == 1.0 and figures["train_pairs"] > 64
    assert all(row["transitions_per_s"] > 0 for row in figures["devices"].values())
    assert main(["--data", str(tmp_path / "data"), "--epochs", "1", "--samples-per-epoch", "32",
                 "--json", str(tmp_path / "speed.json")]) == 0
    assert (tmp_path / "speed.json").read_text().startswith("{") and '"devices"' in capsys.readouterr().out

"""Training speed of the anomaly GNN per device, on one bank's real training pairs: what a GPU worker buys.

``python -m fedfraud.bench.train_speed --data DIR --bank B --json FILE`` builds the bank's training pairs with
the product's code (:func:`~fedfraud.training.anomaly.data.load_bank_data`), then runs the product's local
training (:func:`~fedfraud.training.anomaly.engine.train_model`, what a federated client runs each round) with
the default model on every device present: the CPU, and CUDA when there is one. Same seed, same batches, one
warm-up epoch, then ``epochs`` timed epochs of ``samples_per_epoch`` transitions. Transitions per second per
device, and each device's ratio to the CPU of the *same* machine. It imports neither Flower nor Ray, so it runs
on a machine that has only PyTorch, PyG and pydantic.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

from fedfraud.bench.harness import load_average

__all__ = ["run_train_speed_bench"]

logger = logging.getLogger(__name__)


def _devices() -> list[torch.device]:
    return [torch.device("cpu"), *([torch.device("cuda")] if torch.cuda.is_available() else [])]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_train_speed_bench(data: Path, bank: int, epochs: int = 3, samples_per_epoch: int = 1024) -> dict[str, Any]:
    """Time :func:`train_model` on every device present; returns the figures (transitions/s, ratio to CPU)."""
    from fedfraud.feature_store.config import EgoGraphConfig, EncoderConfig, PrivacyConfig
    from fedfraud.training.anomaly.config import AnomalyConfig
    from fedfraud.training.anomaly.data import load_bank_data
    from fedfraud.training.anomaly.engine import sources_of, train_model
    from fedfraud.training.anomaly.model import AnomalyModel

    cfg, enc, priv, ego = AnomalyConfig(), EncoderConfig(), PrivacyConfig(), EgoGraphConfig()
    start = time.perf_counter()
    bank_data = load_bank_data(Path(data), bank, cfg, enc, priv, ego)
    build_s = time.perf_counter() - start
    sources = sources_of([bank_data], cfg, ego.max_nodes)
    rows: dict[str, dict[str, float]] = {}
    for device in _devices():
        torch.manual_seed(cfg.seed)
        model = AnomalyModel(cfg, enc, ego.max_nodes).to(device)
        common = {"samples_per_epoch": samples_per_epoch, "batch_size": cfg.batch_size, "lr": cfg.lr, "seed": 0}
        train_model(model, sources, epochs=1, **common)  # warm-up: allocator, kernels, caches
        _sync(device)
        t0 = time.perf_counter()
        stats, _ = train_model(model, sources, epochs=epochs, **common)
        _sync(device)
        seconds = time.perf_counter() - t0
        rows[device.type] = {"seconds": seconds, "transitions_per_s": epochs * samples_per_epoch / seconds}
        logger.info("train_speed device=%s %.1f transitions/s", device.type, rows[device.type]["transitions_per_s"])
    cpu = rows["cpu"]["transitions_per_s"]
    for row in rows.values():
        row["ratio_to_cpu"] = row["transitions_per_s"] / cpu
    return {
        "machine": {"cpu_threads": torch.get_num_threads(), "cores": os.cpu_count(),
                    "python": platform.python_version(), "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None},
        "load": load_average(), "bank": bank, "train_pairs": len(bank_data.train), "build_seconds": build_s,
        "epochs": epochs, "samples_per_epoch": samples_per_epoch, "batch_size": cfg.batch_size, "devices": rows,
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m fedfraud.bench.train_speed``: print the figures as JSON (and write them with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a generated or ingested dataset directory")
    parser.add_argument("--bank", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples-per-epoch", type=int, default=1024)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    figures = run_train_speed_bench(args.data, args.bank, args.epochs, args.samples_per_epoch)
    text = json.dumps(figures, indent=2)
    if args.json is not None:
        args.json.write_text(text + "\n", encoding="utf-8")
    print(text)  # noqa: T201 - a command's output
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

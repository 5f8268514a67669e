"""Entry point of ``fedfraud train embeddings --method g-hin2vec``: the federation in Flower's simulation engine."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from fedfraud.core.errors import UserError
from fedfraud.core.net import ray_bind
from fedfraud.feature_store.config import EgoGraphConfig, EncoderConfig, PrivacyConfig
from fedfraud.feature_store.layout import list_banks
from fedfraud.training.embeddings.config import Hin2VecConfig
from fedfraud.training.embeddings.federated.task import Settings

__all__ = ["METHODS", "train_embeddings"]

logger = logging.getLogger(__name__)

#: Embedding methods ``fedfraud train embeddings --method`` knows.
METHODS = ("g-hin2vec",)


def train_embeddings(data_dir: Path, registry_dir: Path, cfg: Hin2VecConfig, encoder: EncoderConfig,
                     privacy: PrivacyConfig, egograph: EgoGraphConfig, num_cpus: int = 2) -> dict[str, Any]:
    """Train G-HIN2Vec with FedAvg, one SuperNode per bank of ``data_dir``; publish it under ``registry_dir``."""
    import torch
    from flwr.simulation import run_simulation

    from fedfraud.training.embeddings.federated.client_app import app as client_app
    from fedfraud.training.embeddings.federated.server_app import build_server_app

    banks = list_banks(Path(data_dir))
    if len(banks) < 2:
        raise UserError(f"a federation needs at least 2 banks; {data_dir} holds {len(banks)}")
    if banks != list(range(len(banks))):
        raise UserError(f"banks must be numbered 0..{len(banks) - 1} (partition ids); found {banks}")
    flat = {**Settings(str(data_dir), cfg, encoder, privacy, egograph).to_flat(),
            "registry-dir": str(registry_dir), "num-banks": len(banks)}
    results: list[dict[str, Any]] = []
    gpus = 1.0 / len(banks) if torch.cuda.is_available() else 0.0
    start = time.perf_counter()
    run_simulation(
        server_app=build_server_app(flat, results.append),
        client_app=client_app,
        num_supernodes=len(banks),
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": gpus},
            "init_args": {"num_cpus": max(1, num_cpus), "logging_level": "ERROR", **ray_bind(),
                          **({"num_gpus": 1} if gpus else {})},
        },
    )
    if not results:
        raise RuntimeError("the G-HIN2Vec ServerApp finished without a result; see the log above")
    out = results[0]
    out["wall_seconds_total"] = time.perf_counter() - start
    logger.info("hin2vec_train banks=%d rounds=%d wall_s=%.1f version=%s", len(banks), cfg.rounds,
                out["wall_seconds_total"], out.get("version"))
    return out

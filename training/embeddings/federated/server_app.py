"""G-HIN2Vec ServerApp: FedAvg over the banks, then publish the encoder as kind ``hin2vec``.

Settings are the caller's (``build_server_app(settings)``; flwr 1.41's ``run_simulation`` hands apps an empty run
config) on top of ``context.run_config``; they ride the messages' ``ConfigRecord`` to the banks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fedfraud.feature_store.privacy import feature_ldp_card
from fedfraud.training.embeddings.federated.task import Settings, build_model
from fedfraud.training.embeddings.publish import publish_hin2vec
from fedfraud.training.federated.grid import wait_for_nodes
from fedfraud.training.registry import ModelRegistry

__all__ = ["build_server_app", "run_hin2vec_federation"]

logger = logging.getLogger(__name__)


def run_hin2vec_federation(grid: Grid, flat: dict[str, Any]) -> dict[str, Any]:
    """FedAvg for ``rounds`` rounds on ``grid``; publishes to ``registry-dir`` and returns a summary."""
    settings = Settings.from_flat(flat)
    banks = int(flat.get("num-banks", 0))
    nodes = wait_for_nodes(grid, max(banks, 2), timeout_s=120.0)
    banks = banks or len(nodes)
    model = build_model(settings)
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=1.0, min_train_nodes=banks, min_evaluate_nodes=banks,
                      min_available_nodes=banks)
    start = time.perf_counter()
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                            num_rounds=settings.hin2vec.rounds, train_config=ConfigRecord(flat),
                            evaluate_config=ConfigRecord(flat))
    wall = time.perf_counter() - start
    history = {str(r): dict(m) for r, m in result.evaluate_metrics_clientapp.items()}
    train_history = {str(r): dict(m) for r, m in result.train_metrics_clientapp.items()}
    last = history[max(history, key=int)] if history else {}
    out: dict[str, Any] = {"rounds": settings.hin2vec.rounds, "banks": banks, "wall_seconds": wall,
                           "evaluate": history, "train": train_history}
    if flat.get("registry-dir"):
        metrics = {"test_loss": last.get("test-loss"), "test_node_triplet_acc": last.get("test-node-acc"),
                   "test_path_triplet_acc": last.get("test-path-acc"), "rounds": settings.hin2vec.rounds,
                   "banks": banks, "wall_seconds": wall}
        privacy = {"leaves_a_bank": "the encoder's state_dict per round (FedAvg, no secure aggregation, no DP "
                                    "noise) and scalar metrics; never graphs, rows or ids",
                   "feature_ldp": feature_ldp_card(settings.privacy),
                   "embeddings": "computed inside each bank; see docs/privacy.md for what they reveal"}
        version = publish_hin2vec(ModelRegistry(Path(str(flat["registry-dir"]))),
                                  result.arrays.to_torch_state_dict(), settings.hin2vec, settings.encoder.dim,
                                  {"mode": "federated", "strategy": "FedAvg", "encoder": settings.encoder.model_dump(),
                                   "egograph": settings.egograph.model_dump(), "data": settings.data_dir},
                                  metrics, privacy)
        out["version"] = version.tag
    logger.info("hin2vec_federated rounds=%d banks=%d wall_s=%.1f test_loss=%s published=%s",
                settings.hin2vec.rounds, banks, wall, last.get("test-loss"), out.get("version"))
    return out


def build_server_app(settings: dict[str, Any] | None = None,
                     on_result: Callable[[dict[str, Any]], None] | None = None) -> ServerApp:
    """A ServerApp with ``settings`` < ``context.run_config``; ``on_result`` receives the summary in-process."""
    base = dict(settings or {})
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        result = run_hin2vec_federation(grid, {**base, **dict(context.run_config)})
        if on_result is not None:
            on_result(result)

    return app


app = build_server_app()

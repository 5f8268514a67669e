"""Flower ServerApp of the anomaly federation: FedProx over the banks, checkpoint per round, publish at the end.

Settings: :meth:`RunSettings.defaults` < values given to
:func:`build_server_app` < ``context.run_config`` (``[tool.flwr.app.config]``
and ``flwr run --run-config``). With ``resume`` the run continues from the
checkpoint in ``<out-dir>/checkpoints/anomaly-federated``.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from training.anomaly.run import Checkpoint, checkpoint_dir, publish_run
from training.federated.strategy import AnomalyFedProx, ReplyObserver
from training.federated.task import MODEL_KEYS, RunSettings, build_model
from training.registry import ModelRegistry

__all__ = ["RESULT_FILE", "app", "build_server_app", "run_federation"]

logger = logging.getLogger(__name__)

RESULT_FILE = "result.json"


def _wait_for_nodes(grid: Grid, wanted: int, timeout: float = 120.0) -> int:
    deadline = time.monotonic() + timeout
    nodes = list(grid.get_node_ids())
    while len(nodes) < wanted and time.monotonic() < deadline:
        time.sleep(0.2)
        nodes = list(grid.get_node_ids())
    return len(nodes)


def run_federation(grid: Grid, settings: RunSettings, observer: ReplyObserver | None = None) -> dict[str, Any]:
    """The whole federated run on ``grid``; returns (and writes to ``result.json``) a summary."""
    directory = checkpoint_dir(settings.out_dir, "federated")
    flat = settings.to_flat()
    checkpoint = Checkpoint.load(directory) if settings.resume else None
    if checkpoint is not None:
        checkpoint.check_compatible(flat, MODEL_KEYS)
        checkpoint.settings = flat
        logger.info("resuming from round=%d checkpoint=%s", checkpoint.round, directory)
    else:
        if settings.resume:
            logger.warning("resume requested but no checkpoint in %s; starting at round 1", directory)
        checkpoint = Checkpoint(0, build_model(settings).state_dict(), [], flat)
    rounds = settings.federated.rounds
    available = _wait_for_nodes(grid, max(settings.num_banks, 2))
    banks = settings.num_banks or available
    start = time.perf_counter()
    if checkpoint.round < rounds:
        strategy = AnomalyFedProx(
            checkpoint=checkpoint,
            directory=directory,
            total_rounds=rounds,
            observer=observer,
            fraction_train=settings.federated.fraction_train,
            fraction_evaluate=1.0,
            min_train_nodes=max(1, min(banks, round(settings.federated.fraction_train * banks))),
            min_evaluate_nodes=banks,
            min_available_nodes=banks,
            proximal_mu=settings.federated.proximal_mu,
        )
        config = ConfigRecord(flat)
        try:
            strategy.start(
                grid=grid,
                initial_arrays=ArrayRecord(checkpoint.state_dict),
                num_rounds=rounds - checkpoint.round,
                train_config=config,
                evaluate_config=ConfigRecord(flat),
            )
        finally:
            strategy.close()
    else:
        logger.info("checkpoint already has %d/%d rounds; nothing to train", checkpoint.round, rounds)
    wall = time.perf_counter() - start
    result: dict[str, Any] = {
        "rounds": checkpoint.round,
        "wall_seconds": wall,
        "banks": banks,
        "summary": checkpoint.history[-1].summary if checkpoint.history else {},
        "seconds_per_round": [r.seconds for r in checkpoint.history],
    }
    if settings.publish and checkpoint.history:
        selected, weights = checkpoint.selected
        version = publish_run(
            ModelRegistry(settings.registry_dir),
            weights,
            selected_round=selected,
            mode="federated",
            anomaly_cfg=settings.anomaly,
            encoder_cfg=settings.encoder,
            ego_cfg=settings.egograph,
            config={**settings.config_dump(), "mode": "federated", "strategy": "FedProx"},
            history=checkpoint.history,
            privacy=checkpoint.privacy,
        )
        result["version"] = version.tag
    directory.mkdir(parents=True, exist_ok=True)
    (directory / RESULT_FILE).write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
    return result


def build_server_app(overrides: dict[str, Any] | None = None, observer: ReplyObserver | None = None) -> ServerApp:
    """A ServerApp with settings ``defaults < overrides < context.run_config``."""
    base = dict(overrides or {})
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        run_federation(grid, RunSettings.from_flat({**base, **dict(context.run_config)}), observer)

    return server


#: The app ``flwr run .`` loads (``[tool.flwr.app.components] serverapp``).
app = build_server_app()

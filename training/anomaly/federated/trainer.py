"""Entry points of ``fedfraud train anomaly``: the federated run in Flower's simulation engine on Ray.

All input checks happen here, before Ray starts, so bad input costs one line
and no start-up time.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from fedfraud.core.errors import UserError
from fedfraud.core.net import ray_bind
from fedfraud.training.anomaly.data import check_dataset
from fedfraud.training.anomaly.run import Checkpoint, checkpoint_dir
from fedfraud.training.federated.accountant import plan_noise
from fedfraud.training.anomaly.federated.server_app import build_server_app
from fedfraud.training.federated.strategy import ReplyObserver
from fedfraud.training.anomaly.federated.task import MODEL_KEYS, RunSettings, cardholder_dp, total_dp_steps

__all__ = ["RunResult", "backend_config", "prepare", "run_federated"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunResult:
    """Outcome of a training run: rounds done, wall time, final summary and the published registry tag."""

    mode: str
    rounds: int
    banks: int
    wall_seconds: float
    summary: dict[str, float]
    seconds_per_round: list[float] = field(default_factory=list)
    version: str | None = None

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError("a run result needs at least one completed round")


def prepare(settings: RunSettings, mode: str) -> list[int]:
    """Validate data and resume state without starting anything; returns the bank ids."""
    banks = check_dataset(settings.data_dir, settings.egograph.min_transactions_per_month)
    if settings.num_banks and settings.num_banks != len(banks):
        raise UserError(f"num-banks={settings.num_banks} but {settings.data_dir} holds {len(banks)} banks")
    if mode == "federated" and len(banks) < 2:
        raise UserError(f"a federation needs at least 2 banks; {settings.data_dir} holds {len(banks)}")
    if banks != list(range(len(banks))):
        raise UserError(f"banks must be numbered 0..{len(banks) - 1} (partition ids); found {banks}")
    ckpt = Checkpoint.load(checkpoint_dir(settings.out_dir, mode)) if settings.resume else None
    if ckpt is not None:
        ckpt.check_compatible(settings.to_flat(), MODEL_KEYS)
    dp = settings.federated.dp
    if dp.enabled and mode != "federated":
        raise UserError("client-level DP (dp-enabled) protects federated updates; a centralized run has none")
    if dp.enabled:
        done = ckpt.round if ckpt is not None else 0
        spent = [float(r["noise_multiplier"]) for r in ckpt.dp_ledger] if ckpt is not None else []
        try:
            if done < settings.federated.rounds:
                plan_noise(dp, settings.federated.rounds - done, spent)
        except ValueError as exc:
            raise UserError(f"client-level DP: {exc}") from None
    if settings.anomaly.cardholder_dp.enabled:
        if mode != "federated":
            raise UserError("cardholder-level DP (cardholder-dp-enabled) is built for the federated run only")
        try:
            plan = cardholder_dp(settings)
        except ValueError as exc:
            raise UserError(f"cardholder-level DP: {exc}") from None
        if plan is not None:
            logger.info(
                "cardholder_dp noise_multiplier=%.4f clipping_norm=%g sampling_rate=%g steps=%d target_epsilon=%g "
                "delta=%g", plan.noise_multiplier, plan.cfg.clipping_norm, plan.cfg.sampling_rate,
                total_dp_steps(settings), plan.cfg.target_epsilon, plan.cfg.delta,
            )
    return banks


def backend_config(settings: RunSettings, banks: int) -> dict[str, Any]:
    """Ray backend: per-bank CPU/GPU reservation; GPUs shared 1/banks each when CUDA exists and gpus is auto;
    Ray bound to ``federated.ray_host`` (loopback), no dashboard.
    """
    fed = settings.federated
    gpus = fed.client_gpus
    if gpus < 0:
        gpus = 1.0 / banks if torch.cuda.is_available() else 0.0
    return {
        "client_resources": {"num_cpus": fed.client_cpus, "num_gpus": gpus},
        "init_args": {
            "num_cpus": fed.ray_cpus,
            **ray_bind(fed.ray_host),
            "logging_level": "ERROR",
            **({"num_gpus": 1} if gpus > 0 else {}),
        },
    }


def run_federated(settings: RunSettings, observer: ReplyObserver | None = None) -> RunResult:
    """Run the federation (one SuperNode per bank) and publish the model; returns the run's summary."""
    from flwr.simulation import run_simulation

    from fedfraud.training.anomaly.federated.client_app import app as client_app

    banks = prepare(settings, "federated")
    settings = RunSettings.from_flat({**settings.to_flat(), "num-banks": len(banks)})
    logger.info(
        "federated_start banks=%d rounds=%d pooling=%s local_epochs=%d samples_per_epoch=%d",
        len(banks),
        settings.federated.rounds,
        settings.anomaly.pooling,
        settings.anomaly.local_epochs,
        settings.anomaly.samples_per_epoch,
    )
    start = time.perf_counter()
    results: list[dict[str, Any]] = []
    run_simulation(
        server_app=build_server_app(settings.to_flat(), observer, results.append),
        client_app=client_app,
        num_supernodes=len(banks),
        backend_config=backend_config(settings, len(banks)),  # type: ignore[arg-type]
    )
    wall = time.perf_counter() - start
    if not results:
        raise RuntimeError("the Flower ServerApp finished without a result; see the log above")
    out = results[0]
    return RunResult(
        "federated",
        int(out["rounds"]),
        int(out["banks"]),
        wall,
        out["summary"],
        out["seconds_per_round"],
        out.get("version"),
    )

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
from dataclasses import replace
from pathlib import Path
from collections.abc import Callable
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Strategy

from fedfraud.feature_store.privacy import feature_ldp_card
from fedfraud.training.anomaly.run import Checkpoint, checkpoint_dir, publish_run
from fedfraud.training.federated.accountant import DPRound, dp_card, plan_noise
from fedfraud.training.federated.dsfl import calibrate, dsfl_card
from fedfraud.training.federated.strategy import (
    EQUAL_WEIGHT_KEY,
    AnomalyFedProx,
    BankLevelDP,
    ReplyObserver,
    aggregator,
    banks_per_round,
    dp_sensitivity_factor,
)
from fedfraud.training.federated.grid import wait_for_nodes
from fedfraud.training.anomaly.dpsgd import cardholder_dp_card
from fedfraud.training.anomaly.federated.task import (
    MODEL_KEYS,
    RunSettings,
    cardholder_dp,
    initial_model,
    total_dp_steps,
)
from fedfraud.training.registry import ModelRegistry

__all__ = ["RESULT_FILE", "app", "build_server_app", "run_federation"]

logger = logging.getLogger(__name__)

RESULT_FILE = "result.json"


def _strategy(
    settings: RunSettings, checkpoint: Checkpoint, directory: Path, banks: int, observer: ReplyObserver | None
) -> tuple[Strategy, AnomalyFedProx]:
    """(the strategy to start, its FedProx with the run's bookkeeping): aggregating with ``aggregation``'s rule,
    wrapped in client-level DP when ``dp-enabled``, with equal bank weights and the noise scaled to the rule's
    sensitivity (:func:`dp_sensitivity_factor`).
    """
    fed, dp = settings.federated, settings.federated.dp
    per_round = banks_per_round(banks, fed.fraction_train)
    z = plan_noise(dp, fed.rounds - checkpoint.round, [float(r["noise_multiplier"]) for r in checkpoint.dp_ledger])
    weight_key = EQUAL_WEIGHT_KEY if dp.enabled else "num-examples"
    inner = AnomalyFedProx(
        checkpoint=checkpoint,
        directory=directory,
        total_rounds=fed.rounds,
        observer=observer,
        dp_round=DPRound(z, dp.clipping_norm, per_round, dp_sensitivity_factor(fed, per_round))
        if dp.enabled
        else None,
        fraction_train=fed.fraction_train,
        fraction_evaluate=1.0,
        min_train_nodes=max(1, min(banks, round(fed.fraction_train * banks))),
        min_evaluate_nodes=banks,
        min_available_nodes=banks,
        proximal_mu=fed.proximal_mu,
        weighted_by_key=weight_key,
        robust=aggregator(fed, banks, weight_key),
    )
    logger.info("aggregation=%s attack=%r attack_bank=%d", fed.aggregation, fed.attack.mode, fed.attack.bank)
    if not dp.enabled:
        return inner, inner
    factor = dp_sensitivity_factor(fed, per_round)
    logger.info(
        "client_dp noise_multiplier=%.4f clipping_norm=%g banks_per_round=%d sensitivity_factor=%g noise_std=%.6g "
        "target_epsilon=%g delta=%g",
        z,
        dp.clipping_norm,
        per_round,
        factor,
        factor * z * dp.clipping_norm / per_round,
        dp.target_epsilon,
        dp.delta,
    )
    return BankLevelDP(inner, z * factor, dp.clipping_norm, per_round), inner


def _coordinates(checkpoint: Checkpoint) -> int:
    """How many float coordinates a bank's update has (what DSFL clips, selects among and noises)."""
    return sum(v.numel() for v in checkpoint.state_dict.values() if v.is_floating_point())


def _dsfl_calibrated(settings: RunSettings, checkpoint: Checkpoint) -> RunSettings:
    """Under ``aggregation: dsfl`` with a target ε: the settings with ε₁, ε₂, ε₃ scaled to meet it over all rounds
    (deterministic, so a resumed run sends the same ε's); the banks add noise with the ε's they are sent.
    """
    fed = settings.federated
    if fed.aggregation != "dsfl" or fed.dsfl.target_epsilon <= 0 or not fed.dsfl.noise:
        return settings
    dsfl = calibrate(fed.dsfl, fed.rounds, _coordinates(checkpoint))
    logger.info("dsfl target_epsilon=%g: epsilon_select=%.5g epsilon_top=%.5g epsilon_rest=%.5g per round",
                fed.dsfl.target_epsilon, dsfl.epsilon_select, dsfl.epsilon_top, dsfl.epsilon_rest)
    return replace(settings, federated=fed.model_copy(update={"dsfl": dsfl}))


def _client_dp(settings: RunSettings, checkpoint: Checkpoint, banks: int) -> dict[str, Any]:
    """The card's ``client_dp``: cardholder-level DP-SGD when on (bank-level DP or DSFL, if also on, nested under
    ``bank_level`` / ``dsfl``), else the bank-level accountant's card or DSFL's (or ``dp: off``).
    """
    fed = settings.federated
    dsfl = fed.aggregation == "dsfl"
    # DSFL: every round's reports left the banks noised, released or not, so all the run's rounds are charged
    bank_level = (dsfl_card(fed.dsfl, fed.rounds, _coordinates(checkpoint), banks) if dsfl
                  else dp_card(checkpoint.dp_ledger, fed.dp.delta, banks))
    plan = cardholder_dp(settings)
    if plan is None:
        return bank_level
    card = cardholder_dp_card(plan.cfg, plan.noise_multiplier, total_dp_steps(settings), settings.federated.rounds)
    card["banks"] = banks
    if dsfl:
        card["dsfl"] = bank_level
    elif fed.dp.enabled:
        card["bank_level"] = bank_level
    return card


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
        checkpoint = Checkpoint(0, initial_model(settings).state_dict(), [], flat)
    settings = _dsfl_calibrated(settings, checkpoint)
    rounds = settings.federated.rounds
    available = len(wait_for_nodes(grid, max(settings.num_banks, 2), timeout_s=120.0))
    banks = settings.num_banks or available
    start = time.perf_counter()
    if checkpoint.round < rounds:
        strategy, bookkeeping = _strategy(settings, checkpoint, directory, banks, observer)
        sent = settings.to_flat()  # DSFL's calibrated ε's, when a target was set
        try:
            strategy.start(
                grid=grid,
                initial_arrays=ArrayRecord(checkpoint.state_dict),
                num_rounds=rounds - checkpoint.round,
                train_config=ConfigRecord(sent),
                evaluate_config=ConfigRecord(sent),
            )
        finally:
            bookkeeping.close()
    else:
        logger.info("checkpoint already has %d/%d rounds; nothing to train", checkpoint.round, rounds)
    wall = time.perf_counter() - start
    result: dict[str, Any] = {
        "rounds": checkpoint.round,
        "wall_seconds": wall,
        "banks": banks,
        "selected_round": checkpoint.selected[0],
        "summary": checkpoint.selected_summary,
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
            config={**settings.config_dump(), "mode": "federated",
                    "strategy": f"FedProx ({settings.federated.aggregation})"},
            history=checkpoint.history,
            privacy=checkpoint.privacy,
            client_dp=_client_dp(settings, checkpoint, banks),
            feature_ldp=feature_ldp_card(settings.privacy),
        )
        result["version"] = version.tag
    directory.mkdir(parents=True, exist_ok=True)
    (directory / RESULT_FILE).write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
    return result


def build_server_app(
    overrides: dict[str, Any] | None = None,
    observer: ReplyObserver | None = None,
    on_result: Callable[[dict[str, Any]], None] | None = None,
) -> ServerApp:
    """A ServerApp with settings ``defaults < overrides < context.run_config``.

    ``on_result`` receives the run's summary in the caller's process: ``run_simulation`` runs the ServerApp in a
    thread of its caller, so the summary needs no file. A deployed ServerApp (``flwr run``) hands its result over
    through the model registry and the checkpoint folder's ``result.json``.
    """
    base = dict(overrides or {})
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        result = run_federation(grid, RunSettings.from_flat({**base, **dict(context.run_config)}), observer)
        if on_result is not None:
            on_result(result)

    return server


#: The app ``flwr run .`` loads (``[tool.flwr.app.components] serverapp``).
app = build_server_app()

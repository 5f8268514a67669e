"""DP-FedSGD under SecAgg+ as a Flower App of its own, for a deployed federation (``flwr run apps/anomaly_dp``).

The default anomaly app (``flwr run .``) runs the Message-API strategies, which cannot run SecAgg+ in flwr 1.41,
so it refuses ``cardholder-dp-noise = "distributed"``. This app is that mode across SuperNodes: the same mechanism
and accountant as the in-process replay that ``bench privacy`` trains with
(:func:`~fedfraud.training.anomaly.distributed_dp.run_distributed`), over Flower's real SecAgg+ stages
(:mod:`fedfraud.training.federated.dp_fedsgd`):

* every round each bank Poisson-samples its training cardholders, sends its clipped, rounded gradient sum plus its
  own Skellam share of the noise (drawn from OS entropy at the bank), masked by ``secaggplus_mod``; the server
  decodes only the sum over ≥ t banks and steps Adam;
* after each block of rounds (``rounds`` blocks of ``total_dp_steps / rounds`` DP rounds, the replay's
  checkpoints) each bank reports scalar metrics of its validation and test cardholders; among the blocks every bank
  evaluated, the one with the lowest validation loss is published, with the (ε, δ) per cardholder on the card and
  the count of DP rounds applied (a round SecAgg+ halts is charged, not applied).

A round waits up to ``timeout-s`` for every bank and then sums the t or more connected (the noise plan covers t
banks' shares); with fewer than t the run stops and publishes the best block every bank evaluated before.

A bank refuses a round under a plan other than its own, a step it already answered, steps past the run's budget, a
test-only noise seed in its node config, and more training cardholders than ``dp-cardholders``; every refusal
answers one fixed text (:data:`~fedfraud.training.federated.dp_fedsgd.REFUSAL`). Each run's card states that
run's ε; two runs over the same cardholders spend both, so every bank charges each run's whole plan to its own
ledger at the run's first round and refuses a run past its lifetime budget (node config ``dp-epsilon-budget``,
:mod:`~fedfraud.training.federated.ledger`).

Settings: the run config (``[tool.flwr.app.config]`` of ``apps/anomaly_dp`` and ``--run-config``) holds the
anomaly run's flat keys (:class:`~fedfraud.training.anomaly.federated.task.RunSettings`) plus ``dp-cardholders``
(N: the federation's training cardholders, a public count the banks agree on; the noise is divided by it and the
SecAgg+ field is sized for it) and ``timeout-s``. Server and banks derive the same plan from them. The merchant
table is frozen at its seeded initial value, which every process builds alike (``anomaly.init_from`` is refused:
the banks would need the registry).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import Context
from flwr.server.client_proxy import ClientProxy
from flwr.common import EvaluateRes
from flwr.serverapp import Grid, ServerApp

from fedfraud.core.errors import ConfigError
from fedfraud.feature_store.privacy import feature_ldp_card
from fedfraud.training.anomaly.distributed_dp import (
    DistributedPlan,
    ServerStep,
    distributed_card,
    plan_distributed,
    trainable,
)
from fedfraud.training.anomaly.dpsgd import CardholderPool
from fedfraud.training.anomaly.engine import sources_of
from fedfraud.training.anomaly.federated.task import (
    RunSettings,
    bank_data,
    build_model,
    local_test,
    lr_factor,
    on_node,
    total_dp_steps,
)
from fedfraud.training.anomaly.model import AnomalyModel
from fedfraud.training.anomaly.run import Checkpoint, RoundRecord, checkpoint_dir, log_round, publish_run
from fedfraud.training.federated.dp_fedsgd import NOISE_SEED_KEY, DPBank, dp_client_app, run_dp_fedsgd
from fedfraud.training.federated.grid import wait_for_nodes
from fedfraud.training.federated.ledger import PrivacyLedger
from fedfraud.training.registry import ModelRegistry

__all__ = ["APP_DEFAULTS", "MODE", "DPRun", "client", "dp_run", "run_dp_federation", "server"]

logger = logging.getLogger(__name__)

#: The app's own run-config keys (besides the anomaly run's), with their defaults.
APP_DEFAULTS: dict[str, Any] = {"dp-cardholders": 0, "timeout-s": 600.0}
#: The checkpoint folder's and the card's mode name.
MODE = "federated-dp"
_EXECUTION = ("Flower Deployment Engine (flwr run apps/anomaly_dp): every round through SecAggPlusWorkflow and "
              "secaggplus_mod across the SuperNodes; each bank draws its sample and noise share from OS entropy")


@dataclass(frozen=True)
class DPRun:
    """A deployed DP-FedSGD run's public settings: the anomaly run's, N, the SecAgg+ timeout and the plan every
    party derives alike from them.
    """

    settings: RunSettings
    cardholders: int
    timeout_s: float
    plan: DistributedPlan

    @property
    def steps(self) -> int:
        """DP rounds the accountant charges (:func:`total_dp_steps`)."""
        return total_dp_steps(self.settings)

    @property
    def per_block(self) -> int:
        """DP rounds between two evaluations (the replay's rounds per checkpoint)."""
        return max(1, self.steps // self.settings.federated.rounds)


def dp_run(run_config: Mapping[str, Any]) -> DPRun:
    """Parse the run config; a setting this app cannot run is a one-line :class:`ConfigError`."""
    flat = {**APP_DEFAULTS, **dict(run_config)}
    try:
        cardholders = int(flat.pop("dp-cardholders"))
        timeout_s = float(flat.pop("timeout-s"))
    except (TypeError, ValueError):
        raise ConfigError("dp-cardholders must be an integer and timeout-s a number") from None
    settings = RunSettings.from_flat(flat)
    dp = settings.anomaly.cardholder_dp
    if not dp.enabled or dp.noise != "distributed":
        raise ConfigError("apps/anomaly_dp runs cardholder-dp-enabled = true with cardholder-dp-noise = "
                          "\"distributed\" only")
    if settings.anomaly.readout != "next-event":
        raise ConfigError("cardholder-level DP needs readout = \"next-event\"")
    if settings.num_banks < 3:
        raise ConfigError(f"num-banks must name the federation's banks, at least 3 for SecAgg+; got "
                          f"{settings.num_banks}")
    if cardholders < 1:
        raise ConfigError("dp-cardholders must be the federation's number of training cardholders (public; the "
                          "noise is divided by it)")
    if settings.anomaly.init_from:
        raise ConfigError("init-from is not supported by apps/anomaly_dp: the banks rebuild the frozen merchant "
                          "table from the seed")
    if timeout_s <= 0:
        raise ConfigError(f"timeout-s must be > 0, got {timeout_s}")
    if dp.delta > 1.0 / cardholders:
        raise ConfigError(f"cardholder-dp-delta {dp.delta:g} is above 1/N = {1.0 / cardholders:.3g}")
    steps = total_dp_steps(settings)
    dims = sum(p.numel() for _, p in trainable(_model(settings)))
    try:
        plan = plan_distributed(dp, steps, settings.num_banks, dims, cardholders)
    except ValueError as err:
        raise ConfigError(str(err).splitlines()[0]) from None
    if plan.noise_multiplier <= 0:
        raise ConfigError("the noise multiplier is 0: set cardholder-dp-target-epsilon > 0 or a positive "
                          "cardholder-dp-noise-multiplier")
    return DPRun(settings, cardholders, timeout_s, plan)


def _model(settings: RunSettings) -> AnomalyModel:
    """The seeded model with its merchant table frozen (DP-FedSGD trains and sends the rest only)."""
    model = build_model(settings)
    model.encoder.merchant.weight.requires_grad_(False)
    return model


class _BlockSchedule:
    """The server's step with the run's learning-rate schedule applied per block of rounds (as the replay does),
    by round number, so a halted round does not shift it.
    """

    def __init__(self, step: ServerStep, run: DPRun) -> None:
        self.step = step
        self.run = run
        self.plan = step.plan

    def at_round(self, server_round: int) -> None:
        block = (server_round - 1) // self.run.per_block + 1
        cfg = self.run.settings.anomaly
        self.step.set_lr(cfg.lr * lr_factor(cfg, block, self.run.settings.federated.rounds))

    def apply(self, summed: np.ndarray, banks_summed: int) -> np.ndarray:
        return self.step.apply(summed, banks_summed)

    def weights(self) -> list[np.ndarray]:
        return self.step.weights()


def run_dp_federation(grid: Grid, context: Context, run: DPRun) -> dict[str, Any]:
    """The whole deployed run: DP-FedSGD rounds under SecAgg+, an evaluation per block, publish the best block."""
    settings = run.settings
    dp = settings.anomaly.cardholder_dp
    blocks = settings.federated.rounds
    nodes = wait_for_nodes(grid, settings.num_banks, timeout_s=run.timeout_s)
    if len(nodes) < settings.num_banks:
        raise ConfigError(f"{len(nodes)} of num-banks={settings.num_banks} SuperNodes connected")
    model = _model(settings)
    plan = run.plan
    logger.info("dp_federation plan z=%.4f t=%d/%d N=%d steps=%d blocks=%d eps=%.4f", plan.noise_multiplier,
                plan.survivors, plan.banks, plan.cardholders, run.steps, blocks, plan.epsilon(run.steps, dp.delta))
    step = _BlockSchedule(ServerStep(model, plan, settings.anomaly.lr), run)
    checkpoint = Checkpoint(0, model.state_dict(), [], settings.to_flat())
    directory = checkpoint_dir(settings.out_dir, MODE)
    start = time.perf_counter()
    last = [start]

    def on_evaluate(server_round: int, results: list[tuple[ClientProxy, EvaluateRes]]) -> None:
        per_bank: dict[int, dict[str, float]] = {}
        for _, res in results:
            metrics = {k: float(v) for k, v in res.metrics.items()}
            if "partition-id" in metrics:
                per_bank[int(metrics.pop("partition-id"))] = metrics
        if len(per_bank) < settings.num_banks:  # a block is compared only on every bank's cardholders
            logger.warning("dp_federation block after round %d: %d of %d banks evaluated; not a candidate",
                           server_round, len(per_bank), settings.num_banks)
            return
        now = time.perf_counter()
        record = RoundRecord(server_round // run.per_block, math.nan, per_bank, now - last[0])
        last[0] = now
        checkpoint.offer(record, model.state_dict())
        checkpoint.save(directory)
        log_round(record, blocks, MODE)

    planned = run.per_block * blocks
    strategy = run_dp_fedsgd(grid, context, step, planned, run.timeout_s, evaluate_every=run.per_block,
                             on_evaluate=on_evaluate, on_round=step.at_round)
    applied = len(strategy.sums)
    result: dict[str, Any] = {
        "rounds": checkpoint.round, "dp_rounds": applied, "dp_rounds_planned": planned,
        "banks": settings.num_banks, "wall_seconds": time.perf_counter() - start,
        "selected_round": checkpoint.selected[0], "summary": checkpoint.selected_summary,
    }
    if strategy.stopped_at:
        result["stopped_at_round"] = strategy.stopped_at
        logger.error("dp_federation stopped at round %d: fewer than t = %d banks connected; the best block every "
                     "bank evaluated before it is published", strategy.stopped_at, plan.survivors)
    elif applied < planned:
        logger.error("dp_federation %d of %d DP rounds were halted by SecAgg+ (fewer than t banks); they are "
                     "charged, not applied", planned - applied, planned)
    if not applied or not checkpoint.history:
        raise RuntimeError(f"nothing to publish: {applied} of {planned} DP rounds applied, "
                           f"{len(checkpoint.history)} blocks evaluated by every bank")
    if settings.publish:
        selected, weights = checkpoint.selected
        version = publish_run(
            ModelRegistry(settings.registry_dir), weights, selected_round=selected, mode=MODE,
            anomaly_cfg=settings.anomaly, encoder_cfg=settings.encoder, ego_cfg=settings.egograph,
            config={**settings.config_dump(), "mode": MODE, "strategy": "DP-FedSGD under SecAgg+"},
            history=checkpoint.history, privacy=checkpoint.privacy,
            client_dp={**distributed_card(dp, plan, run.steps, blocks), "noise_source": "OS entropy, in each bank",
                       "execution": _EXECUTION, "dp_rounds_applied": applied,
                       **({"stopped_at_round": strategy.stopped_at} if strategy.stopped_at else {})},
            feature_ldp=feature_ldp_card(settings.privacy),
        )
        result["version"] = version.tag
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "result.json").write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
    return result


_BANKS: dict[tuple[int, int, str], DPBank] = {}
_MAX_CACHED = 8


def _bank_for(context: Context) -> DPBank:
    """This SuperNode's bank: its own folder's data, the frozen model and the public plan (kept while the process
    lives; Flower may start a process per message, and the data then comes from the bank's disk cache).
    """
    # a run's configs never change; keyed on them too, so a node id reused under other configs is a new bank
    configs = json.dumps([sorted(context.node_config.items()), sorted(context.run_config.items())], default=str)
    key = (context.run_id, context.node_id, configs)
    if key in _BANKS:
        return _BANKS[key]
    if NOISE_SEED_KEY in context.node_config:
        raise ConfigError(f"node config {NOISE_SEED_KEY} makes the noise predictable: tests only, refused here")
    run = dp_run(context.run_config)
    partition = int(context.node_config.get("partition-id", 0))
    settings = on_node(run.settings, partition, context.node_config)
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    data = bank_data(settings, partition)
    sets = [sources_of([data], settings.anomaly, settings.egograph.max_nodes)[0].pairs]
    pool = CardholderPool.of(sets)
    if len(pool) > run.cardholders:
        raise ConfigError(f"bank {partition} has {len(pool)} training cardholders, more than the federation's "
                          f"dp-cardholders = {run.cardholders}")

    def evaluate(current: AnomalyModel) -> dict[str, float]:
        # validation and test cardholders only: never a training cardholder (docs/privacy.md)
        return {**local_test(current, data), "partition-id": float(partition)}

    bank = DPBank(_model(settings), sets, pool, settings.anomaly.cardholder_dp, run.plan, evaluate,
                  max_steps=run.steps, ledger=PrivacyLedger.for_node(context.node_config))
    while len(_BANKS) >= _MAX_CACHED:
        _BANKS.pop(next(iter(_BANKS)))
    _BANKS[key] = bank
    return bank


#: The banks' ClientApp (``[tool.flwr.app.components] clientapp`` of apps/anomaly_dp).
client = dp_client_app(_bank_for)
#: The ServerApp (``serverapp`` of apps/anomaly_dp).
server = ServerApp()


@server.main()
def _main(grid: Grid, context: Context) -> None:
    run_dp_federation(grid, context, dp_run(context.run_config))

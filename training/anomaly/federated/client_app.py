"""Flower ClientApp of the anomaly federation: one bank per SuperNode (``partition-id`` in the node config).

The bank builds its private features and ego graphs from its own parquet
inside this process; a deployed SuperNode names that bank's folder in its node
config (``data-dir``, :func:`fedfraud.training.anomaly.federated.task.on_node`). What leaves it:
the model's ``state_dict`` tensors (ArrayRecord) and scalar metrics (MetricRecord) — losses, test metrics,
counts and the bank's μ-GDP. No features, graphs, ids, coordinates or
timestamps. Under cardholder-level DP (``cardholder-dp-enabled``) the weights were trained with DP-SGD inside
the bank (:mod:`fedfraud.training.anomaly.dpsgd`), and the training loss is sent as NaN. Under client-level DP the
train reply passes through Flower's
``fixedclipping_mod`` on its way out: the update (new − received weights)
is clipped to the clipping norm in L2 before it leaves the bank.

Under ``aggregation: dsfl`` the train reply passes through :func:`dsfl_mod`: the update is clipped in L1 and
noised per dimension (:func:`fedfraud.training.federated.dsfl.privatize`, through the mod the neural fraud
variants share: :mod:`fedfraud.training.federated.dsfl_mod`) before it leaves the bank.

``attack-mode`` / ``attack-bank`` (``fedfraud bench adversary`` and tests
only) make one bank malicious: :func:`attack_mod`.
"""

from __future__ import annotations

import logging
import math
import os

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import fixedclipping_mod
from flwr.clientapp.typing import ClientAppCallable

from fedfraud.training.federated.config import AttackConfig, DSFLConfig
from fedfraud.training.federated.dsfl_mod import dsfl_client_mod
from fedfraud.training.federated.strategy import EQUAL_WEIGHT_KEY
from fedfraud.training.anomaly.federated.task import (
    RunSettings,
    bank_data,
    build_model,
    device_for_client,
    local_test,
    local_train,
    on_node,
)

__all__ = ["app", "attack_mod", "dsfl_mod"]

logger = logging.getLogger(__name__)

app = ClientApp()

#: The train-config key through which Flower's DP wrapper asks for client-side clipping.
CLIPPING_KEY = "clipping_norm"


def dp_clipping_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Flower's ``fixedclipping_mod`` when the run is under client-level DP, else a pass-through.

    A train message that says ``dp-enabled`` but carries no clipping norm is
    refused: the bank does not send an unclipped update into a run it was
    told is private.
    """
    config = msg.content["config"]
    if CLIPPING_KEY in config:
        return fixedclipping_mod(msg, context, call_next)
    if bool(config.get("dp-enabled", False)):
        raise ValueError("dp-enabled but the server sent no clipping norm; refusing to send an unclipped update")
    return call_next(msg, context)


def _run_dsfl(msg: Message) -> DSFLConfig | None:
    """The run's DSFL settings (the ε's the server sent, already calibrated to its target) under
    ``aggregation: dsfl`` with ``dsfl-noise``, else None.
    """
    config = msg.content["config"]
    if config.get("aggregation") != "dsfl" or not bool(config.get("dsfl-noise", False)):
        return None
    return RunSettings.from_flat({k: v for k, v in config.items() if k in RunSettings.defaults()}).federated.dsfl


#: DSFL's privatisation of the update inside the bank (``aggregation: dsfl`` with ``dsfl-noise``), else a
#: pass-through: L1 clip, exponential-mechanism selection, Laplace noise per dimension (the shared mod).
dsfl_mod = dsfl_client_mod(_run_dsfl)


def _attack(msg: Message, context: Context) -> AttackConfig | None:
    """The attack this node runs, or None when it is honest (or no attack is configured)."""
    config = msg.content["config"]
    mode = str(config.get("attack-mode", ""))
    bank = int(config.get("attack-bank", 0))  # type: ignore[arg-type]
    if not mode or int(context.node_config.get("partition-id", 0)) != bank:
        return None
    return AttackConfig(mode=mode, bank=bank)


def attack_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """A simulated malicious bank's modified software (outermost mod; honest banks pass straight through).

    ``scale:F``: trains honestly but without the clipping mod, then sends
    ``received + F·(trained − received)``. ``flip-targets`` is data poisoning
    inside :func:`train` (the update still goes through the clipping mod).
    """
    attack = _attack(msg, context)
    if attack is None or attack.scale is None:
        return call_next(msg, context)
    received = {k: v.numpy() for k, v in msg.content["arrays"].items()}
    reply = _train(msg, context)  # not call_next: this bank skips the clipping mod
    trained = reply.content["arrays"]
    for key, base in received.items():
        new = trained[key].numpy()
        trained[key] = Array(np.asarray(base + attack.scale * (new - base), dtype=new.dtype))
    logger.warning("bank=%s attack=%s: sending a scaled update", context.node_config.get("partition-id"), attack.mode)
    return reply


def _setup(msg: Message, context: Context) -> tuple[RunSettings, int, torch.nn.Module, torch.device]:
    config = dict(msg.content["config"])
    partition = int(context.node_config.get("partition-id", 0))
    flat = RunSettings.from_flat({k: v for k, v in config.items() if k in RunSettings.defaults()})
    settings = on_node(flat, partition, context.node_config)
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    model = build_model(settings)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = device_for_client()
    return settings, partition, model.to(device), device


@app.train(mods=[attack_mod, dp_clipping_mod, dsfl_mod])
def train(msg: Message, context: Context) -> Message:
    """Local FedProx training on this bank's transitions; returns the new weights and train metrics."""
    return _train(msg, context)


def _train(msg: Message, context: Context) -> Message:
    settings, partition, model, _ = _setup(msg, context)
    config = msg.content["config"]
    bank = bank_data(settings, partition)
    mu = float(config.get("proximal-mu", settings.federated.proximal_mu))
    attack = _attack(msg, context)
    poisoned = attack is not None and attack.mode == "flip-targets"
    round_ = int(config.get("global-round", config.get("server-round", 1)))  # type: ignore[arg-type]
    stats = local_train(model, bank, settings, round_, mu, poisoned=poisoned)
    p = bank.privacy
    # under cardholder-level DP the training loss (a clear function of the training cardholders) stays in the bank
    private = settings.anomaly.cardholder_dp.enabled
    metrics = MetricRecord(
        {
            "num-examples": len(bank.train),
            EQUAL_WEIGHT_KEY: 1,
            "partition-id": partition,
            "train-loss": math.nan if private else stats.loss_last,
            "train-loss-first": math.nan if private else stats.loss_first,
            "train-steps": stats.steps,
            "train-seconds": stats.seconds,
            "cardholders": p.cardholders,
            "mu-gdp": p.mu_gdp,
            "epsilon-min": p.epsilon_min,
            "epsilon-mean": p.epsilon_mean,
            "epsilon-max": p.epsilon_max,
            "delta": p.delta,
        }
    )
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return Message(RecordDict({"arrays": ArrayRecord(state), "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Test metrics of the received global model on this bank's test cardholders."""
    settings, partition, model, _ = _setup(msg, context)
    bank = bank_data(settings, partition)
    metrics = local_test(model, bank)
    record = MetricRecord(
        {
            "num-examples": len(bank.test),
            EQUAL_WEIGHT_KEY: 1,
            "partition-id": partition,
            **{k.replace("_", "-"): float(v) for k, v in metrics.items()},
        }
    )
    return Message(RecordDict({"metrics": record}), reply_to=msg)

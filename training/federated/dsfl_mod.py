"""DSFL's Flower client mod: the bank's half of ``aggregation: dsfl``, shared by every ClientApp that offers it.

The anomaly GNN's ClientApp and the neural fraud variants' (the federated GNN, FED-SPFD) wrap their train
function with a mod made by :func:`dsfl_client_mod`, so the noise is added by one piece of code
(:func:`~fedfraud.training.federated.dsfl.privatize`) after the bank trained and before its reply leaves it. Each
app says how it reads the (calibrated) settings from the server's message, and which arrays its bank never
trains (a scaler the server computed): those go back exactly as received, unnoised and not counted as
coordinates, so they can carry nothing of the bank's data.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import numpy as np
from flwr.app import Array, Context, Message
from flwr.clientapp.typing import ClientAppCallable, Mod

from fedfraud.training.federated.config import DSFLConfig
from fedfraud.training.federated.dsfl import flat_update, privatize, unflatten

__all__ = ["DSFL_KEY", "ROUND_OFFSET_KEY", "dsfl_client_mod", "dsfl_from_json", "noised_arrays"]

#: Train-config key of the apps that send their (calibrated) :class:`DSFLConfig` as JSON (the fraud variants).
DSFL_KEY = "dsfl"
#: Train-config key added to the round number of the noise seed (a job's second phase: FED-SPFD's warm start).
ROUND_OFFSET_KEY = "dsfl-round-offset"


def dsfl_from_json(msg: Message) -> DSFLConfig | None:
    """The message's :data:`DSFL_KEY` settings, or None when the server sent none (DSFL off)."""
    raw = msg.content.config_records["config"].get(DSFL_KEY)
    return None if raw in (None, "") else DSFLConfig.model_validate_json(str(raw))


def noised_arrays(received: dict[str, np.ndarray], fixed: Collection[str]) -> dict[str, np.ndarray]:
    """The arrays DSFL privatizes (and counts as coordinates): all the server sent but the ``fixed`` ones."""
    return {k: v for k, v in received.items() if k not in fixed}


def dsfl_client_mod(read: Callable[[Message], DSFLConfig | None], fixed: Collection[str] = ()) -> Mod:
    """A mod that privatizes the train reply's update (new − received arrays) when ``read(msg)`` gives settings
    with noise on, else passes through. ``fixed``: array names the bank returns as received.

    The noise seed is ``[seed, partition-id, round]`` (``seed`` −1: the OS's entropy), the round being the
    message's ``global-round`` (or ``server-round``) plus its :data:`ROUND_OFFSET_KEY`.
    """

    def dsfl_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        cfg = read(msg)
        if cfg is None or not cfg.noise:
            return call_next(msg, context)
        received = {k: v.numpy() for k, v in msg.content.array_records["arrays"].items()}
        reply = call_next(msg, context)
        if reply.has_error():
            return reply
        arrays = reply.content.array_records["arrays"]
        extra = set(arrays) - set(received)
        if extra:
            raise ValueError(f"dsfl: the reply carries arrays the server did not send ({sorted(extra)}); refusing "
                             "to send them without noise")
        config = msg.content.config_records["config"]
        bank = int(context.node_config.get("partition-id", 0))
        round_ = int(config.get("global-round", config.get("server-round", 1)))  # type: ignore[arg-type]
        round_ += int(config.get(ROUND_OFFSET_KEY, 0))  # type: ignore[arg-type]
        rng = np.random.default_rng(None if cfg.seed < 0 else [cfg.seed, bank, round_])
        base = noised_arrays(received, fixed)
        noised, _ = privatize(flat_update({k: arrays[k].numpy() for k in base}, base), cfg, rng)
        for key, value in {**received, **unflatten(noised, base)}.items():
            arrays[key] = Array(value)
        return reply

    return dsfl_mod

"""The anomaly federation under SecAgg+: the server learns only the sum of the banks' models (Flower's legacy path).

Flower 1.41 has SecAgg+ only for the legacy API: the server side is
``flwr.server.workflow.SecAggPlusWorkflow`` inside a ``DefaultWorkflow`` over
a ``LegacyContext`` and a ``flwr.server.strategy`` strategy; the client side
is ``flwr.client.mod.secaggplus_mod`` around a ``NumPyClient``. The Message
API strategies (``flwr.serverapp.strategy``), which the default path uses,
cannot run it. So this module is a second, minimal path: FedProx clients (the
same :func:`local_train`), equal bank weights (every bank reports one
example, as under DP), the legacy FedAvg on the server, which receives one
already-summed result per round. It has none of the default path's
checkpoints, robust rules or publishing; it is what ``fedfraud bench
adversary --secagg`` times and what the SecAgg+ integration test inspects.

SecAgg+ and DP: the server-side noise of :class:`~fedfraud.training.federated.strategy.BankLevelDP`
needs only the sum, and clipping happens in the bank, so the two compose: the
clipping mod must run inside the SecAgg+ mod (clip, then mask). The server can
then no longer check what a bank sent: a bank that skips the clip (the
``scale`` attacker) is invisible, and the robust rules, which need the
individual updates, cannot run. Not wired here: the DP wrapper around the
legacy strategy (docs/privacy.md, threat model).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Context
from flwr.client import NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import FitIns, FitRes, Parameters, Scalar, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server import LegacyContext, ServerConfig
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.serverapp import Grid, ServerApp

from fedfraud.training.federated import secagg_prg
from fedfraud.training.anomaly.federated.task import RunSettings, bank_data, build_model, initial_model, local_train

secagg_prg.install()  # SecAgg+ masks keyed by the whole shared secret, on banks and server alike

__all__ = ["SecAggRun", "run_secagg"]

logger = logging.getLogger(__name__)

#: Called with each list of results the server-side strategy receives (tests assert it is one summed result).
FitObserver = Callable[[int, list[tuple[ClientProxy, FitRes]]], None]


class _Bank(NumPyClient):
    """One bank: FedProx local training on its own transitions; weights out as numpy arrays."""

    def __init__(self, settings: RunSettings, partition: int, secagg: bool) -> None:
        self.settings = settings
        self.partition = partition
        self.secagg = secagg
        self.model = build_model(settings)
        self.keys = list(self.model.state_dict())

    def fit(self, parameters: list[np.ndarray], config: dict[str, Scalar]) -> tuple[list[np.ndarray], int, dict]:
        import torch

        if self.secagg:
            secagg_prg.require(config)  # the server expands masks with the same generator, or no answer
        state = {k: torch.from_numpy(np.asarray(v).copy()) for k, v in zip(self.keys, parameters, strict=True)}
        self.model.load_state_dict(state)
        bank = bank_data(self.settings, self.partition)
        stats = local_train(self.model, bank, self.settings, int(config.get("server-round", 1)),
                            self.settings.federated.proximal_mu)
        out = [v.detach().cpu().numpy() for v in self.model.state_dict().values()]
        return out, 1, {"train-loss": stats.loss_last}  # weight 1: equal banks, and SecAgg+'s max_weight holds


def _client_app(settings: RunSettings, secagg: bool) -> ClientApp:
    def client_fn(context: Context) -> Any:
        return _Bank(settings, int(context.node_config.get("partition-id", 0)), secagg).to_client()

    return ClientApp(client_fn=client_fn, mods=[secaggplus_mod] if secagg else [])


class _Timed(FedAvg):
    """Legacy FedAvg that times each round (configure_fit → aggregate_fit) and shows an observer its input."""

    def __init__(self, observer: FitObserver | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.observer = observer
        self.started: dict[int, float] = {}
        self.seconds: list[float] = []
        self.final: Parameters | None = None

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: Any
    ) -> list[tuple[ClientProxy, FitIns]]:
        self.started[server_round] = time.perf_counter()
        return super().configure_fit(server_round, parameters, client_manager)

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]], failures: list) -> Any:
        if self.observer is not None:
            self.observer(server_round, results)
        out = super().aggregate_fit(server_round, results, failures)
        self.seconds.append(time.perf_counter() - self.started.get(server_round, time.perf_counter()))
        self.final = out[0]
        return out


@dataclass
class SecAggRun:
    """Wall seconds of each round and the final global weights of one run."""

    secagg: bool
    banks: int
    seconds_per_round: list[float] = field(default_factory=list)
    final: list[np.ndarray] = field(default_factory=list)


def _threshold(banks: int) -> int:
    """Shares needed to rebuild a dropped bank's key: a majority, at least 2 (3 of 5, 2 of 3)."""
    return max(2, banks // 2 + 1)


def run_secagg(settings: RunSettings, secagg: bool = True, observer: FitObserver | None = None) -> SecAggRun:
    """``settings.federated.rounds`` FedProx rounds over every bank of ``settings.data_dir`` on the legacy path,
    with SecAgg+ (every bank shares its key with all others; a majority of shares reconstructs a dropped bank's)
    or without it (the same path, plain fit workflow), for a like-for-like cost.
    """
    from flwr.simulation import run_simulation

    from fedfraud.training.anomaly.federated.trainer import backend_config, prepare

    banks = len(prepare(settings, "federated"))
    result = SecAggRun(secagg, banks)
    initial = [v.numpy() for v in initial_model(settings).state_dict().values()]
    config = {k: v for k, v in settings.to_flat().items() if isinstance(v, bool | int | float | str)}
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = _Timed(
            observer,
            fraction_fit=1.0,
            fraction_evaluate=0.0,
            min_fit_clients=banks,
            min_available_clients=banks,
            initial_parameters=ndarrays_to_parameters(initial),
            on_fit_config_fn=lambda rnd: {**config, "server-round": rnd,
                                          **(secagg_prg.fit_config() if secagg else {})},
        )
        legacy = LegacyContext(context, config=ServerConfig(num_rounds=settings.federated.rounds), strategy=strategy)
        fit = (
            SecAggPlusWorkflow(num_shares=banks, reconstruction_threshold=_threshold(banks), max_weight=1.0)
            if secagg
            else None
        )
        DefaultWorkflow(fit_workflow=fit)(grid, legacy)
        result.seconds_per_round = strategy.seconds
        result.final = parameters_to_ndarrays(strategy.final) if strategy.final is not None else []

    run_simulation(
        server_app=server,
        client_app=_client_app(settings, secagg),
        num_supernodes=banks,
        backend_config=backend_config(settings, banks),  # type: ignore[arg-type]
    )
    return result

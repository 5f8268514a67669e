"""The DP-boosted fraud model over Flower's SecAgg+ (variant ``federated-dp``; the arithmetic is
:mod:`fedfraud.training.fraud.dp_boost`).

Bank side (:func:`dp_boost_client_app`): ``fit`` rebuilds the server's state from the arrays it sent (candidates,
finished trees, the tree to fill), computes its clean integer vector for the pending release, adds a Skellam share
and returns the residues mod M with weight 1; ``secaggplus_mod`` masks them. No metric leaves the bank.

Server side: :func:`~fedfraud.training.federated.dp_fedsgd.run_dp_fedsgd` with a
:class:`~fedfraud.training.fraud.dp_boost.BoostServer`: one SecAgg+ round per release (``trees + 2`` rounds), the
same strategy and SecAgg+ settings as the anomaly model's DP-FedSGD.

Noise: fresh OS entropy; a node config ``dp-noise-seed`` fixes it (tests only: whoever knows the seed can subtract
the bank's share).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context
from flwr.client import NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import Scalar

from fedfraud.training.federated import secagg_prg
from fedfraud.training.federated.dp_fedsgd import NOISE_SEED_KEY, STEP_KEY
from fedfraud.training.fraud.dp_boost import BoostPlan, BoostState, bank_release, check_splits, check_state
from fedfraud.training.fraud.features import FraudFeatures

secagg_prg.install()  # SecAgg+ masks keyed by the whole shared secret, on banks and server alike

__all__ = ["RELEASES_KEY", "BankRelease", "ReleaseRefused", "dp_boost_client_app"]

logger = logging.getLogger(__name__)

#: The node's state record counting the releases it made in this run, per kind (the accountant's budget).
RELEASES_KEY = "dp-boost-releases"


class ReleaseRefused(RuntimeError):
    """The server asked for a release the plan does not allow, or sent a malformed state (one fixed message:
    Flower returns the error text to the server, so it must not depend on the bank's data).
    """


#: Test hook: shown each bank's (node id, round, clean vector, noise share) before it is masked. Never deployed.
BankRelease = Callable[[int, int, np.ndarray, np.ndarray], None]


class _Bank(NumPyClient):
    def __init__(self, data: FraudFeatures, plan: BoostPlan, context: Context, observer: BankRelease | None) -> None:
        check_splits(data)
        self.data = data
        self.plan = plan
        self.context = context
        self.observer = observer

    def get_parameters(self, config: dict[str, Scalar]) -> list[np.ndarray]:
        return []

    def _charge(self, state: BoostState) -> None:
        """Count the release against the plan: 1 candidate release, ``trees`` tree releases, 1 threshold release;
        a server that asks again for a tree this bank released (a replay) gets nothing, so a round SecAgg+ refused
        (fewer than t banks) ends the run. A bank that missed a round may join the next one.
        """
        try:
            check_state(state, self.plan)
        except (ValueError, IndexError):
            raise ReleaseRefused("malformed state from the server") from None
        kind = state.next_release(self.plan.cfg.trees)
        if RELEASES_KEY not in self.context.state.config_records:
            self.context.state[RELEASES_KEY] = ConfigRecord({"candidates": 0, "tree": 0, "threshold": 0})
        done = self.context.state.config_records[RELEASES_KEY]
        allowed = {"candidates": 1, "tree": self.plan.cfg.trees, "threshold": 1}
        replay = kind == "tree" and int(done[kind]) > len(state.trees)  # a tree this bank already released
        if kind is None or int(done[kind]) >= allowed[kind] or replay:
            raise ReleaseRefused("release not in the plan")
        done[kind] = int(done[kind]) + 1

    def fit(self, parameters: list[np.ndarray], config: dict[str, Scalar]) -> tuple[list[np.ndarray], int, dict]:
        step = int(config.get(STEP_KEY, 0))
        try:
            secagg_prg.require(config)
        except secagg_prg.PRGMismatch:
            logger.exception("dp_boost_bank_refused step=%d", step)
            raise ReleaseRefused("release not in the plan") from None
        try:
            state = BoostState.from_arrays(parameters)
        except Exception:  # noqa: BLE001 - any decoding failure is the same refusal, whatever the bytes were
            raise ReleaseRefused("malformed state from the server") from None
        self._charge(state)
        seed = self.context.node_config.get(NOISE_SEED_KEY)
        if seed is None:
            rng = np.random.default_rng()
        else:
            logger.warning("dp_boost_fixed_noise_seed: this bank's noise is predictable (tests only)")
            rng = np.random.default_rng([int(seed), step])
        try:
            residues, clean, noise, holders = bank_release(self.data, self.plan, state, rng)
        except Exception:  # noqa: BLE001 - the text goes back to the server: it must say nothing about the data
            logger.exception("dp_boost_bank_release_failed step=%d", step)
            raise ReleaseRefused("the release failed in the bank; see the bank's log") from None
        if self.observer is not None:
            self.observer(self.context.node_id, step, clean, noise)
        logger.info("dp_boost_bank step=%d cardholders=%d", step, holders)
        return [residues], 1, {}  # weight 1 = SecAgg+'s max_weight: Flower's quantization is then exact


def dp_boost_client_app(bank_for: Callable[[Context], tuple[FraudFeatures, BoostPlan]],
                        observer: BankRelease | None = None) -> ClientApp:
    """The banks' ClientApp: :func:`~fedfraud.training.fraud.dp_boost.bank_release` inside ``secaggplus_mod``."""

    def client_fn(context: Context) -> Any:
        data, plan = bank_for(context)
        return _Bank(data, plan, context, observer).to_client()

    return ClientApp(client_fn=client_fn, mods=[secaggplus_mod])

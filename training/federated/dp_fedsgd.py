"""Cardholder-level DP-FedSGD over Flower's SecAgg+: each bank sends its noised share masked; the server sees the sum.

The mechanism and its (ε, δ) argument are in :mod:`fedfraud.training.anomaly.distributed_dp`; this module is its
Flower wiring. Flower 1.41 has SecAgg+ only in its legacy API (``SecAggPlusWorkflow`` in a ``DefaultWorkflow``
over a ``LegacyContext`` and a ``flwr.server.strategy`` strategy on the server; ``secaggplus_mod`` around a
``NumPyClient`` in the bank), as :mod:`.secagg` explains.

Bank side (:func:`dp_client_app`): ``fit`` loads the server's trainable weights, computes
:func:`~fedfraud.training.anomaly.distributed_dp.bank_share` (clipped, rounded per-cardholder gradients, summed, plus
its Skellam share, mod ``M``) and returns the residues with weight 1; ``secaggplus_mod`` masks them. No metric
leaves the bank in a training round. The bank checks the plan the server names (a digest of every public setting
of the noise and field) against its own, refuses a step it already answered and any step past ``max_steps`` (its
budget in this run; :class:`DPBank`), and answers any refusal or failure with one fixed message (Flower returns an
exception's text to the server, so it must not depend on the bank's data).

Server side (:func:`run_dp_fedsgd`): one SecAgg+ round per DP-FedSGD step. Flower's quantizer maps a residue ``y``
in ``[0, M)`` with ``clipping_range = M`` and ``2M`` levels to ``y + M`` exactly (integers, nothing clipped or
rounded), sums ``m`` of them mod 2**32 without wrapping (``2·m·M ≤ 2**32``) and hands the strategy the mean as
floats; ``rint(mean·m)`` is the exact integer ``Σ y``, congruent to the noised sum mod ``M``. The strategy refuses a
round with fewer than ``t`` banks (SecAgg+ halts it first), decodes and applies the step
(:class:`~fedfraud.training.anomaly.distributed_dp.ServerStep`).

Evaluation (optional, ``evaluate_every``): a deployed run must choose the round to publish, as the in-process replay
does with each block's validation loss. Every ``evaluate_every`` rounds the strategy asks each bank for scalar
metrics of the current model (``DPBank.evaluate``); they are computed on the bank's validation and test cardholders
only, never on a training cardholder, so they are outside the training cardholders' (ε, δ) and the card says so
(``not_covered``). ``secaggplus_mod`` passes these messages through unmasked: they carry no gradient.

Noise draws: fresh OS entropy for the sample and the share; a node config ``dp-noise-seed`` fixes both (tests only:
whoever knows the seed can subtract the bank's share).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from flwr.app import ConfigRecord, Context
from flwr.client import NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server import LegacyContext, ServerConfig
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.serverapp import Grid

from fedfraud.training.federated import secagg_prg
from fedfraud.training.federated.ledger import ORDERS as LEDGER_ORDERS
from fedfraud.training.federated.ledger import LedgerEntry, PrivacyLedger
from fedfraud.training.federated.sum_strategy import SumOnlyStrategy
from fedfraud.training.anomaly.config import CardholderDPConfig
from fedfraud.training.anomaly.data import PairSet
from fedfraud.training.anomaly.distributed_dp import (
    SECAGG_MODULUS,
    BankShare,
    DistributedPlan,
    bank_share,
    load_trainable,
)
from fedfraud.training.anomaly.dpsgd import CardholderPool
from fedfraud.training.anomaly.model import AnomalyModel

secagg_prg.install()  # SecAgg+ masks keyed by the whole shared secret, on banks and server alike

__all__ = ["NOISE_SEED_KEY", "PLAN_KEY", "REFUSAL", "STEPS_KEY", "STEP_KEY", "BankEvaluation",
           "BankRefused", "DPBank", "DPFedSGDStrategy", "SumStep", "dp_client_app", "plan_digest", "run_dp_fedsgd",
           "secagg_workflow"]

logger = logging.getLogger(__name__)

#: The ledger's name for this mechanism.
_MECHANISM = "DP-FedSGD: Poisson-sampled cardholders, Skellam shares summed under SecAgg+"
#: Node-config key that seeds a bank's sample and noise (tests only).
NOISE_SEED_KEY = "dp-noise-seed"
#: Fit-config key: the DP-FedSGD round, so a seeded bank draws a fresh sample and share every round.
STEP_KEY = "dp-step"

#: Test hook: shown each bank's share (node id, round, share) before it is masked. Never set in a deployment.
ShareObserver = Callable[[int, int, BankShare], None]


class SumStep(Protocol):
    """What the strategy needs of the server's side: the public plan, a decoded sum to apply, what to send next.

    :class:`~fedfraud.training.anomaly.distributed_dp.ServerStep` (the anomaly model's DP-FedSGD) and
    :class:`~fedfraud.training.fraud.dp_boost.BoostServer` (the fraud model's DP boosting) are the two.
    """

    plan: DistributedPlan

    def apply(self, summed: np.ndarray, banks_summed: int) -> np.ndarray: ...

    def weights(self) -> list[np.ndarray]: ...


#: Fit-config key: the digest of the server's plan (:func:`plan_digest`); a bank refuses a round under another plan.
PLAN_KEY = "dp-plan"
#: The node's state record of the DP steps it answered in this run (count and last step).
STEPS_KEY = "dp-fedsgd-steps"
#: The only text a bank's failure sends back (the details stay in the bank's log).
REFUSAL = "the bank refused or failed this round; see the bank's log"


class BankRefused(RuntimeError):
    """A bank's refusal or failure, with :data:`REFUSAL` as its only text."""


def plan_digest(plan: DistributedPlan) -> str:
    """A short digest of every field of the plan: equal plans give equal digests on every party."""
    import hashlib

    return hashlib.sha256(repr(dataclasses.astuple(plan)).encode()).hexdigest()[:16]

#: A bank's metrics of the current model on its validation and test cardholders: ``model -> metrics``.
BankEvaluation = Callable[[AnomalyModel], dict[str, float]]


@dataclass
class DPBank:
    """What a bank's ClientApp holds across rounds: its model copy, its training cardholders and the public plan;
    ``evaluate`` scores its validation and test cardholders (None: the bank answers no evaluation); ``max_steps``
    caps the steps it answers in one run (0: no cap), so it never releases more than the accountant charged;
    ``ledger`` (with ``max_steps``) is charged the run's whole plan at its first step, and refuses the run past the
    bank's lifetime budget (:mod:`~fedfraud.training.federated.ledger`).
    """

    model: AnomalyModel
    sets: list[PairSet]
    pool: CardholderPool
    cfg: CardholderDPConfig
    plan: DistributedPlan
    evaluate: BankEvaluation | None = None
    max_steps: int = 0
    ledger: PrivacyLedger | None = None
    _entries: dict[int, LedgerEntry] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.ledger is not None and self.max_steps <= 0:
            raise ValueError("a ledger charges the run's whole plan: give max_steps")

    def answer_step(self, run_id: int, step: int) -> None:
        """Let the bank's ledger allow this step: the run's whole plan charged at its first step (refused past the
        lifetime budget), then no replayed step and none past ``max_steps``, counted on disk across restarts.
        """
        if self.ledger is None:
            return
        if run_id not in self._entries:
            self._entries[run_id] = LedgerEntry.of(f"flwr-run-{run_id}:{plan_digest(self.plan)}", _MECHANISM,
                                                   LEDGER_ORDERS, self.plan.rdp(self.max_steps), self.cfg.delta)
        self.ledger.answer(self._entries[run_id], step, self.max_steps)


class _Client(NumPyClient):
    def __init__(self, bank: DPBank, context: Context, observer: ShareObserver | None) -> None:
        self.bank = bank
        self.context = context
        self.observer = observer

    def get_parameters(self, config: dict[str, Scalar]) -> list[np.ndarray]:
        return []

    def _rngs(self, step: int) -> tuple[np.random.Generator, np.random.Generator]:
        seed = self.context.node_config.get(NOISE_SEED_KEY)
        if seed is None:
            return np.random.default_rng(), np.random.default_rng()
        logger.warning("dp_fedsgd_fixed_noise_seed: this bank's sample and noise are predictable (tests only)")
        return np.random.default_rng([int(seed), step, 0]), np.random.default_rng([int(seed), step, 1])

    def _charge(self, step: int, config: dict[str, Scalar]) -> None:
        """Refuse a round under another plan, a step answered before, or one past the run's budget; else count it."""
        named = config.get(PLAN_KEY)
        if named is not None and named != plan_digest(self.bank.plan):
            raise ValueError(f"the server's plan {named} is not this bank's {plan_digest(self.bank.plan)}")
        if STEPS_KEY not in self.context.state.config_records:
            self.context.state[STEPS_KEY] = ConfigRecord({"count": 0, "last": 0})
        done = self.context.state.config_records[STEPS_KEY]
        if step <= int(done["last"]):  # type: ignore[call-overload]
            raise ValueError(f"step {step} replays or precedes step {done['last']}")
        if self.bank.max_steps and int(done["count"]) >= self.bank.max_steps:  # type: ignore[call-overload]
            raise ValueError(f"the run's budget of {self.bank.max_steps} steps is spent")
        self.bank.answer_step(self.context.run_id, step)  # on disk: holds across a restart of this SuperNode
        done["count"], done["last"] = int(done["count"]) + 1, step  # type: ignore[call-overload]

    def fit(self, parameters: list[np.ndarray], config: dict[str, Scalar]) -> tuple[list[np.ndarray], int, dict]:
        step = int(config.get(STEP_KEY, 0))
        try:
            secagg_prg.require(config)
            self._charge(step, config)
            load_trainable(self.bank.model, parameters)
            self.bank.model.train()
            share = bank_share(self.bank.model, self.bank.sets, self.bank.pool, self.bank.cfg, self.bank.plan,
                               *self._rngs(step))
        except Exception:  # noqa: BLE001 - every refusal and failure answers the same text
            logger.exception("dp_fedsgd_bank_refused step=%d", step)
            raise BankRefused(REFUSAL) from None
        if self.observer is not None:
            self.observer(self.context.node_id, step, share)
        logger.info("dp_fedsgd_bank step=%d cardholders=%d clipped=%d", step, share.cardholders, share.clipped)
        return [share.residues], 1, {}  # weight 1 = SecAgg+'s max_weight: Flower's quantization is then exact

    def evaluate(self, parameters: list[np.ndarray], config: dict[str, Scalar]) -> tuple[float, int, dict]:
        try:
            if self.bank.evaluate is None:
                raise ValueError("this bank answers no evaluation")
            load_trainable(self.bank.model, parameters)
            self.bank.model.eval()
            metrics = self.bank.evaluate(self.bank.model)
        except Exception:  # noqa: BLE001 - as in fit
            logger.exception("dp_fedsgd_bank_evaluation_refused")
            raise BankRefused(REFUSAL) from None
        return float(metrics.get("val_loss", float("nan"))), 1, {k: float(v) for k, v in metrics.items()}


def dp_client_app(bank_for: Callable[[Context], DPBank], observer: ShareObserver | None = None) -> ClientApp:
    """The banks' ClientApp: :func:`bank_share` inside ``secaggplus_mod`` (the share is masked before it leaves)."""

    def client_fn(context: Context) -> Any:
        try:
            bank = bank_for(context)
        except Exception:  # noqa: BLE001 - a bank that cannot start answers the same fixed text
            logger.exception("dp_fedsgd_bank_setup_failed")
            raise BankRefused(REFUSAL) from None
        return _Client(bank, context, observer).to_client()

    return ClientApp(client_fn=client_fn, mods=[secaggplus_mod])


@dataclass
class DPFedSGDStrategy(SumOnlyStrategy):
    """Legacy strategy: all banks every round; the SecAgg+ aggregate decoded and applied by a :class:`ServerStep`.

    ``refused`` lists the rounds that summed fewer than t banks (not applied); ``sums`` the decoded integer sums
    (what the server learns, for logs and tests); a round SecAgg+ halts (fewer than t masked vectors) never reaches
    :meth:`aggregate_fit`, so ``len(sums)`` is the count of rounds applied. With ``evaluate_every`` = k > 0 every
    bank evaluates the model after rounds k, 2k, ... and ``on_evaluate`` receives their replies; ``on_round`` is
    told each round's number before it starts.

    A round waits up to ``wait_s`` for every bank, then sums the banks connected if they are at least t (the noise
    plan already covers t banks' shares); once a bank has missed that wait, later rounds do not wait for it again
    (it rejoins when it reconnects). With fewer than t banks the run stops: ``stopped_at`` is that round, and every
    later round is cancelled without a message (nothing is released, so nothing is charged).
    """

    server: SumStep
    observer: Callable[[int, list[tuple[ClientProxy, FitRes]]], None] | None = None
    refused: list[int] = field(default_factory=list)
    sums: list[np.ndarray] = field(default_factory=list)
    evaluate_every: int = 0
    on_evaluate: Callable[[int, list[tuple[ClientProxy, EvaluateRes]]], None] | None = None
    rounds: int = 0
    on_round: Callable[[int], None] | None = None
    wait_s: float = 600.0
    stopped_at: int = 0
    _waited_out: bool = False

    def _connected_banks(self, server_round: int, client_manager: ClientManager) -> list[ClientProxy]:
        """Every connected bank, after waiting (at most ``wait_s``, once) for all of them; none when fewer than t."""
        plan = self.server.plan
        if self.stopped_at:
            return []
        wait = 0 if self._waited_out else math.ceil(self.wait_s)
        if not client_manager.wait_for(plan.banks, timeout=wait) and not self._waited_out:
            self._waited_out = True
        # one snapshot (no second lookup that could block or shrink), at most the plan's banks: the field holds no more
        connected = list(client_manager.all().values())
        if len(connected) < plan.survivors:
            self.stopped_at = server_round
            logger.error("dp_fedsgd_stopped round=%d banks=%d of %d t=%d: too few banks connected to sum; the run "
                         "stops here", server_round, len(connected), plan.banks, plan.survivors)
            return []
        if len(connected) < plan.banks:
            logger.warning("dp_fedsgd_round round=%d sums the %d of %d banks connected (t=%d): the full noise now "
                           "holds against a server colluding with at most %d bank(s)", server_round, len(connected),
                           plan.banks, plan.survivors, len(connected) - plan.survivors)
        return random.sample(connected, min(len(connected), plan.banks))

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return ndarrays_to_parameters(self.server.weights())

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: ClientManager
                      ) -> list[tuple[ClientProxy, FitIns]]:
        clients = self._connected_banks(server_round, client_manager)
        if not clients:
            return []
        if self.on_round is not None:
            self.on_round(server_round)
        config: dict[str, Scalar] = {STEP_KEY: server_round, PLAN_KEY: plan_digest(self.server.plan),
                                     **secagg_prg.fit_config()}
        return [(c, FitIns(parameters, config)) for c in clients]

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                      failures: list[Any]) -> tuple[Parameters | None, dict[str, Scalar]]:
        if self.observer is not None:
            self.observer(server_round, results)
        m = len(results)
        if m > self.server.plan.banks:  # the field is sized for the plan's banks: a larger sum may have wrapped
            logger.error("dp_fedsgd_round_refused round=%d banks=%d above the plan's %d", server_round, m,
                         self.server.plan.banks)
            self.refused.append(server_round)
            return None, {}
        if m < self.server.plan.survivors:
            logger.error("dp_fedsgd_round_refused round=%d banks=%d t=%d", server_round, m, self.server.plan.survivors)
            self.refused.append(server_round)
            return None, {}
        mean = parameters_to_ndarrays(results[0][1].parameters)  # SecAgg+: every result carries the same aggregate
        if len(mean) != 1:
            raise ValueError(f"expected one aggregated array, got {len(mean)}")
        summed = np.rint(mean[0] * m).astype(np.int64)
        self.server.apply(summed, m)
        self.sums.append(summed)
        logger.info("dp_fedsgd_round round=%d banks=%d failures=%d", server_round, m, len(failures))
        return ndarrays_to_parameters(self.server.weights()), {}

    def configure_evaluate(self, server_round: int, parameters: Parameters, client_manager: ClientManager
                           ) -> list[tuple[ClientProxy, EvaluateIns]]:
        if self.evaluate_every <= 0 or server_round % self.evaluate_every or self.stopped_at:
            return []
        connected = list(client_manager.all().values())  # no wait: the banks the round just summed were connected
        clients = random.sample(connected, min(len(connected), self.server.plan.banks))
        config: dict[str, Scalar] = {STEP_KEY: server_round}
        return [(c, EvaluateIns(parameters, config)) for c in clients]

    def aggregate_evaluate(self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]],
                           failures: list[Any]) -> tuple[float | None, dict[str, Scalar]]:
        if failures:
            logger.warning("dp_fedsgd_evaluate round=%d failures=%d", server_round, len(failures))
        if self.on_evaluate is not None and results:
            self.on_evaluate(server_round, results)
        return None, {}


def secagg_workflow(plan: DistributedPlan, timeout_s: float | None = None) -> SecAggPlusWorkflow:
    """SecAgg+ for the plan: every bank of a round shares with all the others (``num_shares = 1.0``: the whole sample,
    so a round of fewer banks than planned still runs), t reconstructs; Flower's quantization made exact.
    """
    return SecAggPlusWorkflow(
        num_shares=1.0, reconstruction_threshold=plan.survivors, max_weight=1.0,
        clipping_range=float(plan.modulus), quantization_range=2 * plan.modulus, modulus_range=SECAGG_MODULUS,
        timeout=timeout_s,
    )


def run_dp_fedsgd(grid: Grid, context: Context, server: SumStep, rounds: int, timeout_s: float | None = None,
                  observer: Callable[[int, list[tuple[ClientProxy, FitRes]]], None] | None = None,
                  evaluate_every: int = 0,
                  on_evaluate: Callable[[int, list[tuple[ClientProxy, EvaluateRes]]], None] | None = None,
                  on_round: Callable[[int], None] | None = None,
                  ) -> DPFedSGDStrategy:
    """``rounds`` DP-FedSGD rounds over the connected banks under SecAgg+ (and, every ``evaluate_every`` rounds, the
    banks' evaluation); returns the strategy (sums, refusals).
    """
    strategy = DPFedSGDStrategy(server, observer, evaluate_every=evaluate_every, on_evaluate=on_evaluate,
                                rounds=rounds, on_round=on_round, wait_s=600.0 if timeout_s is None else timeout_s)
    legacy = LegacyContext(context, config=ServerConfig(num_rounds=rounds), strategy=strategy)
    DefaultWorkflow(fit_workflow=secagg_workflow(server.plan, timeout_s))(grid, legacy)
    return strategy

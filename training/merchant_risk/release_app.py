"""The daily merchant-risk release as a Flower app: SecAgg+ over the banks' noised vectors; the server learns the sum.

Bank side (``client``): the ClientApp reads the bank's own vector for the release day from its data folder (what
the bank's daily job wrote with :func:`~.release.save_release_vector`), clips it, adds its Skellam share and reduces
it modulo the field (:func:`~.release.encode_share`); Flower's ``secaggplus_mod`` then masks it. Server side
(``server``): ``SecAggPlusWorkflow`` inside a ``DefaultWorkflow``, one round. Flower 1.41 has SecAgg+ only in its
legacy API (a ``LegacyContext`` and a ``flwr.server.strategy`` strategy; the mod around a ``NumPyClient``), so the
server's strategy is a small legacy one: it gets the unmasked aggregate (Flower hands it over as the mean of the
banks' residues), turns it into the exact integer sum and decodes it (:func:`~.release.decode_sum`).

Both sides read the same run config (:data:`DEFAULT_SETTINGS`); the server sends the banks nothing else, so the
noise a bank adds does not depend on what the server asks for in a message. The bank's node config gives its
``data-dir``; ``merchant-noise-seed`` fixes its noise generator, for tests only (whoever knows the seed can take
the bank's share back out of the release). ``audit-dir`` makes the server write every reply it receives, as
Flower's own serialized messages, so that a test or an auditor can check what the server saw.

Deployed: ``flwr run apps/merchant_release <connection> --run-config "release-day=20500 num-banks=3"``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Context, Message, RecordDict
from flwr.client import NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import (
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    parameters_to_ndarrays,
)
from flwr.server import LegacyContext, ServerConfig
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.serverapp import Grid, ServerApp

from fedfraud.training.federated import secagg_prg
from fedfraud.training.federated.ledger import ORDERS, LedgerEntry, PrivacyLedger
from fedfraud.training.federated.sum_strategy import SumOnlyStrategy
from fedfraud.training.federated.grid import wait_for_nodes
from fedfraud.training.merchant_risk.config import MerchantNoiseConfig, MerchantRiskConfig
from fedfraud.training.merchant_risk.dp import ACCOUNTANT
from fedfraud.training.merchant_risk.release import (
    SECAGG_MODULUS,
    ReleasePlan,
    decode_sum,
    encode_share,
    load_release_vector,
    plan_release,
)

secagg_prg.install()  # SecAgg+ masks keyed by the whole shared secret, on banks and server alike

__all__ = [
    "DEFAULT_SETTINGS",
    "NOISE_SEED_KEY",
    "AuditGrid",
    "ReleaseResult",
    "ReleaseSettings",
    "client",
    "read_audit",
    "release_card",
    "run_release",
    "server",
]

logger = logging.getLogger(__name__)

#: The run config of the app (``apps/merchant_release/pyproject.toml`` holds the same values).
DEFAULT_SETTINGS: dict[str, Any] = {
    "release-day": 0,
    "num-banks": 3,
    "merchant-risk": "",
    "merchant-noise": "",
    "out-dir": "artifacts/merchant-release",
    "audit-dir": "",
    "timeout-s": 300.0,
}
#: Node-config key that seeds a bank's noise (tests only).
NOISE_SEED_KEY = "merchant-noise-seed"
#: The only text a bank's refusal sends back (the details stay in the bank's log).
REFUSAL = "the bank refused this release; see the bank's log"
_LEDGER_MECHANISM = "merchant-risk release: Skellam shares summed under SecAgg+"


@dataclass(frozen=True)
class ReleaseSettings:
    """The run config, typed: the day, the federation's size, the statistics' and the noise's settings."""

    release_day: int
    banks: int
    risk: MerchantRiskConfig
    noise: MerchantNoiseConfig
    out_dir: str
    audit_dir: str
    timeout_s: float

    @classmethod
    def of(cls, run_config: Mapping[str, Any]) -> ReleaseSettings:
        """From a Flower run config (missing keys: :data:`DEFAULT_SETTINGS`; JSON ``""``: the defaults)."""
        cfg = {**DEFAULT_SETTINGS, **run_config}
        unknown = set(cfg) - set(DEFAULT_SETTINGS)
        if unknown:
            raise ValueError(f"unknown run-config keys: {sorted(unknown)}")
        risk, noise = str(cfg["merchant-risk"]), str(cfg["merchant-noise"])
        return cls(int(cfg["release-day"]), int(cfg["num-banks"]),
                   MerchantRiskConfig.model_validate_json(risk) if risk else MerchantRiskConfig(),
                   MerchantNoiseConfig.model_validate_json(noise) if noise else MerchantNoiseConfig(),
                   str(cfg["out-dir"]), str(cfg["audit-dir"]), float(cfg["timeout-s"]))

    def plan(self) -> ReleasePlan:
        """The release plan both sides derive from these settings."""
        return plan_release(self.risk, self.noise, self.banks)


# ---- bank side ----------------------------------------------------------------------------------------------


def _bank_rng(node_config: Mapping[str, Any], day: int) -> np.random.Generator:
    """Fresh OS entropy, or (tests) the node's fixed seed and the day."""
    seed = node_config.get(NOISE_SEED_KEY)
    if seed is None:
        return np.random.default_rng()
    logger.warning("merchant_release_fixed_noise_seed: this bank's noise is predictable (tests only)")
    return np.random.default_rng([int(seed), int(day)])


class _Bank(NumPyClient):
    """One bank: its clipped vector + its noise share, mod the field; never the vector itself."""

    def __init__(self, context: Context) -> None:
        self.context = context

    def get_parameters(self, config: dict[str, Scalar]) -> list[np.ndarray]:
        return []

    def fit(self, parameters: list[np.ndarray], config: dict[str, Scalar]) -> tuple[list[np.ndarray], int, dict]:
        settings = ReleaseSettings.of(self.context.run_config)
        plan = settings.plan()
        data_dir = Path(str(self.context.node_config["data-dir"]))
        try:  # charged to the bank's ledger before anything is computed or sent; past its budget, refused
            secagg_prg.require(config)
            PrivacyLedger.for_node(self.context.node_config).charge(LedgerEntry.of(
                f"flwr-run-{self.context.run_id}:merchant-release-{settings.release_day}", _LEDGER_MECHANISM,
                ORDERS, plan.rdp(settings.risk, ORDERS), settings.noise.delta))
        except Exception:  # noqa: BLE001 - one fixed text leaves the bank; the details stay in its log
            logger.exception("merchant_release_bank_refused day=%d", settings.release_day)
            raise RuntimeError(REFUSAL) from None
        vector = load_release_vector(data_dir, settings.release_day, settings.risk)
        share = encode_share(vector, plan, _bank_rng(self.context.node_config, settings.release_day))
        logger.info("merchant_release_bank day=%d shape=%s field_bits=%d", settings.release_day, vector.shape,
                    plan.field_bits)
        return [share], 1, {}  # weight 1 = SecAgg+'s max_weight: Flower's quantization is then exact


def _client_fn(context: Context) -> Any:
    return _Bank(context).to_client()


#: The ClientApp: SecAgg+ masks what the bank's fit returns before it leaves the bank.
client = ClientApp(client_fn=_client_fn, mods=[secaggplus_mod])


# ---- server side --------------------------------------------------------------------------------------------


class AuditGrid(Grid):
    """A Grid that writes every reply the server receives (Flower's serialized ``Message``) under ``folder``.

    Why: the claim "the server sees only masked vectors" is checked on what it really received.
    """

    def __init__(self, inner: Grid, folder: Path) -> None:
        self.inner = inner
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.count = 0

    def _record(self, messages: Iterable[Message]) -> list[Message]:
        from flwr.common.serde import message_to_proto

        out = list(messages)
        for msg in out:
            path = self.folder / f"{self.count:05d}-{msg.metadata.src_node_id}.msg"
            path.write_bytes(message_to_proto(msg).SerializeToString())
            self.count += 1
        return out

    def set_run(self, run: Any) -> None:
        self.inner.set_run(run)

    @property
    def run(self) -> Any:
        return self.inner.run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return self.inner.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self.inner.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.inner.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self._record(self.inner.pull_messages(message_ids))

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self._record(self.inner.send_and_receive(messages, timeout=timeout))


def read_audit(folder: Path) -> list[Message]:
    """The replies an :class:`AuditGrid` recorded, in the order received."""
    from flwr.common.serde import message_from_proto
    from flwr.proto.message_pb2 import Message as ProtoMessage  # type: ignore[attr-defined]

    return [message_from_proto(ProtoMessage.FromString(p.read_bytes())) for p in sorted(Path(folder).glob("*.msg"))]


class _ReleaseStrategy(SumOnlyStrategy):
    """One SecAgg+ round over all banks; keeps the decoded sum. Nothing to train or evaluate."""

    def __init__(self, plan: ReleasePlan) -> None:
        self.plan = plan
        self.release: np.ndarray | None = None
        self.summed = 0

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return Parameters(tensors=[], tensor_type="numpy.ndarray")  # no model: never ask a bank for one

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: ClientManager
                      ) -> list[tuple[ClientProxy, FitIns]]:
        clients = client_manager.sample(num_clients=self.plan.banks, min_num_clients=self.plan.banks)
        return [(c, FitIns(parameters, dict(secagg_prg.fit_config()))) for c in clients]

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                      failures: list[Any]) -> tuple[Parameters | None, dict[str, Scalar]]:
        if not results:
            return None, {}
        # SecAgg+ gives every result the same unmasked aggregate: the mean of the m residue vectors
        mean = parameters_to_ndarrays(results[0][1].parameters)
        if len(mean) != 1:
            raise ValueError(f"expected one aggregated array, got {len(mean)}")
        self.summed = len(results)
        self.release = decode_sum(np.rint(mean[0] * self.summed).astype(np.int64), self.plan)
        logger.info("merchant_release_summed banks=%d failures=%d", self.summed, len(failures))
        return None, {}


@dataclass(frozen=True)
class ReleaseResult:
    """One day's release as the server decoded it, with its privacy card."""

    release_day: int
    release: np.ndarray
    banks_summed: int
    plan: ReleasePlan
    card: dict[str, Any]

    def save(self, folder: Path) -> Path:
        """``release-<day>.npz`` (the int64 release) and ``release-<day>.json`` (the card) under ``folder``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(folder / f"release-{self.release_day}.npz", release=self.release)
        path = folder / f"release-{self.release_day}.json"
        path.write_text(json.dumps(self.card, indent=1), encoding="utf-8")
        return path


def release_card(settings: ReleaseSettings, plan: ReleasePlan, banks_summed: int) -> dict[str, Any]:
    """What a release's reader must know: mechanism, noise, (ε, δ) per cardholder per release and per period."""
    def finite(x: float) -> float | str:
        return x if math.isfinite(x) else "inf"

    noise = settings.noise
    return {
        "release_day": settings.release_day,
        "banks": plan.banks,
        "banks_summed": banks_summed,
        "survivors_min": plan.survivors,
        "unit_of_privacy": "one cardholder (add/remove), bounded per window by the vector's per-cardholder bound",
        "mechanism": "each bank clips its counts to count_cap and adds Skellam noise of variance σ²/t per entry; "
                     "SecAgg+ sums the masked residues mod 2**field_bits",
        "noise_std_min": plan.noise_std,
        "noise_std": plan.noise_std * math.sqrt(banks_summed / plan.survivors),
        "count_cap": plan.count_cap,
        "field_bits": plan.field_bits,
        "sensitivity_l1": settings.risk.sensitivity_l1(),
        "sensitivity_l2": settings.risk.sensitivity_l2(),
        "delta": noise.delta,
        "epsilon_per_release": finite(plan.epsilon(1, noise.delta, settings.risk)),
        "period_days": noise.period_days,
        "epsilon_period": finite(plan.epsilon(noise.period_days, noise.delta, settings.risk)),
        "accountant": ACCOUNTANT,
    }


def run_release(grid: Grid, context: Context) -> ReleaseResult:
    """Run one day's release over ``num-banks`` connected banks under SecAgg+; save it to ``out-dir``.

    Raises:
        RuntimeError: fewer banks connected than asked for, or SecAgg+ halted (fewer than t banks answered).
    """
    settings = ReleaseSettings.of(context.run_config)
    plan = settings.plan()
    if plan.banks < 3 or not 2 <= plan.survivors < plan.banks:
        raise ValueError(f"SecAgg+ needs >= 3 banks and 2 <= t < banks, got banks={plan.banks} t={plan.survivors}")
    connected = wait_for_nodes(grid, plan.banks, timeout_s=settings.timeout_s)
    if len(connected) < plan.banks:
        raise RuntimeError(f"{len(connected)} of {plan.banks} banks connected within {settings.timeout_s:.0f} s")
    seen = AuditGrid(grid, Path(settings.audit_dir)) if settings.audit_dir else grid
    strategy = _ReleaseStrategy(plan)
    workflow = SecAggPlusWorkflow(
        num_shares=plan.banks, reconstruction_threshold=plan.survivors, max_weight=1.0,
        clipping_range=float(plan.modulus), quantization_range=2 * plan.modulus, modulus_range=SECAGG_MODULUS,
        timeout=settings.timeout_s,
    )
    legacy = LegacyContext(context, config=ServerConfig(num_rounds=1), strategy=strategy)
    DefaultWorkflow(fit_workflow=workflow)(seen, legacy)
    if strategy.release is None:
        raise RuntimeError(f"no release for day {settings.release_day}: SecAgg+ halted (fewer than "
                           f"{plan.survivors} banks answered)")
    result = ReleaseResult(settings.release_day, strategy.release, strategy.summed, plan,
                           release_card(settings, plan, strategy.summed))
    if settings.out_dir:
        result.save(Path(settings.out_dir))
    logger.info("merchant_release day=%d banks=%d noise_std=%.2f eps_release=%s eps_%dd=%s",
                settings.release_day, strategy.summed, result.card["noise_std"], result.card["epsilon_per_release"],
                settings.noise.period_days, result.card["epsilon_period"])
    return result


#: The ServerApp.
server = ServerApp()


@server.main()
def _main(grid: Grid, context: Context) -> None:
    run_release(grid, context)

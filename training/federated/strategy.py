"""FedProx with the anomaly run's bookkeeping (global round numbers, per-bank metrics, checkpoints, progress), and
the client-level DP wrapper around it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    FedAvg,
    FedMedian,
    FedProx,
    FedTrimmedAvg,
    Krum,
    MultiKrum,
    Strategy,
)
from tqdm.auto import tqdm

from fedfraud.training.anomaly.run import Checkpoint, RoundRecord, log_round
from fedfraud.training.federated.accountant import DPRound
from fedfraud.training.federated.config import FederatedConfig
from fedfraud.training.federated.dsfl import DSFLAggregate

__all__ = [
    "EQUAL_WEIGHT_KEY",
    "AnomalyFedProx",
    "BankLevelDP",
    "ReplyObserver",
    "aggregator",
    "banks_per_round",
    "dp_sensitivity_factor",
]

logger = logging.getLogger(__name__)

#: Called with ("train" | "evaluate", global round, replies) before aggregation; tests audit what arrives.
ReplyObserver = Callable[[str, int, list[Message]], None]

#: Metric every bank reports as 1; under DP the average weighs banks by it (equal weights), not by example counts.
EQUAL_WEIGHT_KEY = "equal-weight"


def banks_per_round(banks: int, fraction_train: float) -> int:
    """How many banks FedAvg samples per round (its own rule, with ``min_train_nodes`` as set by the server)."""
    min_train = max(1, min(banks, round(fraction_train * banks)))
    return max(int(banks * fraction_train), min_train)


def _kept(fed: FederatedConfig, n: int) -> int:
    """Updates MultiKrum averages out of ``n``: ``multikrum_keep``, else n − f, and at least two when two banks
    answered, so that the global model is never one bank's update released verbatim (Krum's flaw; at n = 2 and
    f = 1 that makes it the mean).
    """
    return max(min(n, 2), min(n, fed.multikrum_keep or n - fed.byzantine_banks))


def aggregator(fed: FederatedConfig, banks: int, weighted_by_key: str) -> FedAvg | None:
    """Flower's robust rule named by ``federated.aggregation`` (Message API strategies), DSFL's contribution
    weighting (:class:`~.dsfl.DSFLAggregate`), or None for FedAvg.

    Only its ``aggregate_train`` is used: :class:`AnomalyFedProx` keeps sampling, FedProx's μ in the train config
    and the bookkeeping, so the proximal term stays on the clients whatever the server's rule.
    """
    common: dict[str, object] = {"min_available_nodes": banks, "weighted_by_key": weighted_by_key}
    n = banks_per_round(banks, fed.fraction_train)
    if fed.aggregation == "fedavg":
        return None
    if fed.aggregation == "dsfl":
        return DSFLAggregate(fed.dsfl, **common)  # type: ignore[arg-type]
    if fed.aggregation == "fedmedian":
        return FedMedian(**common)  # type: ignore[arg-type]
    if fed.aggregation == "fedtrimmedavg":
        if int(fed.trim_beta * n) == 0:
            logger.warning("trim-beta=%g cuts no bank out of %d per round: FedTrimmedAvg is the plain mean",
                           fed.trim_beta, n)
        return FedTrimmedAvg(beta=fed.trim_beta, **common)  # type: ignore[arg-type]
    if fed.aggregation in ("krum", "multikrum") and n < 2 * fed.byzantine_banks + 3:
        logger.warning("%s tolerates f=%d malicious banks only with n >= 2f + 3 per round, not %d: the selection "
                       "stands but carries no Byzantine guarantee%s", fed.aggregation, fed.byzantine_banks, n,
                       " (multikrum averages at least two updates, so with two banks it is their mean)"
                       if fed.aggregation == "multikrum" else "")
    if fed.aggregation == "krum":
        return Krum(num_malicious_nodes=fed.byzantine_banks, **common)  # type: ignore[arg-type]
    return MultiKrum(
        num_malicious_nodes=fed.byzantine_banks, num_nodes_to_select=_kept(fed, n), **common  # type: ignore[arg-type]
    )


def dp_sensitivity_factor(fed: FederatedConfig, n: int) -> float:
    """How much more one bank can move the aggregate under ``federated.aggregation`` than under the mean.

    The accountant's noise multiplier z is relative to the L2 sensitivity of
    the aggregate to one bank whose clipped update (‖u‖ ≤ C) is replaced by
    zero: C/n for the mean of n banks, which Flower's wrapper assumes (noise
    std z·C/n). The robust rules have larger bounds, each a change between
    two outputs that lie in a known ball: Krum/MultiKrum output one or the
    mean of several clipped updates (‖·‖ ≤ C) and the selection can switch,
    so 2C; the coordinate-wise median m has m_j² ≤ (2/n)·Σ_i x_ij² (at least
    half the banks are at least as far from 0 on every coordinate), so
    ‖m‖ ≤ √2·C and 2√2·C; the trimmed mean of k kept values has
    ‖t‖² ≤ (n/k)·C², so 2·√(n/k)·C. The noise is scaled by this factor so the
    card's (ε, δ) still holds; Flower's own accountant refuses anything but
    FedAvg's aggregate for the same reason.
    """
    if fed.aggregation == "fedavg":
        return 1.0
    if fed.aggregation == "dsfl":
        raise ValueError("aggregation dsfl carries its own noise (dsfl-*); federated.dp does not apply to it")
    if fed.aggregation in ("krum", "multikrum"):
        bound = 2.0
    elif fed.aggregation == "fedmedian":
        bound = 2.0 * math.sqrt(2.0)
    else:
        kept = max(1, n - 2 * int(fed.trim_beta * n))
        bound = 2.0 * math.sqrt(n / kept)
    return bound * n


class AnomalyFedProx(FedProx):
    """FedProx (FedAvg on the server, ``proximal-mu`` sent to clients) that checkpoints after every round.

    With ``robust`` (:func:`aggregator`) the server combines the models with
    that rule instead of the mean; the clients still get μ and train FedProx.

    Rounds are numbered globally: a run resumed after round ``offset`` calls
    its first round ``offset + 1`` (clients seed their sampling with it, so a
    resumed run draws the same samples as an uninterrupted one). Per-bank
    metrics are keyed by the ``partition-id`` each client reports.
    """

    def __init__(
        self,
        *,
        checkpoint: Checkpoint,
        directory: Path,
        total_rounds: int,
        observer: ReplyObserver | None = None,
        dp_round: DPRound | None = None,
        robust: FedAvg | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.dp_round = dp_round
        self.robust = robust
        self.checkpoint = checkpoint
        self.directory = directory
        self.total_rounds = total_rounds
        self.observer = observer
        self.offset = checkpoint.round
        self._arrays: ArrayRecord | None = None
        self._train_loss = math.nan
        self._started = time.perf_counter()
        self._bar = tqdm(total=total_rounds, initial=self.offset, desc="federated rounds", unit="round")

    def global_round(self, server_round: int) -> int:
        return self.offset + server_round

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._started = time.perf_counter()
        config["global-round"] = self.global_round(server_round)
        if isinstance(self.robust, DSFLAggregate):  # DSFL weighs the banks' updates against this round's model
            self.robust.received = arrays
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        if self.observer is not None:
            self.observer("train", self.global_round(server_round), replies)
        losses = []
        for reply in replies:
            if reply.has_error():
                continue
            m = reply.content["metrics"]
            bank = int(m["partition-id"])
            losses.append(float(m["train-loss"]))
            self.checkpoint.privacy[bank] = {
                "cardholders": int(m["cardholders"]),
                "mu_gdp": float(m["mu-gdp"]),
                "epsilon_min": float(m["epsilon-min"]),
                "epsilon_mean": float(m["epsilon-mean"]),
                "epsilon_max": float(m["epsilon-max"]),
                "delta": float(m["delta"]),
            }
        self._train_loss = float(sum(losses) / len(losses)) if losses else math.nan
        if self.robust is not None:  # the robust rule instead of the mean
            # Flower's FedMedian/FedTrimmedAvg pop the arrays out of the replies; put the same Array objects back so
            # the replies stay whole for observers and wrappers (no copy of the data)
            kept = [dict(r.content["arrays"].items()) for r in replies if not r.has_error()]
            arrays, metrics = self.robust.aggregate_train(server_round, replies)
            for reply, saved in zip([r for r in replies if not r.has_error()], kept, strict=True):
                for key, value in saved.items():
                    reply.content["arrays"][key] = value
        else:
            arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is not None:
            # one more release for the accountant; written before the (noised) model goes out to the banks
            ledger = self.dp_round or DPRound(0.0, 0.0, max(1, len(replies)))
            self.checkpoint.dp_ledger.append(vars(ledger).copy())
            if self.dp_round is not None:
                self.checkpoint.save(self.directory)
        return arrays, metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._arrays = arrays  # the global model as released (after the DP wrapper's noise, when there is one)
        config["global-round"] = self.global_round(server_round)
        return super().configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        replies = list(replies)
        rnd = self.global_round(server_round)
        if self.observer is not None:
            self.observer("evaluate", rnd, replies)
        per_bank: dict[int, dict[str, float]] = {}
        for reply in replies:
            if reply.has_error():
                logger.warning("round=%d evaluate reply error: %s", rnd, reply.error.reason)
                continue
            m = reply.content["metrics"]
            per_bank[int(m["partition-id"])] = {
                k.replace("-", "_"): float(v)
                for k, v in m.items()
                if k not in ("num-examples", "partition-id", EQUAL_WEIGHT_KEY)
            }
        aggregated = super().aggregate_evaluate(server_round, replies)
        if per_bank and self._arrays is not None:
            record = RoundRecord(rnd, self._train_loss, per_bank, time.perf_counter() - self._started)
            self.checkpoint.offer(record, self._arrays.to_torch_state_dict())
            self.checkpoint.save(self.directory)
            log_round(record, self.total_rounds, "federated")
            self._bar.update(1)
        else:
            logger.warning("round=%d produced no evaluation; no checkpoint written", rnd)
        return aggregated

    def close(self) -> None:
        self._bar.close()


class BankLevelDP(DifferentialPrivacyClientSideFixedClipping):
    """Client-level DP around :class:`AnomalyFedProx`: banks clip, the server adds Gaussian noise to the average.

    Why client-side fixed clipping: the L2 bound is applied inside the bank
    (``fixedclipping_mod`` in the ClientApp), so an unclipped update never
    leaves it; fixed, not adaptive, because adaptive clipping spends budget on
    the clipped-count query and the RDP accountant covers the Gaussian release
    of the fixed-norm sum. With five banks the unit of privacy is a bank's
    whole update, not a cardholder. The noise, std ``z·C/n`` on the mean of
    ``n`` equally weighted banks, is added by the server, which therefore sees
    each clipped update without noise: the (ε, δ) holds for the released
    models, not against the server. A round with fewer replies than
    ``num_sampled_clients`` is not released (the noise was sized for ``n``).
    """

    def __init__(self, strategy: Strategy, noise_multiplier: float, clipping_norm: float, banks: int) -> None:
        super().__init__(strategy, noise_multiplier, clipping_norm, banks)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        usable = sum(not r.has_error() for r in replies)
        if usable != self.num_sampled_clients:
            logger.warning(
                "round=%d dp: %d usable replies, noise is sized for %d; round not released",
                server_round,
                usable,
                self.num_sampled_clients,
            )
            return None, None
        return super().aggregate_train(server_round, replies)

"""FedProx with the anomaly run's bookkeeping: global round numbers, per-bank metrics, checkpoints, progress."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedProx
from tqdm.auto import tqdm

from training.anomaly.run import Checkpoint, RoundRecord, log_round

__all__ = ["AnomalyFedProx", "ReplyObserver"]

logger = logging.getLogger(__name__)

#: Called with ("train" | "evaluate", global round, replies) before aggregation; tests audit what arrives.
ReplyObserver = Callable[[str, int, list[Message]], None]


class AnomalyFedProx(FedProx):
    """FedProx (FedAvg on the server, ``proximal-mu`` sent to clients) that checkpoints after every round.

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
        **kwargs: object,
    ) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
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
        arrays, metrics = super().aggregate_train(server_round, replies)
        self._arrays = arrays
        return arrays, metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        config["global-round"] = self.global_round(server_round)
        config["fraud-eval"] = self.global_round(server_round) == self.total_rounds
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
                k.replace("-", "_"): float(v) for k, v in m.items() if k not in ("num-examples", "partition-id")
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

"""FED-SPFD ServerApp: the shared scaler query, then each job's warm start, rounds and federated threshold.

:class:`SpfdFedAvg` subclasses Flower's FedAvg (Message API). Per round it sends the global shared-embedding
statistics with the model (``stats`` ArrayRecord: mean and covariance), averages the replies' federated arrays
weighted by training rows (Algorithm 1, lines 15–17), and sums the banks' embedding sums (count, Σ z, Σ z zᵀ)
into the next round's global statistics (lines 18–20, from sums: the pooled mean and covariance). Before the
first training round one query collects those sums under the warm-started encoder, so round 1 aligns too.

After the last round each bank sends its validation score histogram; the server applies the fraud model's
max-F1 rule (:func:`fedfraud.training.fraud.metrics.threshold_from_histograms`) to their sum.

Under ``aggregation: dsfl`` (:mod:`fedfraud.training.fraud.dsfl`) the banks noise their updates of the federated
arrays in every warm-start and training round, and the server moves them by DSFL's contribution weights instead
of the row-weighted mean; the embedding statistics flow as before (not covered by DSFL's noise).

Settings (kebab-case) from :func:`build_server_app` / :func:`run_jobs`: ``features-dir``, ``shared`` (JSON list),
``spfd-config`` (JSON), ``jobs`` (JSON list of :class:`~.task.SpfdJob`), ``num-supernodes``, ``threshold-bins``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from fedfraud.training.federated.dsfl_mod import ROUND_OFFSET_KEY
from fedfraud.training.federated.grid import connected_banks, send_to_all
from fedfraud.training.fraud.dsfl import DSFLPlan, dp_off
from fedfraud.training.fraud.gnn.model import ScalerSums
from fedfraud.training.fraud.gnn.server_app import validation_threshold
from fedfraud.training.fraud.spfd.config import SpfdConfig
from fedfraud.training.fraud.spfd.model import EmbeddingSums
from fedfraud.training.fraud.spfd.task import SCALER_ARRAYS, SpfdJob, build_net, federated_arrays

__all__ = ["SpfdFedAvg", "SpfdJobResult", "app", "build_server_app", "run_jobs", "sums_of"]

log = logging.getLogger(__name__)

#: What leaves a FED-SPFD bank beside its federated arrays, which DSFL's noise does not cover.
SIDE_CHANNELS = ("per-column scaler sums of the bank's transformed shared training columns (once), the count, sum "
                 "and sum of outer products of its training rows' shared embeddings (before the first round and "
                 "every round, under alignment), the validation score histograms and the loss metrics leave each "
                 "bank without noise")


def sums_of(metrics: Any, dim: int) -> EmbeddingSums:
    """A bank's embedding sums from its reply's metrics."""
    return EmbeddingSums(float(metrics["emb-count"]), np.asarray(metrics["emb-total"], dtype=np.float64),
                         np.asarray(metrics["emb-outer"], dtype=np.float64).reshape(dim, dim))


class SpfdFedAvg(FedAvg):
    """FedAvg over the federated arrays (DSFL's contribution weighting with a ``dsfl`` plan), carrying the global
    embedding statistics round to round.
    """

    def __init__(self, job: SpfdJob, cfg: SpfdConfig, min_nodes: int, stats: EmbeddingSums | None = None,
                 dsfl: DSFLPlan | None = None) -> None:
        super().__init__(fraction_evaluate=0.0, min_train_nodes=min_nodes, min_available_nodes=min_nodes)
        self.job, self.cfg, self.stats, self.dsfl = job, cfg, stats, dsfl
        self.history: list[dict[str, Any]] = []

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(job={self.job.name}, align={self.job.align}, private={self.job.private})"

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
                        ) -> Iterable[Message]:
        messages = list(super().configure_train(server_round, arrays, config, grid))
        if self.dsfl is not None:
            self.dsfl.received = arrays
        if self.job.align and self.stats is not None:
            mean, cov = self.stats.mean_cov()
            record = ArrayRecord({"mean": Array(mean.astype(np.float32)), "cov": Array(cov.astype(np.float32))})
            for msg in messages:
                msg.content["stats"] = record
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid, _ = self._check_and_log_replies(replies, is_train=True)
        if not valid:
            return None, None
        valid.sort(key=lambda m: m.metadata.src_node_id)
        contents = [m.content for m in valid]
        metrics = [next(iter(c.metric_records.values())) for c in contents]
        extra: dict[str, Any] = {}
        arrays: ArrayRecord | None
        if self.dsfl is not None:
            arrays, weights = self.dsfl.aggregate(server_round, valid)
            extra["dsfl_weights"] = weights.tolist()
        else:
            arrays = aggregate_arrayrecords(contents, "num-examples")
        examples = [float(m["num-examples"]) for m in metrics]  # type: ignore[arg-type]
        losses = {k: float(np.average([float(m[k]) for m in metrics], weights=examples))  # type: ignore[arg-type]
                  for k in metrics[0] if str(k).startswith("loss-")}
        if self.job.align and "emb-count" in metrics[0]:
            parts = [sums_of(m, self.cfg.embed_dim) for m in metrics]
            total = parts[0]
            for p in parts[1:]:
                total = total + p
            self.stats = total
        self.history.append({"round": server_round, **losses, **extra})
        log.info("spfd_round job=%s round=%d %s", self.job.name, server_round,
                 " ".join(f"{k}={v:.4f}" for k, v in losses.items()))
        return arrays, MetricRecord(dict(losses))


@dataclass(frozen=True)
class SpfdJobResult:
    """One job's global arrays, its federated threshold and what it was chosen on."""

    job: SpfdJob
    arrays: dict[str, np.ndarray]
    threshold: float
    valid_f1: float
    valid_pr_auc: float
    seconds: float
    history: list[dict[str, Any]]
    client_dp: dict[str, Any]


def run_jobs(grid: Grid, settings: dict[str, Any], on_result: Callable[[SpfdJobResult], None]) -> None:
    """The whole session: the shared scaler once, then every job (warm start, rounds, the federated threshold)."""
    banks = int(settings["num-supernodes"])
    nodes = connected_banks(grid, banks)
    shared = tuple(json.loads(settings["shared"]))
    base = SpfdConfig.model_validate_json(settings["spfd-config"])
    common = {"features-dir": str(settings["features-dir"]), "shared": settings["shared"],
              "spfd-config": settings["spfd-config"]}
    replies = send_to_all(grid, nodes, RecordDict({"config": ConfigRecord({**common, "what": "scaler"})}),
                    MessageType.QUERY)
    scaler: ScalerSums | None = None
    for r in replies:
        rec = r.content["sums"]
        part = ScalerSums(rec["count"].numpy(), rec["total"].numpy(), rec["squares"].numpy())
        scaler = part if scaler is None else scaler + part
    assert scaler is not None
    for raw in json.loads(settings["jobs"]):
        job = SpfdJob.from_json(json.dumps(raw))
        cfg = job.config(base)
        started = time.perf_counter()
        net = build_net(shared, (), cfg, job.seed)
        net.shared.set_scaler(scaler)
        arrays = ArrayRecord({k: Array(v) for k, v in federated_arrays(net, job).items()})
        config = {**common, "job": job.to_json()}
        # DSFL: every warm-start and training round sends the federated arrays, so all of them are charged
        plan = (DSFLPlan.of(cfg.dsfl, cfg.warm_rounds + cfg.rounds, arrays, SCALER_ARRAYS)
                if cfg.aggregation == "dsfl" else None)
        noise = plan.config() if plan else {}
        log.info("spfd_job_start job=%s align=%s private=%s local_head=%s seed=%d warm=%d rounds=%d", job.name,
                 job.align, job.private, job.local_head, job.seed, cfg.warm_rounds, cfg.rounds)
        if cfg.warm_rounds:
            warm = SpfdFedAvg(job, cfg, banks, dsfl=plan)
            arrays = warm.start(grid=grid, initial_arrays=arrays, num_rounds=cfg.warm_rounds,
                                train_config=ConfigRecord({**config, **noise, "phase": "warm"})).arrays
        stats = None
        if job.align:
            got = send_to_all(grid, nodes, RecordDict({"arrays": arrays, "config": ConfigRecord(
                {**config, "what": "embeddings"})}), MessageType.QUERY)
            parts = [sums_of(next(iter(m.content.metric_records.values())), cfg.embed_dim) for m in got]
            stats = parts[0]
            for p in parts[1:]:
                stats = stats + p
        strategy = SpfdFedAvg(job, cfg, banks, stats, dsfl=plan)
        final = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=cfg.rounds, train_config=ConfigRecord(
            {**config, **noise, "phase": "train", ROUND_OFFSET_KEY: cfg.warm_rounds})).arrays
        threshold, f1, ap = validation_threshold(grid, nodes, final, dict(config), int(settings["threshold-bins"]))
        seconds = time.perf_counter() - started
        log.info("spfd_job_done job=%s threshold=%.4f valid_f1=%.4f valid_pr_auc=%.4f seconds=%.1f", job.name,
                 threshold, f1, ap, seconds)
        client_dp = (plan.card(banks, SIDE_CHANNELS, SCALER_ARRAYS) if plan
                     else dp_off("aggregation fedavg: the federated arrays and embedding statistics leave the banks "
                                 "in clear"))
        on_result(SpfdJobResult(job, {k: v.numpy() for k, v in final.items()}, threshold, f1, ap, seconds,
                                strategy.history, client_dp))


def build_server_app(settings: dict[str, Any], on_result: Callable[[SpfdJobResult], None]) -> ServerApp:
    """A ServerApp running :func:`run_jobs` with ``settings`` (a simulation passes ``on_result``)."""
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        run_jobs(grid, settings, on_result)

    return server


#: ``flwr run`` needs a module-level app; it takes its settings from the run config.
app = ServerApp()


@app.main()
def _main(grid: Grid, context: Context) -> None:
    run_jobs(grid, dict(context.run_config), lambda result: log.info("spfd_result job=%s", result.job.name))

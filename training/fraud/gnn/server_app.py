"""GNN fraud ServerApp: the scaler query, then FedAvg-GNN / FedRPDA jobs one after another, each with a
federated threshold.

:class:`FedRPDA` subclasses Flower's FedAvg (Message API). Per round it

* sends the global class prototypes with the model (``prototypes`` ArrayRecord) once it has them (FedRPDA's
  second strategy; round 1 has none);
* weighs each bank's weights by ``γ_k(t)`` (:func:`~fedfraud.training.fraud.gnn.rpda.aggregation_weights`: the
  bank's training-node count, times its risk term when the first strategy is on), written into the reply's
  metrics as ``rpda-weight`` so FedAvg's own ``aggregate_arrayrecords`` computes eq. (6);
* averages the banks' class prototypes (weighted by class counts) into the next round's global ones.

With both strategies off it is FedAvg: the weights are the example counts and no prototype is sent or used.
Under ``aggregation: dsfl`` (:mod:`fedfraud.training.fraud.dsfl`) the banks noise their updates and the server
moves the model by DSFL's contribution weights instead of ``γ_k(t)``; prototypes and risk intensities flow as
before (the risk term then only shows in the log).

After the last round each bank sends the histogram of its validation scores; the server sums them and applies the
fraud model's max-F1 rule (:func:`fedfraud.training.fraud.metrics.threshold_from_histograms`) and computes the
validation PR-AUC from the same counts (what hyperparameters are chosen on).

Settings (kebab-case) come from :func:`build_server_app` / :func:`run_jobs`: ``features-dir``, ``names``, ``used``
(JSON lists), ``gnn-config`` (JSON), ``jobs`` (JSON list of :class:`~.task.GnnJob`), ``num-supernodes``,
``threshold-bins``.
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

from fedfraud.training.federated.grid import connected_banks, send_to_all
from fedfraud.training.fraud.dsfl import DSFLPlan, dp_off
from fedfraud.training.fraud.gnn.config import GnnConfig
from fedfraud.training.fraud.gnn.model import ScalerSums
from fedfraud.training.fraud.gnn.rpda import Prototypes, aggregation_weights, average_prototypes
from fedfraud.training.fraud.gnn.task import SCALER_ARRAYS, GnnJob, build_model, state_arrays
from fedfraud.training.fraud.metrics import threshold_from_histograms

__all__ = ["WEIGHT_KEY", "FedRPDA", "GnnJobResult", "app", "build_server_app", "pr_auc_from_histograms", "run_jobs",
           "validation_threshold"]

log = logging.getLogger(__name__)

#: Metric the strategy writes into each reply: the bank's γ_k(t), what the arrays are averaged with.
WEIGHT_KEY = "rpda-weight"
#: What leaves a GNN bank beside its model arrays, which DSFL's noise does not cover.
SIDE_CHANNELS = ("per-column scaler sums of the bank's transformed training rows (once), the risk intensity H_k "
                 "and the two class prototypes with their counts every round (FedRPDA), the validation score "
                 "histograms and the loss metrics leave each bank without noise")


def validation_threshold(grid: Grid, nodes: list[int], arrays: ArrayRecord, config: dict[str, Any], bins: int
                         ) -> tuple[float, float, float]:
    """(threshold, validation F1, validation PR-AUC) of a job's final model from the banks' summed validation
    score histograms (one EVALUATE round): the XGBoost model's max-F1 rule, no score leaving a bank.
    """
    hist = send_to_all(grid, nodes, RecordDict({"arrays": arrays, "config": ConfigRecord(
        {**config, "threshold-bins": bins})}), MessageType.EVALUATE)
    pos = np.sum([m.content["hist"]["pos"].numpy() for m in hist], axis=0)
    neg = np.sum([m.content["hist"]["neg"].numpy() for m in hist], axis=0)
    threshold, f1 = threshold_from_histograms(pos, neg)
    return threshold, f1, pr_auc_from_histograms(pos, neg)


def pr_auc_from_histograms(pos: np.ndarray, neg: np.ndarray) -> float:
    """Average precision of binned scores (each bin one threshold, highest first); NaN without positives."""
    p = np.asarray(pos, dtype=np.float64)[::-1]
    n = np.asarray(neg, dtype=np.float64)[::-1]
    if p.sum() <= 0:
        return float("nan")
    tp, fp = np.cumsum(p), np.cumsum(n)
    precision = np.divide(tp, tp + fp, out=np.zeros_like(tp), where=(tp + fp) > 0)
    recall = tp / p.sum()
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


class FedRPDA(FedAvg):
    """FedAvg with FedRPDA's risk-aware weights and global prototypes (each switchable via ``cfg``).

    Every bank trains every round (``fraction_train`` 1); evaluation happens once, after the last round. With a
    ``dsfl`` plan, DSFL's contribution weights replace ``γ_k(t)`` for the arrays.
    """

    def __init__(self, cfg: GnnConfig, min_nodes: int = 2, dsfl: DSFLPlan | None = None) -> None:
        super().__init__(fraction_evaluate=0.0, min_train_nodes=min_nodes, min_available_nodes=min_nodes)
        self.cfg, self.dsfl = cfg, dsfl
        self.prototypes: Prototypes | None = None
        self.history: list[dict[str, Any]] = []

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(risk_aware={self.cfg.risk_aware_aggregation}, "
                f"diversified={self.cfg.diversified_risk_augmentation})")

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
                        ) -> Iterable[Message]:
        messages = list(super().configure_train(server_round, arrays, config, grid))
        if self.dsfl is not None:
            self.dsfl.received = arrays
        if self.cfg.diversified_risk_augmentation and self.prototypes is not None:
            record = ArrayRecord({"vectors": Array(self.prototypes.vectors.astype(np.float32))})
            for msg in messages:
                msg.content["prototypes"] = record
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid, _ = self._check_and_log_replies(replies, is_train=True)
        if not valid:
            return None, None
        valid.sort(key=lambda m: m.metadata.src_node_id)  # one bank order in the log and the history
        contents = [m.content for m in valid]
        metrics = [next(iter(c.metric_records.values())) for c in contents]
        examples = [float(m["num-examples"]) for m in metrics]  # type: ignore[arg-type]
        risks = [float(m["risk-intensity"]) for m in metrics]  # type: ignore[arg-type]
        arrays: ArrayRecord | None
        if self.dsfl is not None:
            arrays, share = self.dsfl.aggregate(server_round, valid)
        else:
            weights = aggregation_weights(examples, risks, server_round, self.cfg.risk_alpha, self.cfg.risk_tau,
                                          self.cfg.risk_aware_aggregation)
            for m, w in zip(metrics, weights, strict=True):
                m[WEIGHT_KEY] = float(w)
            arrays, share = aggregate_arrayrecords(contents, WEIGHT_KEY), weights / weights.sum()
        if self.cfg.diversified_risk_augmentation:
            parts = [Prototypes(np.asarray([m["prototype-legit"], m["prototype-fraud"]], dtype=np.float64),
                                np.asarray([m["count-legit"], m["count-fraud"]], dtype=np.float64))
                     for m in metrics]
            self.prototypes = average_prototypes(parts) or self.prototypes
        loss_ce = float(np.average([float(m["loss-ce"]) for m in metrics], weights=examples))  # type: ignore[arg-type]
        loss_p = float(np.average([float(m["loss-p"]) for m in metrics], weights=examples))  # type: ignore[arg-type]
        self.history.append({"round": server_round, "weights": share.tolist(), "risk": risks,
                             "loss_ce": loss_ce, "loss_p": loss_p})
        log.info("gnn_round round=%d weights=%s risk=%s loss_ce=%.4f loss_p=%.4f", server_round,
                 ",".join(f"{s:.3f}" for s in share), ",".join(f"{r:.3f}" for r in risks), loss_ce, loss_p)
        return arrays, MetricRecord({"loss-ce": loss_ce, "loss-p": loss_p})


@dataclass(frozen=True)
class GnnJobResult:
    """One job's global model and its federated threshold."""

    job: GnnJob
    arrays: dict[str, np.ndarray]
    threshold: float
    valid_f1: float
    valid_pr_auc: float
    seconds: float
    rounds: int
    history: list[dict[str, Any]]
    client_dp: dict[str, Any]


def run_jobs(grid: Grid, settings: dict[str, Any], on_result: Callable[[GnnJobResult], None]) -> None:
    """The whole session: scaler sums once, then every job (rounds, then the federated threshold)."""
    banks = int(settings["num-supernodes"])
    nodes = connected_banks(grid, banks)
    names, used = tuple(json.loads(settings["names"])), tuple(json.loads(settings["used"]))
    base = GnnConfig.model_validate_json(settings["gnn-config"])
    common = {"features-dir": str(settings["features-dir"]), "names": settings["names"], "used": settings["used"],
              "gnn-config": settings["gnn-config"]}
    replies = send_to_all(grid, nodes, RecordDict({"config": ConfigRecord(common)}), MessageType.QUERY)
    sums: ScalerSums | None = None
    for r in replies:
        rec = r.content["sums"]
        part = ScalerSums(rec["count"].numpy(), rec["total"].numpy(), rec["squares"].numpy())
        sums = part if sums is None else sums + part
    assert sums is not None
    for raw in json.loads(settings["jobs"]):
        job = GnnJob.from_json(json.dumps(raw))
        cfg = job.config(base)
        started = time.perf_counter()
        model = build_model(names, used, cfg, job.seed)
        model.set_scaler(sums)
        initial = ArrayRecord({k: Array(v) for k, v in state_arrays(model).items()})
        plan = DSFLPlan.of(cfg.dsfl, cfg.rounds, initial, SCALER_ARRAYS) if cfg.aggregation == "dsfl" else None
        strategy = FedRPDA(cfg, min_nodes=banks, dsfl=plan)
        config = ConfigRecord({**common, "job": job.to_json(), **(plan.config() if plan else {})})
        log.info("gnn_job_start job=%s risk_aware=%s diversified=%s seed=%d rounds=%d", job.name, job.risk_aware,
                 job.diversified, job.seed, cfg.rounds)
        result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=cfg.rounds, train_config=config)
        final = result.arrays
        threshold, f1, ap = validation_threshold(grid, nodes, final, {**common, "job": job.to_json()},
                                                 int(settings["threshold-bins"]))
        seconds = time.perf_counter() - started
        log.info("gnn_job_done job=%s threshold=%.4f valid_f1=%.4f valid_pr_auc=%.4f seconds=%.1f", job.name,
                 threshold, f1, ap, seconds)
        client_dp = (plan.card(banks, SIDE_CHANNELS, SCALER_ARRAYS) if plan
                     else dp_off("aggregation fedavg: weights, prototypes and risk intensities leave the banks in "
                                 "clear"))
        on_result(GnnJobResult(job, {k: v.numpy() for k, v in final.items()}, threshold, f1, ap, seconds,
                               cfg.rounds, strategy.history, client_dp))


def build_server_app(settings: dict[str, Any], on_result: Callable[[GnnJobResult], None]) -> ServerApp:
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
    run_jobs(grid, dict(context.run_config), lambda result: log.info("gnn_result job=%s", result.job.name))

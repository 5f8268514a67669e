"""GNN fraud ClientApp (one per bank): ``@app.query`` scaler sums, ``@app.train`` Algorithm 1, ``@app.evaluate``
validation score histograms.

The running fraud statistics of FedRPDA's augmentation live in the node's ``context.state`` (one entry per job),
so they survive between rounds whichever simulation worker runs the bank next.

Under ``fraud.gnn.aggregation: dsfl`` the train reply passes through DSFL's shared mod
(:func:`fedfraud.training.federated.dsfl_mod.dsfl_client_mod`): the update of the model arrays is L1-clipped and
Laplace-noised per dimension before it leaves the bank (the scaler goes back as received); the risk intensity and
the prototypes in the metrics are not noised.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedfraud.training.federated.dsfl_mod import dsfl_client_mod, dsfl_from_json
from fedfraud.training.fraud.gnn.graph import TransactionGraph
from fedfraud.training.fraud.gnn.model import InputLayout
from fedfraud.training.fraud.gnn.rpda import FraudStats
from fedfraud.training.fraud.gnn.task import (
    SCALER_ARRAYS,
    GnnJob,
    build_model,
    config_of,
    load_node_graph,
    load_partition,
    local_train,
    scaler_sums,
    set_state,
    state_arrays,
    validation_histograms,
)

__all__ = ["app"]

log = logging.getLogger(__name__)

app = ClientApp()


def _graph(msg: Message, context: Context) -> TransactionGraph:
    """This bank's graph: its own folder when the SuperNode was given one (deployment), else the simulation's."""
    own = str(context.node_config.get("data-dir", "") or "")
    if own:
        return load_node_graph(own)
    cfg = msg.content["config"]
    return load_partition(str(cfg["features-dir"]), int(context.node_config.get("partition-id", 0)))


def _names(cfg: object) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return (tuple(json.loads(str(cfg["names"]))), tuple(json.loads(str(cfg["used"]))))  # type: ignore[index]


def _arrays(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in record.items()}


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Per-column count, sum and sum of squares of this bank's transformed training rows."""
    cfg = msg.content["config"]
    graph = _graph(msg, context)
    names, used = _names(cfg)
    sums = scaler_sums(graph, InputLayout.of(names, used))
    content = RecordDict({
        "sums": ArrayRecord({"count": Array(sums.count), "total": Array(sums.total), "squares": Array(sums.squares)}),
        "metrics": MetricRecord({"num-examples": int(graph.mask("train").sum())}),
    })
    return Message(content=content, reply_to=msg)


@app.train(mods=[dsfl_client_mod(dsfl_from_json, SCALER_ARRAYS)])
def train(msg: Message, context: Context) -> Message:
    """Algorithm 1: local epochs from the global model; weights, risk intensity and class prototypes back."""
    cfg = msg.content["config"]
    graph = _graph(msg, context)
    names, used = _names(cfg)
    job = GnnJob.from_json(str(cfg["job"]))
    gcfg = job.config(config_of(cfg))
    server_round = int(cfg["server-round"])
    partition = int(context.node_config.get("partition-id", 0))
    model = build_model(names, used, gcfg, job.seed)
    set_state(model, _arrays(msg.content["arrays"]))
    protos = msg.content.get("prototypes")
    global_protos = None if protos is None else protos["vectors"].numpy()
    key = f"rpda-stats-{job.name}"
    stats = FraudStats()
    if key in context.state:
        saved = context.state[key]
        stats = FraudStats(torch.as_tensor(saved["mean"].numpy()), torch.as_tensor(saved["var"].numpy()))
    result = local_train(model, graph, gcfg, server_round, global_protos, stats,
                         seed=job.seed * 1_000_003 + server_round * 1009 + partition)
    if stats.mean is not None and stats.var is not None:
        context.state[key] = ArrayRecord({"mean": Array(stats.mean.numpy()), "var": Array(stats.var.numpy())})
    p = result.prototypes
    content = RecordDict({
        "arrays": ArrayRecord({k: Array(v) for k, v in state_arrays(model).items()}),
        "metrics": MetricRecord({
            "num-examples": result.examples,
            "risk-intensity": result.risk,
            "prototype-legit": p.vectors[0].tolist(),
            "prototype-fraud": p.vectors[1].tolist(),
            "count-legit": int(p.counts[0]),
            "count-fraud": int(p.counts[1]),
            "loss-ce": result.loss_ce,
            "loss-p": result.loss_p,
        }),
    })
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Validation score histograms of the global model: what the server needs to pick a threshold."""
    cfg = msg.content["config"]
    graph = _graph(msg, context)
    names, used = _names(cfg)
    job = GnnJob.from_json(str(cfg["job"]))
    model = build_model(names, used, job.config(config_of(cfg)), job.seed)
    set_state(model, _arrays(msg.content["arrays"]))
    pos, neg = validation_histograms(model, graph, int(cfg["threshold-bins"]))
    content = RecordDict({
        "hist": ArrayRecord({"pos": Array(pos.astype(np.int64)), "neg": Array(neg.astype(np.int64))}),
        "metrics": MetricRecord({"num-examples": int(pos.sum() + neg.sum())}),
    })
    return Message(content=content, reply_to=msg)

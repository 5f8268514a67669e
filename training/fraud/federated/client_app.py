"""Fraud ClientApp (one per bank): ``@app.train`` boosts one tree, ``@app.evaluate`` sends score histograms."""

from __future__ import annotations

import logging

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedfraud.training.fraud.federated.task import (
    boost_one_round,
    fraud_config,
    load_node_features,
    load_partition,
    validation_histograms,
)

__all__ = ["app"]

log = logging.getLogger(__name__)

app = ClientApp()


def _data(msg: Message, context: Context):  # noqa: ANN202 - FraudFeatures
    """This bank's features: its own folder when the SuperNode was given one (deployment), else the simulation's."""
    own = str(context.node_config.get("data-dir", "") or "")
    if own:
        return load_node_features(own)
    cfg = msg.content["config"]
    return load_partition(str(cfg["features-dir"]), int(context.node_config.get("partition-id", 0)))


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Boost one tree on the global model with this bank's training cardholders."""
    cfg = msg.content["config"]
    data = _data(msg, context)
    global_model = msg.content["arrays"]["0"].numpy().tobytes()
    tree = boost_one_round(data, fraud_config(cfg), bool(cfg["use-anomaly-score"]), float(cfg["eta"]), global_model)
    n_train = int(np.sum(data.split == "train"))
    content = RecordDict({
        "arrays": ArrayRecord([np.frombuffer(tree, dtype=np.uint8)]),
        "metrics": MetricRecord({"num-examples": n_train}),
    })
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Validation score histograms of the global model: what the server needs to pick a threshold."""
    cfg = msg.content["config"]
    data = _data(msg, context)
    model = msg.content["arrays"]["0"].numpy().tobytes()
    pos, neg = validation_histograms(data, bool(cfg["use-anomaly-score"]), model, int(cfg["threshold-bins"]))
    content = RecordDict({
        "hist": ArrayRecord({"pos": Array(pos.astype(np.int64)), "neg": Array(neg.astype(np.int64))}),
        "metrics": MetricRecord({"num-examples": int(pos.sum() + neg.sum())}),
    })
    return Message(content=content, reply_to=msg)

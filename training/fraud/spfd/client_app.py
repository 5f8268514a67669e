"""FED-SPFD ClientApp (one per bank): ``@app.query`` scaler or embedding sums, ``@app.train`` a warm-start or a
training round, ``@app.evaluate`` validation score histograms (and the bank's whole model, written to its folder).

What stays at the bank between rounds (the private autoencoder and its scaler; the head under FedPer) lives in the
node's ``context.state``, one entry per job, so it survives whichever simulation worker runs the bank next.

Under ``fraud.spfd.aggregation: dsfl`` the train reply passes through DSFL's shared mod
(:func:`fedfraud.training.federated.dsfl_mod.dsfl_client_mod`): the update of the federated arrays is L1-clipped
and Laplace-noised per dimension before it leaves the bank (the shared scaler goes back as received); the
embedding sums in the metrics are not noised.
"""

from __future__ import annotations

import json
import logging

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedfraud.training.federated.dsfl_mod import dsfl_client_mod, dsfl_from_json
from fedfraud.training.fraud.spfd.task import (
    SCALER_ARRAYS,
    BankData,
    SpfdJob,
    bank_model_file,
    build_net,
    config_of,
    embedding_sums,
    federated_arrays,
    load_bank,
    local_arrays,
    local_train,
    set_arrays,
    validation_histograms,
    warm_train,
)
from fedfraud.training.fraud.spfd.model import EmbeddingSums, SpfdNet

__all__ = ["app"]

log = logging.getLogger(__name__)

app = ClientApp()


def _bank(msg: Message, context: Context) -> tuple[int | None, BankData, str]:
    """``(bank, data, folder)``: the node's own folder when it has one (deployment), else the simulation's."""
    own = str(context.node_config.get("data-dir", "") or "")
    if own:
        bank, data = load_bank(own, 0, deployed=True)
        return bank, data, own
    folder = str(msg.content["config"]["features-dir"])
    bank, data = load_bank(folder, int(context.node_config.get("partition-id", 0)))
    return bank, data, folder


def _net(msg: Message, context: Context, data: BankData) -> tuple[SpfdNet, SpfdJob, str]:
    """The job's network with the global arrays of the message and this bank's local ones."""
    cfg = msg.content["config"]
    job = SpfdJob.from_json(str(cfg["job"]))
    shared = tuple(json.loads(str(cfg["shared"])))
    net = build_net(shared, data.private, job.config(config_of(cfg)), job.seed)
    key = f"spfd-local-{job.name}"
    if key in context.state:
        set_arrays(net, {k: v.numpy() for k, v in context.state[key].items()})
    elif data.private:  # first contact: the private scaler from this bank's own training rows
        net.private.set_scaler(net.private.scaler_sums(data.columns(data.private)[data.mask("train")]))
    if "arrays" in msg.content:
        set_arrays(net, {k: v.numpy() for k, v in msg.content["arrays"].items()})
    return net, job, key


def _sums_metrics(sums: EmbeddingSums) -> dict[str, float | list[float]]:
    """A bank's embedding sums as reply metrics (MetricRecord values: floats and lists of floats)."""
    return {"emb-count": float(sums.count), "emb-total": sums.total.tolist(),
            "emb-outer": sums.outer.reshape(-1).tolist()}


@app.query()
def query(msg: Message, context: Context) -> Message:
    """``what=scaler``: sums of the transformed shared training columns; ``what=embeddings``: sums of the shared
    embeddings of the training rows under the message's encoder (the first global statistics).
    """
    cfg = msg.content["config"]
    _, data, _ = _bank(msg, context)
    train = data.mask("train")
    if str(cfg["what"]) == "scaler":
        shared = tuple(json.loads(str(cfg["shared"])))
        net = build_net(shared, (), config_of(cfg), 0)
        sums = net.shared.scaler_sums(data.columns(shared)[train])
        content = RecordDict({
            "sums": ArrayRecord({"count": Array(sums.count), "total": Array(sums.total),
                                 "squares": Array(sums.squares)}),
            "metrics": MetricRecord({"num-examples": int(train.sum())}),
        })
    else:
        net, _, _ = _net(msg, context, data)
        content = RecordDict({"metrics": MetricRecord({"num-examples": int(train.sum()),
                                                       **_sums_metrics(embedding_sums(net, data))})})
    return Message(content=content, reply_to=msg)


@app.train(mods=[dsfl_client_mod(dsfl_from_json, SCALER_ARRAYS)])
def train(msg: Message, context: Context) -> Message:
    """A warm-start round (``phase=warm``) or a training round with the global statistics, if any."""
    cfg = msg.content["config"]
    _, data, _ = _bank(msg, context)
    net, job, key = _net(msg, context, data)
    scfg = job.config(config_of(cfg))
    server_round = int(cfg["server-round"])
    partition = int(context.node_config.get("partition-id", 0))
    seed = job.seed * 1_000_003 + server_round * 1009 + partition
    metrics: dict[str, int | float | list[float]] = {"num-examples": int(data.mask("train").sum())}
    if str(cfg["phase"]) == "warm":
        metrics["loss-warm"] = warm_train(net, data, scfg, seed)
    else:
        stats = msg.content.get("stats")
        global_stats = None if stats is None else (stats["mean"].numpy(), stats["cov"].numpy())
        result = local_train(net, data, scfg, job, global_stats, seed)
        metrics.update({f"loss-{k}": v for k, v in result.losses.items()})
        if job.align:
            metrics.update(_sums_metrics(result.sums))
    context.state[key] = ArrayRecord({k: Array(v) for k, v in local_arrays(net, job).items()})
    content = RecordDict({
        "arrays": ArrayRecord({k: Array(v) for k, v in federated_arrays(net, job).items()}),
        "metrics": MetricRecord(metrics),  # type: ignore[arg-type]  # MetricRecord's value type is invariant
    })
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Validation score histograms of the final model; the bank's whole model goes to its own folder."""
    cfg = msg.content["config"]
    bank, data, folder = _bank(msg, context)
    net, job, _ = _net(msg, context, data)
    pos, neg = validation_histograms(net, data, job, int(cfg["threshold-bins"]))
    np.savez(bank_model_file(folder, bank, job.name),
             **{k: v.detach().cpu().numpy() for k, v in net.state_dict().items()})
    content = RecordDict({
        "hist": ArrayRecord({"pos": Array(pos.astype(np.int64)), "neg": Array(neg.astype(np.int64))}),
        "metrics": MetricRecord({"num-examples": int(pos.sum() + neg.sum())}),
    })
    return Message(content=content, reply_to=msg)

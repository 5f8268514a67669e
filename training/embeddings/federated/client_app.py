"""G-HIN2Vec ClientApp: one bank per SuperNode trains the encoder on its own ego graphs.

What leaves the bank: the ``state_dict`` (ArrayRecord) and scalar metrics (loss, triplet accuracy, counts).
No graph, feature, id, coordinate or timestamp.
"""

from __future__ import annotations

import logging
import os

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedfraud.training.embeddings.model import Hin2Vec
from fedfraud.training.embeddings.federated.task import (
    Settings,
    bank_graphs,
    build_model,
    evaluate_graphs,
    train_graphs,
)

__all__ = ["app"]

logger = logging.getLogger(__name__)

app = ClientApp()


def _setup(msg: Message, context: Context) -> tuple[Settings, int, Hin2Vec, int]:
    config = dict(msg.content["config"])
    settings = Settings.from_flat(config)
    partition = int(context.node_config.get("partition-id", 0))
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    model = build_model(settings)
    model.load_state_dict(msg.content.array_records["arrays"].to_torch_state_dict())
    return settings, partition, model, int(config.get("server-round", 1))  # type: ignore[arg-type]


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Local epochs on the bank's training graphs; returns the new weights."""
    settings, bank, model, round_ = _setup(msg, context)
    graphs = bank_graphs(settings, bank)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    stats = train_graphs(model, graphs.train, settings.hin2vec, seed=settings.hin2vec.seed * 1000 + round_ * 10 + bank,
                         device=device)
    metrics = MetricRecord({"num-examples": len(graphs.train), "partition-id": bank, "train-loss": stats["loss"],
                            "train-triplet-acc": stats["triplet_acc"], "train-steps": stats["steps"]})
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return Message(RecordDict({"arrays": ArrayRecord(state), "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Double-triplet loss and triplet accuracies of the global model on the bank's test cardholders' graphs."""
    settings, bank, model, _ = _setup(msg, context)
    graphs = bank_graphs(settings, bank)
    got = evaluate_graphs(model, graphs.test, settings.hin2vec, seed=settings.hin2vec.seed + bank)
    record = MetricRecord({"num-examples": max(len(graphs.test), 1), "partition-id": bank,
                           "test-loss": got["loss"], "test-node-acc": got["node_acc"],
                           "test-path-acc": got["path_acc"]})
    return Message(RecordDict({"metrics": record}), reply_to=msg)

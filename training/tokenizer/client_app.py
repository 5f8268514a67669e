"""FedByteBPE ClientApp: answers the server's single-token and pair queries (ClientSendTuples).

Only counts leave the client: token ids (of merges the server broadcast) with
Laplace-noised frequencies, never words or text.
"""

from __future__ import annotations

import logging

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from training.tokenizer.bpe import Merge, ReleaseParams
from training.tokenizer.task import client_state

__all__ = ["app"]

log = logging.getLogger(__name__)

app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Apply the broadcast merges, then release noisy counts for the requested phase."""
    cfg = msg.content["config"]
    partition = int(context.node_config.get("partition-id", 0))
    state, report = client_state(str(cfg["corpus-path"]), partition, bool(cfg.get("ner", False)))
    base = int(cfg["merge-base"])
    reply = ConfigRecord({"applied": state.applied})
    if state.applied < base:  # this process never saw earlier merges: ask the server to re-send them
        reply["resync"] = True
        return Message(RecordDict({"release": reply}), reply_to=msg)
    if "merge-left" in cfg:
        lefts, rights, news = cfg["merge-left"], cfg["merge-right"], cfg["merge-new"]
        merges = [Merge(int(a), int(b), int(c)) for a, b, c in zip(lefts, rights, news, strict=True)]
        state.apply(merges[state.applied - base :])
    eps = float(cfg["epsilon"])
    params = ReleaseParams(
        p=float(cfg["p"]),
        epsilon=eps if eps > 0 else None,
        delta=float(cfg["delta"]),
        top_n=int(cfg["top-n"]) or None,
    )
    rng = np.random.default_rng([int(cfg["seed"]), partition, int(cfg["round"]), 0 if cfg["phase"] == "single" else 1])
    allowed = [int(x) for x in cfg["allowed"]] if "allowed" in cfg else []
    rel = state.release(str(cfg["phase"]), params, rng, allowed)  # type: ignore[arg-type]
    reply["applied"] = state.applied
    reply["nvl"] = rel.nvl
    if rel.keys:
        if cfg["phase"] == "single":
            reply["keys-left"] = [int(k) for k in rel.keys]  # type: ignore[arg-type]
        else:
            reply["keys-left"] = [int(k[0]) for k in rel.keys]  # type: ignore[index]
            reply["keys-right"] = [int(k[1]) for k in rel.keys]  # type: ignore[index]
        reply["values"] = [float(v) for v in rel.values]
    metrics = MetricRecord({"kept-docs": report.kept, "skipped-docs": sum(report.skipped.values())})
    return Message(RecordDict({"release": reply, "metrics": metrics}), reply_to=msg)

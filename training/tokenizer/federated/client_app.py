"""FedByteBPE ClientApp: answers the server's single-token and pair queries (ClientSendTuples), or histogram
mode's one query (the client's DP word histogram: words above τ, as bytes, with their noisy counts).

In single / batched mode only counts leave the client: token ids (of merges the
server broadcast) with Laplace-noised frequencies, never words or text. With
noise, each document counts only up to ``max-doc-bytes`` bytes and the release
is dense over a public domain (``fedfraud.training.tokenizer.privacy`` has the
account). They travel as int/float arrays in an ``ArrayRecord`` (compact, and
no per-element validation as in a ``ConfigRecord`` list), as raw bytes
(:func:`~fedfraud.training.tokenizer.federated.task.raw_array`). In histogram
mode the words whose Gaussian-noised count crosses τ leave, as bytes, with
those noisy counts (``fedfraud.training.tokenizer.histogram`` has the account).

Every parameter of a release is the bank's own (:class:`~fedfraud.training.tokenizer.federated.policy.BankPolicy`):
the corpus it reads, ε, the per-document bound, σ and τ. A query that names other values is refused.
"""

from __future__ import annotations

import logging

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedfraud.training.tokenizer.bpe import ReleaseParams
from fedfraud.training.tokenizer.federated.task import (
    array_of,
    client_state,
    client_word_histogram,
    raw_array,
    remember_merges,
)
from fedfraud.training.tokenizer.federated.policy import BankPolicy
from fedfraud.training.tokenizer.histogram import histogram_release, pack_words
from fedfraud.training.tokenizer.noise import noise_rng

__all__ = ["client_app"]

log = logging.getLogger(__name__)

def client_app(policy: BankPolicy) -> ClientApp:
    """The banks' ClientApp, answering only queries under ``policy`` (the bank's corpus and release parameters)."""
    app = ClientApp()

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        """Check the query against the bank's policy, apply the broadcast merges, release for the phase."""
        cfg = msg.content["config"]
        policy.check(cfg)
        return _reply(msg, cfg, context, policy)

    return app


def _reply(msg: Message, cfg: ConfigRecord, context: Context, policy: BankPolicy) -> Message:
    """Apply the broadcast merges, then release noisy counts for the requested phase (parameters: the policy's)."""
    partition = int(context.node_config.get("partition-id", 0))
    if cfg["phase"] == "histogram":
        policy.count_release(context.state)
        return _histogram_reply(msg, policy, partition)
    eps = policy.epsilon
    bound = policy.max_doc_bytes if eps > 0 else None  # the sensitivity bound is part of the mechanism
    run = context.run_id
    state, _ = client_state(policy.corpus_path, partition, policy.ner, context.state, max_doc_bytes=bound, run=run)
    base = int(cfg["merge-base"])
    sent = msg.content["broadcast"] if "broadcast" in msg.content else ArrayRecord()
    delta = array_of(sent["merges"]) if "merges" in sent else np.zeros((0, 3), np.int64)  # (n, 3): left, right, new id
    known = remember_merges(run, base, delta)
    if state.applied < len(known):  # catch up (merges this node received while another process served it) + delta
        state.apply(known[state.applied :])
    reply = ConfigRecord({"applied": state.applied})
    if state.applied < base:  # this process never saw some earlier merges: ask the server to re-send them
        reply["resync"] = True
        return Message(RecordDict({"release": reply}), reply_to=msg)
    if state.applied < base + len(delta):  # a delta this process could not file (it lacked merges before base)
        state.apply(delta[state.applied - base :])
    params = ReleaseParams(
        p=policy.p,
        epsilon=eps if eps > 0 else None,
        sensitivity=float(bound or 1),
        top_n=policy.top_n or None,
    )
    rng = noise_rng(partition, int(cfg["round"]), 0 if cfg["phase"] == "single" else 1)
    allowed = array_of(sent["allowed"]) if "allowed" in sent else np.zeros(0, np.int64)
    policy.count_release(context.state)
    rel = state.release(str(cfg["phase"]), params, rng, allowed)  # type: ignore[arg-type]
    reply["applied"] = state.applied
    reply["nvl"] = rel.nvl
    content = RecordDict({"release": reply})
    if len(rel.left):
        # ids travel as int32 (a vocabulary is far below 2**31): the reply stays small enough to pass inline
        counts = {"left": raw_array(rel.left.astype(np.int32)), "values": raw_array(rel.values)}
        if rel.right is not None:
            counts["right"] = raw_array(rel.right.astype(np.int32))
        content["counts"] = ArrayRecord(counts)
    return Message(content, reply_to=msg)


def _histogram_reply(msg: Message, policy: BankPolicy, partition: int) -> Message:
    """Histogram mode's one release: the words whose noisy count is above τ, as bytes, with those noisy counts.

    Nothing about the other words leaves: not their number, not their counts. Without noise (the bank's own
    ``epsilon`` 0, ``--no-privacy``) the exact count of every word.
    """
    mechanism = policy.histogram
    counts, _ = client_word_histogram(policy.corpus_path, partition, policy.ner, policy.max_doc_bytes, mechanism)
    rel = histogram_release(counts, mechanism, noise_rng(partition, 2))
    content = RecordDict({"release": ConfigRecord({"applied": 0})})
    if rel.words:
        data, lengths = pack_words(rel.words)
        content["words"] = ArrayRecord(
            {"bytes": raw_array(data), "lengths": raw_array(lengths), "values": raw_array(rel.values)}
        )
    return Message(content, reply_to=msg)

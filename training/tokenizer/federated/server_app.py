"""FedByteBPE ServerApp (Algorithm 4): sample clients, aggregate their releases, broadcast merges.

Settings are kebab-case keys (``vocab-size``, ``theta``, ``epsilon``, ...) read
from ``context.run_config`` on top of the values given to
:func:`build_server_app`. The result (merges, rounds, privacy) goes to the
``on_result`` callback of :func:`build_server_app` (``run_simulation`` runs the
ServerApp in its caller's process); a deployed app (``flwr run``) writes it as
JSON to ``result-path``. With ``audit-path`` every release the server receives
is also logged, decoded to bytes, so the privacy tests inspect exactly what
reached the server.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from fedfraud.training.federated.grid import wait_for_nodes
from fedfraud.training.tokenizer.bpe import FedBPEResult, FedBPEServer, Release, ReleaseParams
from fedfraud.training.tokenizer.federated.policy import histogram_of
from fedfraud.training.tokenizer.federated.task import array_of, raw_array
from fedfraud.training.tokenizer.histogram import (
    HistogramMechanism,
    WordRelease,
    train_from_releases,
    unpack_words,
)

__all__ = ["build_server_app", "run_fedbpe", "run_histogram", "run_jobs", "DEFAULTS"]

log = logging.getLogger(__name__)

DEFAULTS: dict[str, Any] = {
    "vocab-size": 8000,
    "special-tokens": 1,
    "theta": 8.0,
    "epsilon": 1.0,  # <= 0 switches noise off (the CLI's --no-privacy)
    "max-doc-bytes": 1024,  # per-document contribution bound = L1 sensitivity of a release
    "pair-tokens": 128,  # with noise: the pair phase's public domain is all pairs of the top pair-tokens tokens
    "p": 1.0,
    "k-fraction": 1.0,
    "top-n": 4096,  # 0: send all keys
    "mode": "batched",
    "merges-per-round": 256,
    "merges-growth": 0.1,
    "merges-ratio": 0.0,
    "histogram-words": 96,  # histogram mode: k distinct words per document
    "histogram-count": 1,  # histogram mode: c, each counted at most c times
    "delta": 0.0,  # histogram mode: total δ per document σ and τ are calibrated for (the trainer passes it)
    "max-rounds": 100_000,
    "seed": 7,
    "ner": False,
    "num-supernodes": 0,  # wait for this many nodes (0: take what is connected)
    "corpus-path": "",
    "result-path": "",
    "audit-path": "",
}


class _Audit:
    """Append-only JSONL of every release received (token bytes, not ids)."""

    def __init__(self, path: str, server: FedBPEServer | None) -> None:
        self.fh = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115 - closed in close()
        self.server = server

    def record_words(self, node: int, rel: WordRelease) -> None:
        """Histogram mode: the words as received (UTF-8, undecodable bytes escaped) and their values."""
        if self.fh is not None:
            keys = [w.decode("utf-8", "backslashreplace") for w in rel.words]
            self.fh.write(json.dumps({"node": node, "phase": "histogram", "keys": keys,
                                      "values": rel.values.tolist()}) + "\n")

    def record(self, node: int, phase: str, rel: Release) -> None:
        if self.fh is None or self.server is None:
            return
        tokens = self.server.vocab.tokens
        keys = [
            tokens[k].decode("utf-8", "backslashreplace")
            if isinstance(k, int)
            else [tokens[k[0]].decode("utf-8", "backslashreplace"), tokens[k[1]].decode("utf-8", "backslashreplace")]
            for k in rel.keys
        ]
        self.fh.write(json.dumps({"node": node, "phase": phase, "keys": keys, "values": rel.values.tolist()}) + "\n")

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()


def _release_of(content: RecordDict) -> Release:
    nvl = bool(content["release"].get("nvl", False))
    if "counts" not in content:
        return Release.nothing(nvl)
    arrays = content["counts"]
    right = array_of(arrays["right"]) if "right" in arrays else None
    return Release(array_of(arrays["left"]), array_of(arrays["values"]), right, nvl)


def _send_and_receive(grid: Grid, messages: list[Message], first: float = 0.002, most: float = 0.02) -> list[Message]:
    """``grid.send_and_receive`` with a poll every ``first`` seconds, backing off to ``most``.

    Flower's own loop sleeps a fixed 0.1 s (in-memory grid) or 3 s (deployment grid) between pulls; a phase's
    replies here arrive within tens of milliseconds, and a round has two phases, so that sleep was most of a round.
    """
    pending = set(grid.push_messages(messages))
    replies: list[Message] = []
    wait = first
    while pending:
        got = list(grid.pull_messages(pending))
        replies.extend(got)
        pending.difference_update(m.metadata.reply_to_message_id for m in got)
        if pending:
            time.sleep(wait)
            wait = min(most, wait * 1.5)
    return replies


def _exchange(
    grid: Grid, server: FedBPEServer, nodes: list[int], phase: str, settings: dict[str, Any],
    known: dict[int, int], allowed: list[int], audit: _Audit,
) -> list[Release]:
    """One phase round trip; a node whose process lost its state gets the missing merges in a second trip.

    Merges and the allowed left ids go in an ``ArrayRecord`` (int64 arrays, :func:`raw_array`); each node gets only
    the merges after the last one it confirmed.
    """
    releases: list[Release] = []
    allowed_arr = raw_array(np.asarray(allowed, dtype=np.int64)) if phase == "pair" and allowed else None
    todo = list(nodes)
    contents: dict[int, RecordDict] = {}  # one query per distinct merge base (usually one per phase): all it holds
    for _attempt in range(3):
        if not todo:
            break
        messages = []
        for node in todo:
            base = known.get(node, 0)
            if base not in contents:
                cfg = ConfigRecord(
                    {
                        "phase": phase,
                        "round": server.rounds,
                        "merge-base": base,
                        "p": float(settings["p"]),
                        "epsilon": float(settings["epsilon"] or 0.0),
                        "max-doc-bytes": int(settings["max-doc-bytes"]),
                        "top-n": int(settings["top-n"] or 0),
                        "ner": bool(settings["ner"]),
                    }
                )
                broadcast = ArrayRecord()
                if len(server.vocab.merges) > base:
                    broadcast["merges"] = raw_array(server.vocab.merge_array(base))
                if allowed_arr is not None:
                    broadcast["allowed"] = allowed_arr
                contents[base] = RecordDict({"config": cfg, "broadcast": broadcast})
            messages.append(Message(contents[base], dst_node_id=node, message_type="query"))
        todo = []
        for reply in _send_and_receive(grid, messages):
            node = reply.metadata.src_node_id
            if reply.has_error():
                log.warning("node=%d phase=%s left the round: %s", node, phase, reply.error.reason)
                continue
            rec = reply.content["release"]
            known[node] = int(rec["applied"])
            if rec.get("resync", False):
                todo.append(node)
                continue
            rel = _release_of(reply.content)
            audit.record(node, phase, rel)
            releases.append(rel)
    if nodes and not releases:  # every bank refused or failed: no table to merge on, not a silent empty tokenizer
        raise RuntimeError(f"no bank answered the {phase} query (see the banks' logs)")
    return releases


def _histogram_query(settings: dict[str, Any], mechanism: HistogramMechanism | None) -> RecordDict:
    """Histogram mode's one query: the contribution bound and the calibrated σ and τ (each bank checks them
    against its own; no query names a corpus: :mod:`~fedfraud.training.tokenizer.federated.policy`).
    """
    cfg: dict[str, Any] = {
        "phase": "histogram", "round": 0,
        "epsilon": 0.0 if mechanism is None else mechanism.epsilon, "max-doc-bytes": int(settings["max-doc-bytes"]),
        "ner": bool(settings["ner"]),
    }
    if mechanism is not None:
        cfg |= {"k": mechanism.max_words, "c": mechanism.max_count, "sigma": mechanism.sigma, "tau": mechanism.tau,
                "delta-gaussian": mechanism.delta_gaussian, "delta-selection": mechanism.delta_selection}
    return RecordDict({"config": ConfigRecord(cfg)})


def _word_release_of(content: RecordDict) -> WordRelease:
    if "words" not in content:
        return WordRelease([], np.zeros(0))
    arrays = content["words"]
    return WordRelease(unpack_words(array_of(arrays["bytes"]), array_of(arrays["lengths"])),
                       array_of(arrays["values"]))


def run_histogram(grid: Grid, settings: dict[str, Any]) -> dict[str, Any]:
    """Histogram mode over a Flower grid: one query round (each client's DP word histogram), then BPE on the sum.

    σ and τ are calibrated here from the total (ε, δ) per document (``delta`` must be set: the trainer passes
    1 / (10 × documents) unless configured) and sent to the clients with the query.
    """
    mechanism = histogram_of(settings) if float(settings["epsilon"] or 0.0) > 0 else None
    nodes = wait_for_nodes(grid, int(settings["num-supernodes"]))
    audit = _Audit(str(settings["audit-path"]), None)
    start = time.perf_counter()
    content = _histogram_query(settings, mechanism)
    releases = []
    try:
        for reply in _send_and_receive(grid, [Message(content, dst_node_id=n, message_type="query") for n in nodes]):
            if reply.has_error():
                log.warning("node=%d left the histogram round: %s", reply.metadata.src_node_id, reply.error.reason)
                continue
            rel = _word_release_of(reply.content)
            audit.record_words(reply.metadata.src_node_id, rel)
            releases.append(rel)
    finally:
        audit.close()
    if nodes and not releases:
        raise RuntimeError("no bank answered the histogram query (see the banks' logs)")
    log.info("histogram round: %d releases, %d words", len(releases), sum(len(r.words) for r in releases))
    result = train_from_releases(
        releases, mechanism, int(settings["vocab-size"]) - int(settings["special-tokens"]),
        theta=float(settings["theta"]), merges_per_round=int(settings["merges-per-round"]),
        merges_growth=float(settings["merges-growth"]), merges_ratio=float(settings["merges-ratio"]),
        seed=int(settings["seed"]), max_rounds=int(settings["max-rounds"]),
    )
    result.rounds = 1  # one query round; the merge loop on the server's table sends nothing
    return _finish(result, start, settings)


def run_fedbpe(grid: Grid, settings: dict[str, Any]) -> dict[str, Any]:
    """The Algorithm 4 loop over a Flower grid (or, in histogram mode, :func:`run_histogram`); returns (and
    optionally writes) the result.
    """
    if settings["mode"] == "histogram":
        return run_histogram(grid, settings)
    eps = float(settings["epsilon"] or 0.0)
    server = FedBPEServer(
        int(settings["vocab-size"]) - int(settings["special-tokens"]),
        theta=float(settings["theta"]),
        mode=str(settings["mode"]),  # type: ignore[arg-type]
        merges_per_round=int(settings["merges-per-round"]),
        merges_growth=float(settings["merges-growth"]),
        merges_ratio=float(settings["merges-ratio"]),
        k_fraction=float(settings["k-fraction"]),
        release=ReleaseParams(
            p=float(settings["p"]), epsilon=eps if eps > 0 else None,
            sensitivity=float(settings["max-doc-bytes"]) if eps > 0 else 1.0, top_n=int(settings["top-n"] or 0) or None,
        ),
        pair_tokens=int(settings["pair-tokens"]),
        seed=int(settings["seed"]),
    )
    nodes = wait_for_nodes(grid, int(settings["num-supernodes"]))
    known: dict[int, int] = {}
    audit = _Audit(str(settings["audit-path"]), server)
    start = time.perf_counter()
    try:
        while not server.done and server.rounds < int(settings["max-rounds"]):
            singles = _exchange(grid, server, server.sample(nodes), "single", settings, known, [], audit)
            kept = server.single_phase(singles)
            pairs = _exchange(grid, server, server.sample(nodes), "pair", settings, known, kept, audit)
            merges = server.pair_phase(pairs)
            log.info("round=%d merges=%d vocab=%d kept_singles=%d", server.rounds, len(merges), len(server.vocab),
                     len(kept))
            if not merges:
                break
    finally:
        audit.close()
    server.stop_at_round_limit()
    return _finish(server.result(), start, settings)


def _finish(result: FedBPEResult, start: float, settings: dict[str, Any]) -> dict[str, Any]:
    """The result as the ServerApp hands it back (and writes it to ``result-path``)."""
    out = {
        "merges": [[a.hex(), b.hex()] for a, b in result.merges],
        "vocab_size": result.vocab_size,
        "rounds": result.rounds,
        "halted": result.halted,
        "stop_reason": result.stop_reason,
        "privacy": result.privacy,
        "train_seconds": time.perf_counter() - start,
        # vocabulary size after each round and seconds since the loop started (first round includes client set-up)
        "history": [[h["vocab"], h["time"] - start] for h in result.history],
    }
    if settings.get("result-path"):
        Path(settings["result-path"]).write_text(json.dumps(out), encoding="utf-8")
    log.info("fedbpe done rounds=%d vocab=%d reason=%s", result.rounds, result.vocab_size, result.stop_reason)
    return out


def run_jobs(grid: Grid, settings: dict[str, Any], on_result: Callable[[dict[str, Any]], None]) -> None:
    """The ServerApp's body on a given grid (``DEFAULTS`` < ``settings``): what the loopback engine runs in this
    process, so both engines execute the same server code.
    """
    on_result(run_fedbpe(grid, {**DEFAULTS, **settings}))


def build_server_app(
    settings: dict[str, Any] | None = None, on_result: Callable[[dict[str, Any]], None] | None = None
) -> ServerApp:
    """A ServerApp whose settings are ``DEFAULTS`` < ``settings`` < the run config; ``on_result`` gets the result."""
    base = {**DEFAULTS, **(settings or {})}
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_jobs(grid, {**base, **dict(context.run_config)}, on_result or (lambda _result: None))

    return app


app = build_server_app()

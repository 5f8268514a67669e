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
from fedfraud.training.tokenizer.bpe import FedBPEServer, Release, ReleaseParams
from fedfraud.training.tokenizer.federated.task import array_of, raw_array

__all__ = ["build_server_app", "run_fedbpe", "run_jobs", "DEFAULTS"]

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

    def __init__(self, path: str, server: FedBPEServer) -> None:
        self.fh = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115 - closed in close()
        self.server = server

    def record(self, node: int, phase: str, rel: Release) -> None:
        if self.fh is None:
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
                        "corpus-path": str(settings["corpus-path"]),
                        "p": float(settings["p"]),
                        "epsilon": float(settings["epsilon"] or 0.0),
                        "max-doc-bytes": int(settings["max-doc-bytes"]),
                        "top-n": int(settings["top-n"] or 0),
                        "seed": int(settings["seed"]),
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
    return releases


def run_fedbpe(grid: Grid, settings: dict[str, Any]) -> dict[str, Any]:
    """The Algorithm 4 loop over a Flower grid; returns (and optionally writes) the result."""
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
    result = server.result()
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

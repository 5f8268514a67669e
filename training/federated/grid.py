"""Waiting for SuperNodes on a Flower grid: the one wait every ServerApp here does before its first round.

Flower's strategies wait inside ``start`` (``min_available_nodes``, without a
deadline); the anomaly and tokenizer ServerApps need the node list first
(to size the run, or to address nodes themselves), and give up after a timeout
so a missing bank fails the run instead of hanging it.
"""

from __future__ import annotations

import logging
import time

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

__all__ = ["connected_banks", "send_to_all", "wait_for_nodes"]

logger = logging.getLogger(__name__)


def wait_for_nodes(grid: Grid, wanted: int, timeout_s: float = 60.0, poll_s: float = 0.2) -> list[int]:
    """The sorted ids of the connected nodes once ``wanted`` are connected, or of those there at ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    nodes = sorted(grid.get_node_ids())
    while len(nodes) < wanted and time.monotonic() < deadline:
        time.sleep(poll_s)
        nodes = sorted(grid.get_node_ids())
    if len(nodes) < wanted:
        logger.warning("wait_for_nodes connected=%d wanted=%d after %.0f s", len(nodes), wanted, timeout_s)
    return nodes


def connected_banks(grid: Grid, banks: int) -> list[int]:
    """The node ids of all ``banks``; a run with a bank missing fails here instead of training on fewer."""
    nodes = wait_for_nodes(grid, banks)
    if len(nodes) < banks:
        raise RuntimeError(f"{len(nodes)} of {banks} banks connected")
    return nodes


def send_to_all(grid: Grid, nodes: list[int], content: RecordDict, message_type: str) -> list[Message]:
    """One message to every node and their replies; a bank's error fails the round with its reason."""
    replies = list(grid.send_and_receive([Message(content=content, message_type=message_type, dst_node_id=n)
                                          for n in nodes]))
    bad = [m for m in replies if m.has_error()]
    if bad:
        raise RuntimeError(f"{len(bad)} bank(s) failed: {bad[0].error.reason}")
    return replies

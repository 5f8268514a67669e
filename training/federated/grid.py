"""Waiting for SuperNodes on a Flower grid: the one wait every ServerApp here does before its first round.

Flower's strategies wait inside ``start`` (``min_available_nodes``, without a
deadline); the anomaly and tokenizer ServerApps need the node list first
(to size the run, or to address nodes themselves), and give up after a timeout
so a missing bank fails the run instead of hanging it.
"""

from __future__ import annotations

import logging
import time

from flwr.serverapp import Grid

__all__ = ["wait_for_nodes"]

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

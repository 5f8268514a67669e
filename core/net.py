"""Loopback networking helpers shared by every layer (embedded broker, federated XGBoost, Ray, tests)."""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
from typing import Any

from fedfraud.core.retry import RetryError, retrying

__all__ = ["LOOPBACK", "free_port", "is_loopback", "ray_bind", "wait_for_port"]

#: The address every locally started server binds to unless the config names another.
LOOPBACK = "127.0.0.1"

#: Ray's switch between "local Ray only" (0) and "nodes may join" (1); read when ``ray`` is imported.
_RAY_CLUSTER_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost``, 127.0.0.0/8, ``::1``): what may run without
    authentication or encryption. A wildcard (``0.0.0.0``, ``::``, empty) or any other name is not.
    """
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_port(host: str, port: int) -> str:
    """``host:port`` as a URL or gRPC target writes it (an IPv6 address in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout_s: float = 10.0) -> None:
    """Return once ``proc`` (a server we started) accepts connections on the loopback ``port``.

    Raises RuntimeError if it exits first, TimeoutError if it never listens.
    """

    def connect() -> None:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} before listening")
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            pass

    try:
        retrying(lambda exc: isinstance(exc, OSError), within_s=timeout_s, first_s=0.05, most_s=0.05,
                 reraise=False)(connect)
    except RetryError:
        raise TimeoutError(f"{what} did not listen on port {port} within {timeout_s:.0f} s") from None


def ray_bind(host: str = LOOPBACK) -> dict[str, Any]:
    """Make the next local ``ray.init`` bind Ray's servers to ``host``; returns the ``ray.init`` arguments for it.

    Why this is more than ``_node_ip_address``: Ray's GCS, raylet, object
    manager and worker gRPC servers listen on loopback only when the node's
    address is exactly ``127.0.0.1``, but ``ray.init`` rewrites a loopback
    address to the machine's outward address (so other nodes could join) unless
    Ray runs in "local only" mode, which ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
    selects (Ray's own switch; it is read when ``ray`` is imported, so the
    already-imported value is set too). The variable is exported so the raylet,
    its workers and child processes (a retrain cycle) agree. With any other
    ``host`` (a node address, for a multi-node cluster) Ray 2.55 listens on all
    interfaces and advertises ``host``: restrict those with a firewall or a
    NetworkPolicy (docs/security.md). ``tests/integration/test_ray_binding.py``
    checks the sockets, so a Ray upgrade that changes this fails a test.
    """
    local_only = host in (LOOPBACK, "localhost")
    os.environ[_RAY_CLUSTER_ENV] = "0" if local_only else "1"
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = not local_only
    return {"_node_ip_address": LOOPBACK if local_only else host, "include_dashboard": False}

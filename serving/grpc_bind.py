"""Keep Ray Serve's inter-deployment gRPC server in each replica off the network.

Ray Serve 2.55 starts a gRPC server in every replica once the deployment's constructor has run
(``ray/serve/_private/replica.py``, ``_on_initialized``) with ``add_insecure_port("[::]:0")``: every interface,
no credential, and a handler that unpickles the request metadata. Anyone who reaches the host could run code in
the scorer or tokenizer replica, which holds the bank secret, the federation key and the API token. The bind is
not configurable upstream (ray-project/ray issue 64544). Serve uses that server only when
``RAY_SERVE_USE_GRPC_BY_DEFAULT=1``; by default deployment handles go through Ray actor calls.

:func:`confine_replica_grpc` is called first in each of our deployments' constructors, so before Serve binds:
it makes a wildcard gRPC bind in that process listen on :func:`replica_grpc_host` instead (loopback, or the
node's own address when Serve is told to route over gRPC). ``tests/integration/test_replica_sockets.py`` deploys
the real apps and lists every listening socket of the process tree, so a Serve upgrade that binds earlier or
elsewhere fails a test (docs/security.md, "threats and mitigations").
"""

from __future__ import annotations

import logging
import os
from typing import Any

from fedfraud.core.net import LOOPBACK, host_port

__all__ = ["WILDCARD_HOSTS", "confine_replica_grpc", "replica_grpc_host"]

log = logging.getLogger(__name__)

#: Host parts of a gRPC address that mean "every interface".
WILDCARD_HOSTS = frozenset({"[::]", "0.0.0.0", "", "[::0]", "*"})

#: Serve's own switch: route deployment-handle calls over the replicas' gRPC servers (off by default in 2.55).
GRPC_BY_DEFAULT_ENV = "RAY_SERVE_USE_GRPC_BY_DEFAULT"

_PATCHED = "_fedfraud_confined"


def replica_grpc_host() -> str:
    """Where a replica's gRPC server may listen: loopback, unless Serve routes handle calls over gRPC.

    With ``RAY_SERVE_USE_GRPC_BY_DEFAULT=1`` other nodes' proxies and replicas dial this replica at the node's
    address, which Serve publishes; it is then that one address (still never every interface), and a firewall or
    NetworkPolicy must keep it to the cluster's nodes.
    """
    if os.environ.get(GRPC_BY_DEFAULT_ENV, "0") != "1":
        return LOOPBACK
    import ray.util

    return str(ray.util.get_node_ip_address())


def _split(address: str) -> tuple[str, str]:
    """``host``, ``port`` of a gRPC address (``[::]:0``, ``0.0.0.0:50051``, ``:0``)."""
    host, sep, port = address.rpartition(":")
    return (host, port) if sep else (address, "")


def confine_replica_grpc(host: str | None = None) -> str:
    """Make every later wildcard ``add_insecure_port`` of ``grpc.aio`` servers in this process bind ``host``.

    Idempotent; returns the host used. Addresses that already name a host are left alone, so a gRPC ingress
    configured on purpose (Serve's ``grpc_options``) keeps its address.
    """
    from grpc.aio import _server

    target = host or replica_grpc_host()
    server_cls: Any = _server.Server
    original = getattr(server_cls.add_insecure_port, _PATCHED, None)
    if original is None:
        original = server_cls.add_insecure_port

    def add_insecure_port(self: Any, address: str) -> int:
        bind_host, port = _split(address)
        if bind_host in WILDCARD_HOSTS:
            confined = host_port(target, port)
            log.debug("gRPC server asked for %s; binding %s", address, confined)
            address = confined
        return int(original(self, address))

    setattr(add_insecure_port, _PATCHED, original)
    add_insecure_port.__doc__ = original.__doc__
    server_cls.add_insecure_port = add_insecure_port
    if target != LOOPBACK:
        log.warning("Serve's replica gRPC server listens on %s (%s=1): only the cluster's nodes may reach it",
                    target, GRPC_BY_DEFAULT_ENV)
    return target

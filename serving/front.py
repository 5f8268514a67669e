"""The documented HTTP port under direct ingress: a TCP front that sends each connection straight to a replica.

With ``serving.direct_ingress`` every scoring replica answers HTTP on a port of its own, and a request sent there
skips Serve's proxy and its hop to the replica (5–13 ms at p99 on the development machine, docs/serving.md). A
client should not have to know those ports, which Serve assigns when a replica starts and may change when one
restarts. :class:`ScoreFront` holds ``serving.http_host:serving.http_port`` instead of Serve's proxy (which moves to
a loopback port of its own, ``serving.internal_proxy_port``) and forwards each connection, as bytes (L4), to the
next live replica's port, round-robin:

- the replica list is Serve's own (its target groups, :meth:`fedfraud.serving.runtime.ServingRuntime.direct_addresses`),
  read again every ``serving.front_refresh_s``; a replica that refuses the connection is skipped for the next one,
  and with no replica port published (or none accepting) the connection goes to Serve's proxy, which always works;
- a connection whose first request is for another application's route prefix (``/tokenizer``) goes to Serve's
  proxy, which routes by path: a replica's port serves its own application only. The front does not parse HTTP
  further, so a keep-alive connection stays where its first request went (a client that sends ``/tokenizer``
  requests after ``/score`` ones on one connection should use a second connection for them);
- nothing about authentication changes: the replica checks the bearer token on every route that has one, as it
  does behind the proxy, and bad input is answered by the same FastAPI app (401/403/413/422, never a 500).

It is a round robin over connections, not requests: a client that keeps one connection open stays on one replica
(HTTP keep-alive passes through, so the proxy's connect is paid once per connection).

Where it lives: in the process that owns the runtime (:func:`fedfraud.serving.runtime.start`, so ``fedfraud serve``,
the benches and the tests), started after the replicas publish their ports and stopped first in
:meth:`ServingRuntime.stop`. That process already holds the Serve client the refresh reads, lives exactly as long as
the deployment, and is idle between its log lines, so the forwarding threads have its interpreter to themselves; a
separate daemon (or HAProxy, not installed with the project) would be one more thing to start, watch and stop.
One machine only: the replicas' ports are bound to loopback (Serve's proxy host), so on a multi-node cluster use
Serve's proxy, or a load balancer in front of each node (docs/deploy.md).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Sequence

from fedfraud.core.net import host_port
from fedfraud.core.tcpproxy import TcpProxy

__all__ = ["ScoreFront", "first_path"]

log = logging.getLogger(__name__)

Address = tuple[str, int]


def first_path(first_bytes: bytes) -> str:
    """The request target of the first HTTP request line in ``first_bytes`` ('' when it is not one)."""
    line = first_bytes.split(b"\r\n", 1)[0]
    parts = line.split(b" ")
    return parts[1].decode("latin-1") if len(parts) == 3 and parts[2].startswith(b"HTTP/") else ""


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith((prefix + "/", prefix + "?"))


class ScoreFront:
    """Hold ``host:port`` and forward each connection to a replica's direct-ingress port, else to Serve's proxy.

    ``replicas``: the replicas' ``(host, port)`` now (raises or returns [] when none is known); read at
    :meth:`start` and every ``refresh_s`` after. ``proxy``: Serve's proxy, the fallback and the door of every path
    under ``proxy_prefixes``.
    """

    def __init__(self, host: str, port: int, proxy: Address, replicas: Callable[[], Sequence[Address]],
                 refresh_s: float = 1.0, proxy_prefixes: Sequence[str] = (), max_connections: int = 1024) -> None:
        self.proxy = proxy
        self.refresh_s = refresh_s
        self.proxy_prefixes = tuple(p.rstrip("/") for p in proxy_prefixes if p.rstrip("/"))
        self._replicas = replicas
        self._targets: tuple[Address, ...] = ()
        self._turn = itertools.count()
        self._stop = threading.Event()
        self._refresher: threading.Thread | None = None
        self._tcp = TcpProxy(port=port, host=host, route=self._route, max_connections=max_connections)

    @property
    def url(self) -> str:
        return f"http://{host_port(self._tcp.host, self._tcp.port)}"

    @property
    def targets(self) -> tuple[Address, ...]:
        """The replicas' addresses the front forwards to now (empty: everything goes to Serve's proxy)."""
        return self._targets

    def routed(self) -> dict[str, int]:
        """Connections forwarded so far: to a replica's own port, and to Serve's proxy."""
        counts = dict(self._tcp.connections)
        proxy = counts.pop(self.proxy, 0)
        return {"replica": sum(counts.values()), "proxy": proxy}

    def start(self) -> ScoreFront:
        """Read the replicas, bind ``host:port`` (an OSError if taken) and start the refresh."""
        self.refresh()
        self._tcp.start()
        self._refresher = threading.Thread(target=self._refresh_loop, name="score-front-refresh", daemon=True)
        self._refresher.start()
        log.info("front %s → %s (Serve proxy %s:%d as fallback)", self.url,
                 " ".join(f"{h}:{p}" for h, p in self._targets) or "Serve proxy only", *self.proxy)
        return self

    def stop(self) -> None:
        """Stop accepting, reset open connections and stop the refresh."""
        self._stop.set()
        self._tcp.close()
        if self._refresher is not None:
            self._refresher.join(timeout=self.refresh_s + 5)
        log.info("front %s stopped", self.url)

    def refresh(self) -> None:
        """Read the replicas' addresses again; on an error keep the last ones (the proxy stays the fallback)."""
        try:
            found = tuple(self._replicas())
        except Exception:  # noqa: BLE001 - Serve's controller restarting, Ray going down: try again next time
            log.debug("front: could not read the replicas' ports; keeping %s", self._targets, exc_info=True)
            return
        if found != self._targets:
            log.info("front: replicas now %s", " ".join(f"{h}:{p}" for h, p in found) or "none (Serve proxy)")
            self._targets = found

    def _refresh_loop(self) -> None:
        while not self._stop.wait(self.refresh_s):
            self.refresh()

    def _route(self, first_bytes: bytes) -> list[Address]:
        """The replicas from the next one round-robin, then Serve's proxy; only the proxy for its prefixes."""
        targets = self._targets
        path = first_path(first_bytes) if self.proxy_prefixes else ""
        if not targets or any(_under(path, p) for p in self.proxy_prefixes):
            return [self.proxy]
        k = next(self._turn) % len(targets)
        return [*targets[k:], *targets[:k], self.proxy]

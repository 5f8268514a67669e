"""A TCP proxy: sees what crosses a boundary, can cut it, and can pick where each connection goes.

Three uses, one implementation:

- privacy tests read the bytes a client really sends (``record=True``:
  :class:`fedfraud.training.fraud.federated.wire.RecordingProxy` decodes them as gRPC);
- fault tests put it in front of a real server (the broker, Redis) and
  :meth:`TcpProxy.cut` it: open connections are reset and new ones refused,
  which is what a restarting server looks like from the client, while the
  server keeps its data; :meth:`TcpProxy.restore` accepts again on the same port;
- :class:`fedfraud.serving.front.ScoreFront` holds the documented HTTP port with it and sends each connection to
  a replica's direct-ingress port (``route``): the client's first bytes are read before the proxy connects, so the
  route may look at the first request line, and the candidates are tried in order until one accepts.

A connection is two threads pumping bytes with blocking sockets and ``TCP_NODELAY`` both ways (a forwarded
response written in two pieces must not wait for the client's delayed ACK); keep-alive connections pass through,
so a client that reuses its connection pays for the proxy's connect once.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence

__all__ = ["Route", "TcpProxy"]

log = logging.getLogger(__name__)

_RESET = b"\x01\x00\x00\x00\x00\x00\x00\x00"  # SO_LINGER on, 0 s: close() sends RST, not FIN
#: Where a connection may go, given the first bytes its client sent: (host, port) candidates, tried in order.
Route = Callable[[bytes], Sequence[tuple[str, int]]]
#: How many bytes of a routed connection are read (at most) before its route is asked: one HTTP request line.
_PEEK_BYTES = 8192
#: A routed connection whose client sends nothing for this long is closed (no thread waits on it for ever).
_FIRST_BYTES_TIMEOUT_S = 30.0


class TcpProxy:
    """Forward ``host:port`` to ``target_host:target_port`` (``port`` 0 or None: the OS picks one).

    ``route``: instead of the one target, the candidates it returns for each connection (from the connection's
    first bytes); :attr:`connections` counts the connections each target took.
    """

    def __init__(self, target_port: int | None = None, port: int | None = None, target_host: str = "127.0.0.1",
                 record: bool = False, host: str = "127.0.0.1", route: Route | None = None,
                 max_connections: int | None = None) -> None:
        if route is None and target_port is None:
            raise ValueError("TcpProxy needs a target_port or a route")
        #: at most this many client connections at once (each costs threads and file descriptors); one more is
        #: reset at once. None: no limit (the test proxies, which face the test's own clients only).
        self._slots = threading.BoundedSemaphore(max_connections) if max_connections else None
        self.target = (target_host, target_port or 0)
        self.host = host
        self.record = record
        self.route = route
        self.sent = bytearray()  # every byte the clients sent, when ``record``
        self.connections: Counter[tuple[str, int]] = Counter()
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.port = port or 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> TcpProxy:
        """Listen (again) on :attr:`port` and forward every connection."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        sock.listen(512)
        self.port = int(sock.getsockname()[1])
        self._listener = sock
        threading.Thread(target=self._accept, args=(sock,), name=f"tcpproxy-{self.port}", daemon=True).start()
        return self

    restore = start

    def cut(self) -> None:
        """Refuse new connections and reset every open one."""
        listener, self._listener = self._listener, None
        if listener is not None:
            try:  # wakes the thread blocked in accept(); a close alone leaves the socket listening until it returns
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, set()
        for conn in conns:
            try:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            except OSError:
                pass
        for conn in conns:
            # a close alone leaves the connection open while a pump thread is blocked in recv() on it (the call
            # holds the socket): the peer saw nothing until it sent again. SHUT_RD wakes that recv; the reset
            # goes out as the last reference drops
            try:
                conn.shutdown(socket.SHUT_RD)
            except OSError:
                pass
            conn.close()

    close = cut

    def _accept(self, listener: socket.socket) -> None:
        """Accept until :meth:`cut` replaces the listener. A failed accept (no file descriptor left, a client
        reset before it was accepted) is logged and retried: the proxy never stops accepting while it holds
        the port.
        """
        while True:
            try:
                client, _ = listener.accept()
            except OSError as exc:
                if self._listener is not listener:  # cut() (or a restore that made a new listener)
                    return
                log.warning("tcpproxy %s: accept failed (%s); accepting again", self.address, exc)
                time.sleep(0.1)
                continue
            if self._slots is not None and not self._slots.acquire(blocking=False):
                log.warning("tcpproxy %s: connection limit reached; a new connection is reset", self.address)
                self._drop(client, reset=True)
                continue
            try:
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                with self._lock:
                    self._conns.add(client)
                if self.route is None:
                    self._connect(client, b"")
                else:  # reading the first bytes waits for the client: not on the accepting thread
                    threading.Thread(target=self._connect, args=(client, None), daemon=True).start()
            except (OSError, RuntimeError) as exc:  # a client reset already; no thread could be started
                log.warning("tcpproxy %s: connection dropped (%s)", self.address, exc)
                self._end(client)

    def _connect(self, client: socket.socket, first: bytes | None) -> None:
        """Connect ``client`` to its target (the first candidate of :attr:`route` that accepts) and pump."""
        if first is None:
            try:
                client.settimeout(_FIRST_BYTES_TIMEOUT_S)
                first = client.recv(_PEEK_BYTES)
                client.settimeout(None)
            except OSError:  # also the timeout
                first = b""
            if not first:
                self._end(client)
                return
        candidates = [self.target] if self.route is None else list(self.route(first))
        upstream = None
        for target in candidates:
            try:
                upstream = socket.create_connection(target, timeout=5)
                break
            except OSError as exc:
                log.debug("tcpproxy %s: %s:%d refused (%s); next candidate", self.address, *target, exc)
        if upstream is None:
            log.warning("tcpproxy %s: no target accepted the connection (%s)", self.address, candidates)
            self._end(client)
            return
        with self._lock:
            if client not in self._conns:  # cut() reset the client while this connected: go no further
                upstream.close()
                self._release()
                return
            self._conns.add(upstream)
            self.connections[target] += 1
            if self.record and first:
                self.sent.extend(first)
        try:
            upstream.settimeout(None)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if first:
                upstream.sendall(first)
        except OSError:
            self._end(client, upstream)
            return
        pumps = [2]

        def finished() -> None:  # both directions are done: free the sockets and the slot
            with self._lock:
                pumps[0] -= 1
                last = pumps[0] == 0
            if last:
                self._end(client, upstream)

        for src, dst, record in ((client, upstream, self.record), (upstream, client, False)):
            threading.Thread(target=self._pump, args=(src, dst, record, finished), daemon=True).start()

    def _release(self) -> None:
        if self._slots is not None:
            self._slots.release()

    def _end(self, client: socket.socket, *others: socket.socket) -> None:
        """Close a connection's sockets and free its slot (once per accepted client)."""
        self._drop(client, *others)
        self._release()

    def _drop(self, *socks: socket.socket, reset: bool = False) -> None:
        for s in socks:
            try:
                if reset:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
                s.close()
            except OSError:
                pass
        with self._lock:
            self._conns -= set(socks)

    def _pump(self, src: socket.socket, dst: socket.socket, record: bool, finished: Callable[[], None]) -> None:
        """Copy ``src`` to ``dst``. The end of ``src``'s stream half-closes ``dst`` (the other direction goes on:
        a client that shuts its write side still gets its response); an error shuts both down.
        """
        try:
            while True:
                chunk = src.recv(65536)
                if not chunk:
                    try:
                        dst.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    break
                if record:
                    with self._lock:
                        self.sent.extend(chunk)
                dst.sendall(chunk)
        except OSError:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        finally:
            finished()

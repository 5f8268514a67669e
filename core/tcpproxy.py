"""A loopback TCP proxy: sees what crosses a boundary, and can cut it.

Two uses, one implementation:

- privacy tests read the bytes a client really sends (``record=True``:
  :class:`fedfraud.training.fraud.federated.wire.RecordingProxy` decodes them as gRPC);
- fault tests put it in front of a real server (the broker, Redis) and
  :meth:`TcpProxy.cut` it: open connections are reset and new ones refused,
  which is what a restarting server looks like from the client, while the
  server keeps its data; :meth:`TcpProxy.restore` accepts again on the same port.
"""

from __future__ import annotations

import socket
import threading

__all__ = ["TcpProxy"]

_RESET = b"\x01\x00\x00\x00\x00\x00\x00\x00"  # SO_LINGER on, 0 s: close() sends RST, not FIN


class TcpProxy:
    """Forward ``127.0.0.1:port`` to ``target_host:target_port`` (``port`` 0 or None: the OS picks one)."""

    def __init__(self, target_port: int, port: int | None = None, target_host: str = "127.0.0.1",
                 record: bool = False) -> None:
        self.target = (target_host, target_port)
        self.record = record
        self.sent = bytearray()  # every byte the clients sent, when ``record``
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.port = port or 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> TcpProxy:
        """Listen (again) on :attr:`port` and forward every connection."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(128)
        self.port = int(sock.getsockname()[1])
        self._listener = sock
        threading.Thread(target=self._accept, args=(sock,), name=f"tcpproxy-{self.port}", daemon=True).start()
        return self

    restore = start

    def cut(self) -> None:
        """Refuse new connections and reset every open one."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, set()
        for conn in conns:
            try:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
                conn.close()
            except OSError:
                pass

    close = cut

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed by cut()
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns |= {client, upstream}
            for src, dst, record in ((client, upstream, self.record), (upstream, client, False)):
                threading.Thread(target=self._pump, args=(src, dst, record), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, record: bool) -> None:
        try:
            while True:
                chunk = src.recv(65536)
                if not chunk:
                    break
                if record:
                    with self._lock:
                        self.sent.extend(chunk)
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            with self._lock:
                self._conns -= {src, dst}

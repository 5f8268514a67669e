"""Issue 37 finding 7: the ``xgboost.federated`` server never speaks plaintext, since libxgboost binds it to 0.0.0.0.

A real server process (``python -m fedfraud.training.fraud.federated.hist server``) is asked for an HTTP/2
connection in clear: directly, it does not answer one (it wants a TLS handshake); through the loopback relay
that a ``tls=False`` session uses, the same plaintext bytes reach it over mutual TLS and it answers with HTTP/2
SETTINGS. Started without certificates, the server refuses to run.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fedfraud.core.net import LOOPBACK, free_port, wait_for_port

pytestmark = pytest.mark.integration

_MODULE = "fedfraud.training.fraud.federated.hist"
#: HTTP/2 client connection preface plus an empty SETTINGS frame: what a gRPC client sends first in clear.
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _first_bytes(port: int) -> bytes:
    """Send the plaintext HTTP/2 preface to ``127.0.0.1:port``; the first bytes answered ("" if none in 3 s)."""
    with socket.create_connection((LOOPBACK, port), timeout=5) as sock:
        sock.sendall(_PREFACE)
        sock.settimeout(3)
        try:
            return sock.recv(64)
        except (TimeoutError, ConnectionResetError):
            return b""


def _is_http2_settings(data: bytes) -> bool:
    return len(data) >= 9 and data[3] == 0x04  # frame header: 3 bytes length, then the type (4: SETTINGS)


def test_the_server_speaks_only_tls_and_plaintext_banks_reach_it_through_a_loopback_relay(tmp_path: Path) -> None:
    from fedfraud.training.fraud.federated.hist import _TlsBridge, make_tls_files

    files = make_tls_files(tmp_path / "tls")
    server_port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", _MODULE, "server", "--port", str(server_port), "--world", "2", "--timeout", "60",
         "--server-key", str(files.server_key), "--server-cert", str(files.server_cert),
         "--client-cert", str(files.client_cert)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bridge = None
    try:
        wait_for_port(server_port, server, "federated server", timeout_s=60)
        assert not _is_http2_settings(_first_bytes(server_port))  # no gRPC in clear on the server's port
        bridge = _TlsBridge(free_port(), server_port, files).start()
        assert _is_http2_settings(_first_bytes(bridge.port))  # the same bytes, relayed over mutual TLS
    finally:
        if bridge is not None:
            bridge.close()
        server.kill()
        server.wait(timeout=10)


def test_the_server_refuses_to_start_without_its_certificates() -> None:
    done = subprocess.run([sys.executable, "-m", _MODULE, "server", "--port", str(free_port()), "--world", "2",
                           "--timeout", "5"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "never runs in plaintext" in done.stderr

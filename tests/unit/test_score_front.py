"""The direct-ingress front (``serving/front.py``) on real sockets: small HTTP servers stand in for two replicas'
own ports and for Serve's proxy, so routing, fallback and refresh are checked without Ray (the end-to-end case,
with Serve's real replicas and token, is ``tests/integration/test_direct_ingress.py``).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from fedfraud.core.net import free_port
from fedfraud.serving.front import ScoreFront, first_path


def _server(name: str) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as Serve's uvicorn

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = f"{name} {self.path} {len(self.rfile.read(length))}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def servers() -> Iterator[dict[str, ThreadingHTTPServer]]:
    found = {name: _server(name) for name in ("a", "b", "proxy")}
    yield found
    for server in found.values():
        server.shutdown()
        server.server_close()


def _address(server: ThreadingHTTPServer) -> tuple[str, int]:
    return "127.0.0.1", int(server.server_address[1])


def _who(url: str, path: str = "/score", body: bytes = b"{}") -> str:
    with httpx.Client(timeout=5) as client:  # a connection of its own
        return client.post(f"{url}{path}", content=body).text.split()[0]


def test_connections_go_round_robin_to_the_replicas_then_to_the_proxy(servers) -> None:
    replicas = [_address(servers["a"]), _address(servers["b"])]
    front = ScoreFront("127.0.0.1", 0, _address(servers["proxy"]), lambda: replicas, refresh_s=0.05,
                       proxy_prefixes=("/tokenizer",)).start()
    try:
        assert front.url.startswith("http://127.0.0.1:") and front.targets == tuple(replicas)
        assert sorted(_who(front.url) for _ in range(4)) == ["a", "a", "b", "b"]
        # keep-alive passes through: one connection, one replica, every request answered in full
        with httpx.Client(timeout=5) as client:
            answers = [client.post(f"{front.url}/score", content=b"x" * n).text for n in (10, 70_000, 3)]
        assert len({a.split()[0] for a in answers}) == 1 and [a.split()[2] for a in answers] == ["10", "70000", "3"]
        # another application's prefix goes to Serve's proxy, which routes by path
        assert _who(front.url, "/tokenizer/tokenize") == "proxy"
        assert _who(front.url, "/tokenizerx") in ("a", "b")
        assert front.routed() == {"replica": 6, "proxy": 1}
        # a replica that went away is skipped; with none left accepting, the proxy answers
        servers["a"].shutdown()
        servers["a"].server_close()
        assert {_who(front.url) for _ in range(4)} == {"b"}
        replicas.pop()  # the refresh reads the list again: only the dead replica is published now
        for _ in range(100):
            if len(front.targets) == 1:
                break
            threading.Event().wait(0.05)
        assert front.targets == (replicas[0],) and _who(front.url) == "proxy"
        replicas.clear()  # no replica port published: everything through the proxy
        threading.Event().wait(0.2)
        assert front.targets == () and _who(front.url) == "proxy"
    finally:
        front.stop()
    with pytest.raises(httpx.ConnectError):
        _who(front.url)


def test_the_front_binds_exactly_its_host_and_port_and_refuses_a_taken_one(servers) -> None:
    port = free_port()
    front = ScoreFront("127.0.0.1", port, _address(servers["proxy"]), lambda: []).start()
    try:
        assert front.url == f"http://127.0.0.1:{port}"
        with pytest.raises(OSError):
            ScoreFront("127.0.0.1", port, _address(servers["proxy"]), lambda: []).start()
    finally:
        front.stop()


def test_a_failing_replica_list_keeps_the_last_one(servers) -> None:
    calls = {"n": 0}

    def replicas() -> list[tuple[str, int]]:
        calls["n"] += 1
        if calls["n"] > 1:
            raise RuntimeError("Serve's controller is restarting")
        return [_address(servers["a"])]

    front = ScoreFront("127.0.0.1", 0, _address(servers["proxy"]), replicas, refresh_s=0.02).start()
    try:
        threading.Event().wait(0.2)
        assert calls["n"] > 2 and _who(front.url) == "a"
    finally:
        front.stop()


def test_a_client_that_sends_nothing_then_closes_leaves_nothing_behind(servers) -> None:
    front = ScoreFront("127.0.0.1", 0, _address(servers["proxy"]), lambda: [_address(servers["a"])]).start()
    try:
        host, port = front.url.removeprefix("http://").split(":")
        socket.create_connection((host, int(port)), timeout=5).close()
        assert _who(front.url) == "a" and front.routed() == {"replica": 1, "proxy": 0}
    finally:
        front.stop()


def test_a_flood_of_idle_connections_is_capped_and_a_freed_slot_serves_again(servers) -> None:
    """Each held connection costs threads and descriptors: past ``max_connections`` a new one is reset, and the
    front keeps accepting once a slot is free (review of issue 42's front)."""
    front = ScoreFront("127.0.0.1", 0, _address(servers["proxy"]), lambda: [_address(servers["a"])],
                       max_connections=2).start()
    host, port = front.url.removeprefix("http://").split(":")
    idle = [socket.create_connection((host, int(port)), timeout=5) for _ in range(2)]
    try:
        for s in idle:
            s.sendall(b"P")  # one byte: each holds its slot (and its replica connection) until it closes
        threading.Event().wait(0.3)
        with pytest.raises(httpx.TransportError):  # a third is reset at once
            _who(front.url)
        idle.pop().close()
        deadline = threading.Event()
        for _ in range(50):  # the closed connection's pumps end, and its slot comes back
            try:
                assert _who(front.url) == "a"
                break
            except httpx.TransportError:
                deadline.wait(0.1)
        else:
            pytest.fail("the freed slot never served a new connection")
    finally:
        for s in idle:
            s.close()
        front.stop()


def test_a_client_that_half_closes_after_its_request_still_gets_the_response(servers) -> None:
    front = ScoreFront("127.0.0.1", 0, _address(servers["proxy"]), lambda: [_address(servers["a"])]).start()
    host, port = front.url.removeprefix("http://").split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
            s.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"a /score 2")
    finally:
        front.stop()


@pytest.mark.parametrize(("first", "path"), [
    (b"POST /score HTTP/1.1\r\nHost: x\r\n\r\n{}", "/score"),
    (b"GET /tokenizer/tokenize?x=1 HTTP/1.1\r\n", "/tokenizer/tokenize?x=1"),
    (b"\x16\x03\x01 TLS hello", ""),
    (b"", ""),
])
def test_first_path(first: bytes, path: str) -> None:
    assert first_path(first) == path

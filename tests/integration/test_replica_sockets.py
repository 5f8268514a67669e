"""Issue 37, finding 1: while ``fedfraud serve`` runs, no process of its tree listens beyond loopback.

Ray Serve 2.55 opens an unauthenticated, unpickling gRPC server on ``[::]`` in every replica
(``serving/grpc_bind.py``). This test runs the real command, as an operator would: the scorer app and the
tokenizer app deployed on a Ray and an embedded broker that the command starts itself. Once ``/readyz`` says the
consumer is up, it lists every listening socket of the command's whole process tree (the CLI, GCS, raylet, Ray's
agents, Serve's controller and proxy, both replicas, the Tansu broker) with psutil.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from fedfraud.core.net import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def _publish_models(registry: Path) -> None:
    """The cheapest real models the command serves: the serving bench's fraud and anomaly models and a tokenizer."""
    from fedfraud.bench.serving import COLUMNS, publish_bench_models
    from fedfraud.config import FedfraudConfig
    from fedfraud.training.data.config import GeneratorConfig
    from fedfraud.training.data.synthetic import generate_frame
    from fedfraud.training.registry import ModelRegistry
    from fedfraud.training.tokenizer.config import TokenizerConfig
    from fedfraud.training.tokenizer.export import build_tokenizer
    from fedfraud.training.tokenizer.trainer import publish_tokenizer

    frame, _ = generate_frame(GeneratorConfig(banks=1, cardholders=40, days=20, seed=5))
    frame = frame.sort_values(["timestamp", "transaction_id"]).reset_index(drop=True)[COLUMNS]
    publish_bench_models(ModelRegistry(registry), frame.head(400), FedfraudConfig())
    tcfg = TokenizerConfig(vocab_size=300)
    publish_tokenizer(registry, build_tokenizer([(b"t", b"h")], tcfg.special_tokens), tcfg, metrics={},
                      privacy={}, card="test")


def _listening(root: psutil.Process) -> list[tuple[str, str, int]]:
    """(process name, address, port) of every listening inet socket of ``root`` and all its descendants."""
    found = []
    for proc in [root, *root.children(recursive=True)]:
        try:
            conns, name = proc.net_connections(kind="inet"), proc.name()
        except psutil.Error:
            continue
        found += [(name, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return found


def test_fedfraud_serve_listens_on_loopback_only(tmp_path: Path, api_token) -> None:
    _publish_models(tmp_path / "registry")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for var in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_SERVE_USE_GRPC_BY_DEFAULT"):
        env.pop(var, None)  # a Ray of the command's own, with Serve's defaults
    cmd = [sys.executable, "-m", "fedfraud", "--set", f"features.repo_dir={tmp_path / 'repo'}",
           "--set", f"serving.auth.token_file={api_token.file}", "serve", "--registry", str(tmp_path / "registry"),
           "--port", str(port)]
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        ready = False
        with httpx.Client(timeout=5) as client:
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    if client.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                        tok = client.get(f"http://127.0.0.1:{port}/tokenizer/tokenizer", headers=api_token.headers)
                        if tok.status_code == 200:
                            ready = True
                            break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        assert ready, (tmp_path / "serve.log").read_text()[-4000:]
        # a replica that already answers may name its process and open its gRPC listener a moment later (seen once
        # on a fresh clone): list again until both replicas are there, then check everything that listens
        for _ in range(150):
            sockets = _listening(psutil.Process(proc.pid))
            names = {name for name, _, _ in sockets}
            apps = ("fedfraud", "fedfraud-tokenizer")
            if all(any(n.startswith(f"ray::ServeReplica:{app}:") for n in names) for app in apps):
                break
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    names = {name for name, _, _ in sockets}
    # the check saw what it is about: Ray's servers, both replicas, the proxy on the command's port, the broker
    assert {"gcs_server", "raylet"} <= names, sockets
    assert any(n.startswith("ray::ServeReplica:fedfraud:") for n in names), sockets
    assert any(n.startswith("ray::ServeReplica:fedfraud-tokenizer:") for n in names), sockets
    assert ("ray::ProxyActor", "127.0.0.1", port) in sockets, sockets
    exposed = [s for s in sockets if s[1] not in LOOPBACK]
    assert exposed == [], f"listening beyond loopback: {exposed}"


def test_a_wildcard_grpc_bind_in_a_replica_process_lands_on_loopback() -> None:
    """The mechanism itself, on a real grpc.aio server: ``[::]:0`` becomes ``127.0.0.1:N``; a named host stays."""
    import asyncio

    import grpc
    from grpc.aio import _server

    from fedfraud.serving.grpc_bind import confine_replica_grpc

    async def bind(address: str) -> list[tuple[str, int]]:
        server = grpc.aio.server()
        port = server.add_insecure_port(address)
        await server.start()
        try:
            me = psutil.Process()
            return [(c.laddr.ip, c.laddr.port) for c in me.net_connections(kind="inet")
                    if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
        finally:
            await server.stop(None)

    original = _server.Server.add_insecure_port
    try:
        before = asyncio.run(bind("[::]:0"))
        assert before and all(ip not in LOOPBACK for ip, _ in before)  # what Serve's replica does today
        assert confine_replica_grpc() == "127.0.0.1"
        assert confine_replica_grpc() == "127.0.0.1"  # idempotent: not wrapped twice
        after = asyncio.run(bind("[::]:0"))
        assert after and all(ip in LOOPBACK for ip, _ in after), after
        named = asyncio.run(bind("127.0.0.1:0"))
        assert named and named[0][0] in LOOPBACK
    finally:
        _server.Server.add_insecure_port = original  # this process is pytest's, not a replica's

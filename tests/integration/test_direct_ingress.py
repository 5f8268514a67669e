"""``serving.direct_ingress``: the documented port reaches the replica's own port (the front, ``serving/front.py``),
behind the same bearer token, and nothing listens beyond loopback.

Ray Serve reads the flag when its controller and replicas start, so the case runs in a fresh child process that
starts Ray itself (as ``fedfraud serve`` does); the session's shared Ray is left alone. The child starts the
embedded broker, Feast (SQLite), Ray Serve, the scorer and the tokenizer apps and the front, talks HTTP to the
documented port, to the replica's port and to Serve's proxy (now on a loopback port of its own), and lists every
listening socket of its process tree (itself, Ray's GCS and raylet, Serve's controller and proxy, the replicas, the
broker) with psutil.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.long]

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}

CHILD = r"""
import json, os, sys
from pathlib import Path
import httpx, psutil
from fedfraud.bench.serving import COLUMNS, publish_bench_models
from fedfraud.config import load_config
from fedfraud.core.net import free_port
from fedfraud.serving.replay import wire_records
from fedfraud.serving.runtime import start
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.training.data.synthetic import generate_frame
from fedfraud.training.registry import ModelRegistry
from fedfraud.training.tokenizer.config import TokenizerConfig
from fedfraud.training.tokenizer.export import build_tokenizer
from fedfraud.training.tokenizer.trainer import publish_tokenizer

tmp, token_file = Path(sys.argv[1]), sys.argv[2]
port = free_port()
cfg = load_config(overrides=[f"features.repo_dir={tmp / 'repo'}", f"serving.registry_root={tmp / 'registry'}",
                             f"serving.auth.token_file={token_file}", f"serving.http_port={port}",
                             "serving.direct_ingress=true"])
frame, _ = generate_frame(GeneratorConfig(banks=1, cardholders=60, days=30, seed=3))
frame = frame.sort_values(["timestamp", "transaction_id"]).reset_index(drop=True)[COLUMNS]
publish_bench_models(ModelRegistry(tmp / "registry"), frame.head(600), cfg)
tcfg = TokenizerConfig(vocab_size=300)
publish_tokenizer(tmp / "registry", build_tokenizer([(b"t", b"h")], tcfg.special_tokens), tcfg, metrics={},
                  privacy={}, card="test")
rt = start(cfg, consume=False)
out = {"port": port, "front": rt.url, "proxy": rt.proxy_url, "direct": rt.direct_urls(), "pid": os.getpid()}
try:
    record, other = wire_records(frame.iloc[700:702].reset_index(drop=True), rt.featurizer())
    with httpx.Client(timeout=30) as client:
        out["no_token"] = client.post(f"{rt.url}/score", json=record).status_code
        out["bad_token"] = client.post(f"{rt.url}/score", json=record,
                                       headers={"Authorization": "Bearer nope"}).status_code
        out["bad_body"] = client.post(f"{rt.url}/score", content=b"{not json", headers=rt.headers).status_code
        front = client.post(f"{rt.url}/score", json=record, headers=rt.headers)
        direct = client.post(f"{out['direct'][0]}/score", json=record, headers=rt.headers)  # the same transaction
        out["front_status"], out["direct_status"] = front.status_code, direct.status_code
        out["front_body"], out["direct_body"] = front.json(), direct.json()
        out["proxy_status"] = client.post(f"{rt.proxy_url}/score", json=other, headers=rt.headers).status_code
        out["healthz"] = client.get(f"{rt.url}/healthz").status_code
    with httpx.Client(timeout=30) as client:  # a connection of its own: the first request's prefix routes it
        out["tokenizer"] = client.get(f"{rt.url}/tokenizer/tokenizer", headers=rt.headers).status_code
        out["tokenizer_no_token"] = client.get(f"{rt.url}/tokenizer/tokenizer").status_code
    out["routed"] = rt.front.routed()
    found = []
    for proc in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            conns, name = proc.net_connections(kind="inet"), proc.name()
        except psutil.Error:
            continue
        found += [(name, proc.pid, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    out["sockets"] = found
finally:
    rt.stop()
with httpx.Client(timeout=5) as client:  # the front went with the runtime: nothing answers on the documented port
    try:
        out["after_stop"] = client.get(f"{rt.url}/healthz").status_code
    except httpx.ConnectError:
        out["after_stop"] = "refused"
# a second deployment on the same Ray and Serve (as a bench's next block): the front binds the documented port
# again and falls back to the proxy Serve already runs, wherever that is
rt = start(cfg, consume=False)
try:
    record = wire_records(frame.iloc[710:711].reset_index(drop=True), rt.featurizer())[0]
    out["again"] = [rt.url, rt.proxy_url, httpx.post(f"{rt.url}/score", json=record, headers=rt.headers,
                                                     timeout=30).status_code]
finally:
    rt.stop()
print("RESULT " + json.dumps(out))
"""


def test_the_documented_port_reaches_the_replica_directly_with_the_same_token(tmp_path: Path, api_token) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for var in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_SERVE_USE_GRPC_BY_DEFAULT"):
        env.pop(var, None)  # a Ray of its own, started with the flag in its environment, with Serve's defaults
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), str(api_token.file)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])

    port = out["port"]
    assert out["front"] == f"http://127.0.0.1:{port}"  # the documented address
    assert out["direct"], "Serve published no replica port"
    assert out["direct"][0].startswith("http://127.0.0.1:") and out["proxy"].startswith("http://127.0.0.1:")
    assert len({out["front"], out["direct"][0], out["proxy"]}) == 3  # Serve's proxy moved off the documented port
    # authentication and input checks are the replica's, through the front as on its own port
    assert (out["no_token"], out["bad_token"], out["bad_body"]) == (401, 403, 422)
    assert out["front_status"] == out["direct_status"] == out["proxy_status"] == 200
    assert out["healthz"] == 200
    (front,), (direct,) = out["front_body"]["decisions"], out["direct_body"]["decisions"]
    # one scorer behind both doors: the second request is a redelivery of the first, answered with its decision
    assert front["transaction_id"] == direct["transaction_id"]
    assert front["score"] == direct["score"] and front["decision"] == direct["decision"]
    # the tokenizer app is another application: its prefix goes to Serve's proxy, which routes by path
    assert (out["tokenizer"], out["tokenizer_no_token"]) == (200, 401)
    # every /score connection went to the replica's own port (the fast path), the tokenizer's to the proxy
    assert out["routed"]["replica"] >= 1 and out["routed"]["proxy"] == 1, out["routed"]

    assert out["after_stop"] == "refused"
    assert out["again"] == [out["front"], out["proxy"], 200]

    sockets = [tuple(s) for s in out["sockets"]]
    names = {name for name, _, _, _ in sockets}
    assert {"gcs_server", "raylet", "ray::ProxyActor"} <= names, sockets
    assert any(n.startswith("ray::ServeReplica:fedfraud:") for n in names), sockets
    holders = {(pid, ip) for _, pid, ip, p in sockets if p == port}
    assert holders == {(out["pid"], "127.0.0.1")}, sockets  # the documented port: the front, in the owning process
    proxy_port = int(out["proxy"].rsplit(":", 1)[1])
    assert any(n == "ray::ProxyActor" and p == proxy_port for n, _, _, p in sockets), sockets
    exposed = [s for s in sockets if s[2] not in LOOPBACK]
    assert exposed == [], f"listening beyond loopback: {exposed}"

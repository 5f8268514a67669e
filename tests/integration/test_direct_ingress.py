"""``serving.direct_ingress``: each replica answers ``POST /score`` on its own port, behind the same bearer token.

Ray Serve reads the flag when its controller and replicas start, so the case runs in a fresh child process that
starts Ray itself (as ``fedfraud serve`` does); the session's shared Ray is left alone. The child starts the
embedded broker, Feast (SQLite), Ray Serve and the app, then talks HTTP to the proxy and to the replica's port.
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

CHILD = r"""
import json, sys
from pathlib import Path
import httpx
from fedfraud.bench.serving import COLUMNS, publish_bench_models
from fedfraud.config import load_config
from fedfraud.core.net import free_port
from fedfraud.serving.replay import wire_records
from fedfraud.serving.runtime import start
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.training.data.synthetic import generate_frame
from fedfraud.training.registry import ModelRegistry

tmp, token_file = Path(sys.argv[1]), sys.argv[2]
cfg = load_config(overrides=[f"features.repo_dir={tmp / 'repo'}", f"serving.registry_root={tmp / 'registry'}",
                             f"serving.auth.token_file={token_file}", f"serving.http_port={free_port()}",
                             "serving.direct_ingress=true"])
frame, _ = generate_frame(GeneratorConfig(banks=1, cardholders=60, days=30, seed=3))
frame = frame.sort_values(["timestamp", "transaction_id"]).reset_index(drop=True)[COLUMNS]
publish_bench_models(ModelRegistry(tmp / "registry"), frame.head(600), cfg)
rt = start(cfg, consume=False)
out = {"proxy": rt.url, "direct": rt.direct_urls()}
try:
    record = wire_records(frame.iloc[700:701].reset_index(drop=True), rt.featurizer())[0]
    with httpx.Client(timeout=30) as client:
        base = out["direct"][0]
        out["no_token"] = client.post(f"{base}/score", json=record).status_code
        out["bad_body"] = client.post(f"{base}/score", content=b"{not json", headers=rt.headers).status_code
        direct = client.post(f"{base}/score", json=record, headers=rt.headers)
        proxied = client.post(f"{rt.url}/score", json=record, headers=rt.headers)  # the same transaction again
        out["direct_status"], out["proxy_status"] = direct.status_code, proxied.status_code
        out["direct_body"], out["proxy_body"] = direct.json(), proxied.json()
        out["healthz"] = client.get(f"{base}/healthz").status_code
finally:
    rt.stop()
print("RESULT " + json.dumps(out))
"""


def test_replica_answers_score_on_its_own_port_with_the_same_token(tmp_path: Path, api_token) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("RAY_ADDRESS", None)  # a Ray of its own, started with the flag in its environment
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), str(api_token.file)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])

    assert out["direct"], "Serve published no replica port"
    direct_url = out["direct"][0]
    assert direct_url.startswith("http://127.0.0.1:") and direct_url != out["proxy"]  # loopback, not the proxy
    assert out["no_token"] == 401  # the replica's port checks the bearer token like the proxy's route does
    assert out["bad_body"] == 422  # bad input: a clear client error, never a 500
    assert out["direct_status"] == out["proxy_status"] == 200
    assert out["healthz"] == 200
    (direct,), (proxied,) = out["direct_body"]["decisions"], out["proxy_body"]["decisions"]
    # one scorer behind both doors: the second request is a redelivery of the first, answered with its decision
    assert direct["transaction_id"] == proxied["transaction_id"]
    assert direct["score"] == proxied["score"] and direct["decision"] == proxied["decision"]

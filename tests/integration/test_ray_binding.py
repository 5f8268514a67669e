"""Issue 17: a Ray started by fedfraud listens on loopback only (GCS, raylet, object manager, agents, workers).

Each case starts Ray in a fresh child process, the way the product starts it (serving's ``ensure_ray``; the
Flower simulation backend with the federated trainer's ``backend_config``), runs one task so a worker's gRPC
server is up too, and lists every listening socket of that process tree with psutil.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}

START = {
    "serving": "from fedfraud.serving.runtime import ensure_ray\nensure_ray(1)\n",
    "federated simulation": (
        "from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend\n"
        "from fedfraud.config import FedfraudConfig\n"
        "from fedfraud.training.anomaly.federated.task import RunSettings\n"
        "from fedfraud.training.anomaly.federated.trainer import backend_config\n"
        "settings = RunSettings.from_config(FedfraudConfig(), 'data', 'out')\n"
        "RayBackend(backend_config(settings, 1))\n"
    ),
}

LIST_SOCKETS = """
import json, os, time
import psutil, ray

@ray.remote
def pid():
    return os.getpid()

ray.get(pid.remote())
time.sleep(1.0)
me = psutil.Process()
found = []
for proc in [me, *me.children(recursive=True)]:
    try:
        conns = proc.net_connections(kind="inet")
        name = proc.name()
    except psutil.Error:
        continue
    found += [[name, c.laddr.ip, c.laddr.port] for c in conns if c.status == psutil.CONN_LISTEN]
ray.shutdown()
print("SOCKETS " + json.dumps(found))
"""


@pytest.mark.parametrize("how", sorted(START))
def test_ray_listens_on_loopback_only(how: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)  # the product sets it; the test must not
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-c", START[how] + LIST_SOCKETS], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("SOCKETS "))
    sockets = json.loads(line.removeprefix("SOCKETS "))
    names = {name for name, _, _ in sockets}
    assert {"gcs_server", "raylet"} <= names, sockets  # the check saw Ray's servers at all
    exposed = [s for s in sockets if s[1] not in LOOPBACK]
    assert exposed == [], f"listening beyond loopback: {exposed}"

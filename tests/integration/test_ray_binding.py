"""Issue 17: a Ray started by fedfraud listens on loopback only (GCS, raylet, object manager, agents, workers).

Each case starts Ray in a fresh child process, the way the product starts it (the Flower simulation backend with
the federated trainer's ``backend_config``), runs one task so a worker's gRPC server is up too, and lists every
listening socket of that process tree with psutil. Serving's Ray (``ensure_ray``) is covered by
``test_replica_sockets.py``, which audits the whole tree of a running ``fedfraud serve``, that Ray included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}

START = {
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


@pytest.fixture(scope="module")
def children(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[subprocess.Popen, Path]]]:
    """Every case's child, started at once: each starts a Ray of its own in its own process tree, and most of a
    child's ~10-20 s is spent waiting for Ray's processes, so side by side they take little more than one."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)  # the product sets it; the test must not
    env.pop("RAY_ADDRESS", None)
    folder = tmp_path_factory.mktemp("ray-binding")
    started = {}
    for i, (how, code) in enumerate(sorted(START.items())):
        out = folder / f"child-{i}"
        with out.with_suffix(".out").open("w") as stdout, out.with_suffix(".err").open("w") as stderr:
            started[how] = (subprocess.Popen([sys.executable, "-c", code + LIST_SOCKETS], cwd=ROOT, env=env,
                                             stdout=stdout, stderr=stderr, text=True), out)
    yield started
    for proc, _ in started.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("how", sorted(START))
def test_ray_listens_on_loopback_only(how: str, children: dict[str, tuple[subprocess.Popen, Path]]) -> None:
    proc, out = children[how]
    returncode = proc.wait(timeout=300)
    assert returncode == 0, out.with_suffix(".err").read_text()[-3000:]
    line = next(ln for ln in out.with_suffix(".out").read_text().splitlines() if ln.startswith("SOCKETS "))
    sockets = json.loads(line.removeprefix("SOCKETS "))
    names = {name for name, _, _ in sockets}
    assert {"gcs_server", "raylet"} <= names, sockets  # the check saw Ray's servers at all
    exposed = [s for s in sockets if s[1] not in LOOPBACK]
    assert exposed == [], f"listening beyond loopback: {exposed}"

"""The scoring app on a two-node Ray cluster started with the ``ray`` CLI, deployed with ``serve deploy``.

A head (``ray start --head``) and a second node (``ray start --address``) run on this machine, each with one
CPU and a small object store. ``infra/serve_config.yaml`` is deployed with ``serve deploy`` after its
addresses have been pointed at this machine: the embedded broker, the Feast repo and the model registry in
a temp folder. The test streams through 2 partitions and 2 ``StreamScorer`` replicas, one on each node.
Then it reads the whole ``fraud-decisions`` topic and checks that every transaction was decided exactly
once.

Ray 2.55 refuses a second node in its loopback-only mode, so these two nodes listen on every interface
while the test runs (docs/security.md). The test stops only the processes it started: those whose
command line names its own Ray temp folder. ``ray stop`` would stop every Ray on the machine.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from fedfraud.core.net import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PARTITIONS = REPLICAS = 2
OBJECT_STORE_BYTES = 100 * 1024 * 1024


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # the dashboard (where `serve deploy` submits) starts its modules in subprocesses, 30 s each by default,
    # and `ray start` waits 60 s for it: too short on two shared cores under load
    env["RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT"] = "300"
    env["RAY_DASHBOARD_STARTUP_TIMEOUT_S"] = "300"
    return env


def _run(*args: str, timeout: float = 180) -> str:
    done = subprocess.run(list(args), env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          check=False)
    assert done.returncode == 0, f"{' '.join(args)}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _stop_processes_under(folder: str) -> int:
    """Terminate (then kill) every process whose command line names ``folder``: this test's Ray, nobody else's."""
    import psutil

    mine = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if folder in " ".join(proc.info["cmdline"] or ()):
                mine.append(proc)
        except psutil.Error:
            continue
    for proc in mine:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(mine, timeout=15)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    return len(mine)


@pytest.fixture(scope="module")
def cluster():
    """A Ray head and a second node, started with the CLI; every process of theirs stopped at the end."""
    temp = tempfile.mkdtemp(prefix="fr", dir="/tmp")  # Ray's socket paths must stay short
    gcs, dashboard = free_port(), free_port()
    common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", f"--object-store-memory={OBJECT_STORE_BYTES}",
              f"--temp-dir={temp}", "--disable-usage-stats"]
    try:
        _run(str(BIN / "ray"), "start", "--head", f"--port={gcs}", "--include-dashboard=true",
             "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}", *common)
        _run(str(BIN / "ray"), "start", f"--address=127.0.0.1:{gcs}", *common)
        yield {"gcs": f"127.0.0.1:{gcs}", "dashboard": f"http://127.0.0.1:{dashboard}"}
    finally:
        _stop_processes_under(temp)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def deployed(cluster, tmp_path_factory, api_token):
    """Models in a registry, Feast applied, the broker up, and infra/serve_config.yaml deployed to the cluster."""
    from fedfraud.config import load_config
    from fedfraud.feature_store.feast_store import apply_repo, open_store
    from fedfraud.serving.kafka.broker import EmbeddedBroker
    from tests.integration.test_streaming_pipeline import COLUMNS, publish_anomaly
    from fedfraud.training.data.config import GeneratorConfig
    from fedfraud.training.data.synthetic import generate_frame
    from fedfraud.training.fraud.config import FraudConfig
    from fedfraud.training.fraud.features import build_features
    from fedfraud.training.fraud.model import fit_model
    from fedfraud.training.registry import ModelRegistry
    from fedfraud.feature_store.privacy import PrivateFeaturizer

    tmp = tmp_path_factory.mktemp("ray-cluster")
    http_port = free_port()
    cfg = load_config(overrides=[
        f"features.repo_dir={tmp / 'repo'}", f"serving.registry_root={tmp / 'registry'}",
        f"serving.auth.token_file={api_token.file}", f"serving.partitions={PARTITIONS}",
        f"serving.scorer_replicas={REPLICAS}", "serving.consumer.max_poll_records=200",
        # a replica starved of CPU on this shared machine must not miss its session and leave a zombie consumer
        "serving.consumer.session_timeout_ms=30000", "serving.consumer.heartbeat_interval_ms=5000",
        "serving.consumer.request_timeout_ms=45000",
    ])
    data, _ = generate_frame(GeneratorConfig(banks=1, cardholders=60, days=30, seed=21))
    frame = data.sort_values(["timestamp", "transaction_id"]).reset_index(drop=True)[COLUMNS]
    fcfg = FraudConfig(num_boost_round=10, nthread=1)
    train = frame.head(800)
    feats = build_features(train, PrivateFeaturizer.for_bank(cfg.encoder, cfg.privacy, 0).transform(train), fcfg)
    registry = ModelRegistry(tmp / "registry")
    model = fit_model(feats, feats, True, fcfg, "centralized")
    model.publish(registry, config={"fraud": fcfg.model_dump()}, metrics={})
    publish_anomaly(registry, cfg, seed=2)
    apply_repo(open_store(cfg.features))

    with EmbeddedBroker(topics={t: PARTITIONS for t in cfg.serving.topics.all()}) as broker:
        # the shipped config, with only its addresses pointed at this machine
        config = yaml.safe_load((ROOT / "infra" / "serve_config.yaml").read_text(encoding="utf-8"))
        config["proxy_location"] = "HeadOnly"  # two nodes on one machine cannot both bind the HTTP port
        config["http_options"] = {"host": "127.0.0.1", "port": http_port}
        (app,) = config["applications"]
        app["args"]["bootstrap_servers"] = broker.bootstrap_servers
        app["args"]["config"] = cfg.model_dump(mode="json")
        (scorer,) = app["deployments"]
        scorer.update(num_replicas=REPLICAS, max_replicas_per_node=1)  # one replica per node
        path = tmp / "serve_config.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        _run(str(BIN / "serve"), "deploy", str(path), "--address", cluster["dashboard"])
        try:
            _wait_ready(f"http://127.0.0.1:{http_port}", timeout_s=300)
            yield cfg, frame.iloc[800:1500].reset_index(drop=True), broker, f"http://127.0.0.1:{http_port}"
        finally:
            subprocess.run([str(BIN / "serve"), "shutdown", "-y", "--address", cluster["dashboard"]], env=_env(),
                           capture_output=True, timeout=120, check=False)


def _decided_per_replica(url: str, headers: dict[str, str]) -> dict[str, float]:
    """``fedfraud_decided_total`` of each replica, from any replica's /metrics (every replica's samples are there)."""
    import httpx

    text = httpx.get(f"{url}/metrics", headers=headers, timeout=30).text
    pattern = r'^fedfraud_decided_total\{[^}]*replica="([^"]+)"[^}]*\} (\S+)$'
    return {m.group(1): float(m.group(2)) for m in re.finditer(pattern, text, re.M)}


def _wait_ready(url: str, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=10).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise AssertionError(f"{url}/readyz not ready in {timeout_s:.0f} s")


def _board_after(url: str, headers: dict[str, str], total: float, timeout_s: float = 60.0) -> dict[str, float]:
    """:func:`_decided_per_replica` once the replicas' decisions add up to ``total`` or more: the metrics board
    publishes every 2 s, and a replica counts a batch only once the broker has its decisions."""
    deadline = time.monotonic() + timeout_s
    while sum((found := _decided_per_replica(url, headers)).values()) < total:
        assert time.monotonic() < deadline, f"the board shows {sum(found.values()):.0f} < {total:.0f} decisions"
        time.sleep(0.5)
    return found


def test_two_nodes_two_replicas_two_partitions_every_record_decided_once(cluster, deployed, api_token) -> None:
    from fedfraud.feature_store.privacy import PrivateFeaturizer
    from fedfraud.serving.replay import collect, replay_and_collect

    cfg, frame, broker, url = deployed
    s = cfg.serving
    featurizer = PrivateFeaturizer.for_bank(cfg.encoder, cfg.privacy, s.bank_id)

    # warm-up: while the second replica joins, the group rebalances (at least once, by design); stream until
    # both replicas have decided something, so each holds one partition
    warm, start, found = 0, time.monotonic(), {}
    while not (len(found) == REPLICAS and all(v > 0 for v in found.values())):
        assert time.monotonic() - start < 240 and warm < 300, f"one replica never decided: {found}"
        chunk = frame.iloc[warm:warm + 50]
        assert replay_and_collect(chunk, broker.bootstrap_servers, featurizer, timeout_s=120,
                                  topics=s.topics).missing == set()
        warm += len(chunk)
        found = _board_after(url, api_token.headers, warm)  # the chunk's decisions counted on the board
    part = frame.iloc[warm:warm + 400].reset_index(drop=True)
    before = found

    result = replay_and_collect(part, broker.bootstrap_servers, featurizer, rate=0, timeout_s=180, topics=s.topics)
    assert result.missing == set()

    # every replica has counted the stream (its decisions acknowledged by the broker); then the whole topic,
    # warm-up included, is read again: a duplicate produced by then would show up here
    after = _board_after(url, api_token.headers, sum(before.values()) + len(part))
    sent = frame["transaction_id"].iloc[:warm + len(part)].astype(str)
    everything = collect(broker.bootstrap_servers, s.topics.decisions, len(sent) + 1, timeout_s=5.0)
    counts = collections.Counter(d["transaction_id"] for d in everything)
    assert set(counts) == set(sent)
    twice = [(t, n, t in set(part["transaction_id"])) for t, n in counts.items() if n > 1]
    assert not twice, f"{len(twice)} transactions decided more than once (id, times, in the main stream): {twice[:5]}"
    assert not any(d.get("redelivered") for d in everything)

    # both replicas decided part of the stream (one partition each) and they ran on the two nodes
    delta = {r: after[r] - before.get(r, 0.0) for r in after}
    assert len(delta) == REPLICAS and all(v > 0 for v in delta.values()), delta
    assert sum(delta.values()) == len(part)
    actors = yaml.safe_load(_run(str(BIN / "ray"), "list", "actors", "--address", cluster["dashboard"],
                                 "--filter", "state=ALIVE", "--format", "yaml", "--limit", "1000"))
    replicas = [a for a in actors if a["class_name"].endswith("StreamScorer")]
    assert len(replicas) == REPLICAS
    assert len({a["node_id"] for a in replicas}) == REPLICAS

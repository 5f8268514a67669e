"""``fedfraud doctor`` (issue 37): each check on a real config, real environment variables and real sockets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fedfraud.cli.app import main
from fedfraud.config import load_config
from fedfraud.doctor import check_config, check_images, check_listeners

SECRETS = ("FEDFRAUD_API_TOKEN", "FEDFRAUD_BANK_SECRET", "FEDFRAUD_FEDERATION_KEY", "FEDFRAUD_SIMULATION_SECRET",
           "FEDFRAUD_KAFKA_PASSWORD", "FEDFRAUD_REDIS_PASSWORD", "RAY_SERVE_USE_GRPC_BY_DEFAULT")


@pytest.fixture
def bare_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in SECRETS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def _by_name(overrides: list[str]) -> dict[str, tuple[str, str]]:
    return {c.name: (c.status, c.detail) for c in check_config(load_config(None, overrides))}


def test_a_bare_environment_fails_on_the_missing_secrets(bare_env: pytest.MonkeyPatch) -> None:
    checks = _by_name([])
    assert checks["http auth"][0] == "fail" and "FEDFRAUD_API_TOKEN" in checks["http auth"][1]
    assert checks["bank secret"][0] == "fail" and "FEDFRAUD_BANK_SECRET" in checks["bank secret"][1]
    assert checks["kafka transport"][0] == "ok"  # the embedded broker is on loopback
    assert checks["serve replica grpc"][0] == "ok"


def test_a_bank_deployment_with_its_secrets_passes_them(bare_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    token = tmp_path / "api-token"
    token.write_text("t" * 40)
    token.chmod(0o600)
    bare_env.setenv("FEDFRAUD_BANK_SECRET", "s" * 32)
    bare_env.setenv("FEDFRAUD_FEDERATION_KEY", "k" * 32)
    checks = _by_name([f"serving.auth.token_file={token}"])
    assert checks["http auth"] == ("ok", f"bearer token from {token}")
    assert checks["bank secret"][0] == "ok"
    token.chmod(0o644)
    assert _by_name([f"serving.auth.token_file={token}"])["http auth"][0] == "warn"


def test_disabled_auth_and_plaintext_transports_fail(bare_env: pytest.MonkeyPatch) -> None:
    bare_env.setenv("FEDFRAUD_API_TOKEN", "t" * 40)
    checks = _by_name(["serving.auth.disabled=true", "serving.bootstrap_servers=kafka-0.bank.internal:9092",
                       "features.profile=redis", "features.redis.connection_string=redis.bank.internal:6379,db=0",
                       "serving.fraud_state_path=redis://redis.bank.internal:6379/1", "fraud.federated_tls=false"])
    assert checks["http auth"][0] == "fail"
    assert checks["kafka transport"][0] == "fail" and "PLAINTEXT" in checks["kafka transport"][1]
    assert checks["redis (features)"][0] == "fail" and "plaintext" in checks["redis (features)"][1]
    assert checks["redis (state)"][0] == "fail"
    assert checks["federated xgboost"][0] in {"warn", "fail"}


def test_tls_transports_with_their_passwords_pass(bare_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bare_env.setenv("FEDFRAUD_KAFKA_PASSWORD", "p" * 20)
    bare_env.setenv("FEDFRAUD_REDIS_PASSWORD", "r" * 20)
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    checks = _by_name(["serving.bootstrap_servers=kafka-0.bank.internal:9093",
                       "serving.kafka_security.security_protocol=SASL_SSL", "serving.kafka_security.sasl_mechanism="
                       "SCRAM-SHA-512", "serving.kafka_security.sasl_username=bank0", f"serving.kafka_security."
                       f"ssl_cafile={ca}", "features.profile=redis", "features.redis.connection_string="
                       "redis.bank.internal:6380,db=0", "features.redis.ssl=true",
                       "serving.fraud_state_path=rediss://redis.bank.internal:6380/1"])
    assert checks["kafka transport"][0] == "ok"
    assert checks["redis (features)"][0] == "ok"
    assert checks["redis (state)"][0] == "ok"
    bare_env.delenv("FEDFRAUD_KAFKA_PASSWORD")
    assert "FEDFRAUD_KAFKA_PASSWORD" in _by_name(["serving.bootstrap_servers=kafka-0:9093",
                                                  "serving.kafka_security.security_protocol=SASL_SSL",
                                                  "serving.kafka_security.sasl_mechanism=PLAIN",
                                                  "serving.kafka_security.sasl_username=b"])["kafka transport"][1]


def test_grpc_routing_and_a_cluster_ray_host_are_warned(bare_env: pytest.MonkeyPatch) -> None:
    bare_env.setenv("RAY_SERVE_USE_GRPC_BY_DEFAULT", "1")
    checks = _by_name(["serving.ray_host=10.1.2.3"])
    assert checks["serve replica grpc"][0] == "warn"
    assert checks["serving.ray_host"][0] == "warn"


def test_images_moving_tags_fail_digests_pass(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("spec:\n  containers:\n    - name: a\n      image: fedfraud/fedfraud:latest\n"
                                     "    - name: b\n      image: redis\n    - name: c\n      image: "
                                     "redis:7.2@sha256:" + "0" * 64 + "\n    - name: d\n      image: postgres:16.4\n")
    found = {c.detail: c.status for c in check_images(tmp_path)}
    assert found["redis: no tag (means latest)"] == "fail"
    assert found["fedfraud/fedfraud:latest: the moving tag latest"] == "fail"
    assert [s for d, s in found.items() if "@sha256:" in d] == ["ok"]
    assert found["postgres:16.4: a tag, not a digest"] == "warn"


LISTEN = "import socket, sys, time\ns = socket.socket()\ns.bind((sys.argv[1], 0))\ns.listen()\nprint('up', " \
         "flush=True)\ntime.sleep(60)\n"


@pytest.mark.parametrize(("host", "status"), [("0.0.0.0", "fail"), ("127.0.0.1", "ok")])
def test_listeners_of_a_real_process_tree(host: str, status: str) -> None:
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', "
                               f"{LISTEN!r}, {host!r}])"], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "up"
        (check,) = check_listeners([parent.pid])  # the listener is the parent's child: the tree is walked
        assert check.status == status, check
        assert ("0.0.0.0" in check.detail) == (status == "fail")
    finally:
        import psutil

        for proc in psutil.Process(parent.pid).children(recursive=True):
            proc.kill()
        parent.kill()
        parent.wait()


def test_the_command_exits_1_on_a_failure_and_2_on_a_bad_argument(bare_env: pytest.MonkeyPatch, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--manifests", str(tmp_path), "--pid", str(2**22 + 7)]) == 1
    out = capsys.readouterr()
    assert "FAIL  http auth" in out.out and "failed" in out.err
    assert main(["doctor", "--pid", "not-a-pid"]) == 2
    assert main(["doctor", "--manifests", str(tmp_path / "absent")]) == 2
    assert "does not exist" in capsys.readouterr().err

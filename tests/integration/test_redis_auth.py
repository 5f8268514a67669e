"""Issue 17: Redis with a password, and with a password over TLS, on a second real ``redis-server``.

The right password (from ``$FEDFRAUD_REDIS_PASSWORD``) works end to end: a cardholder state is written and
read through the online-store client and read through Feast's SDK, and serving's own state store round-trips.
A wrong or missing password stops at start-up with one line, naming the variable and never showing the value.
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from fedfraud.config import FedfraudConfig
from fedfraud.core.errors import UserError
from fedfraud.core.net import free_port, wait_for_port
from tests.prerequisites import require_binary

pytestmark = pytest.mark.integration

PASSWORD_ENV = "FEDFRAUD_REDIS_PASSWORD"


@dataclass(frozen=True)
class SecuredRedis:
    port: int
    password: str
    ca_file: str | None  # set when the server speaks TLS only

    @property
    def scheme(self) -> str:
        return "rediss" if self.ca_file else "redis"


@pytest.fixture(scope="module", params=["password", "password+tls"])
def secured(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredRedis]:
    """A second redis-server on a free port with ``requirepass`` (random per run), plain or TLS-only."""
    server = require_binary("redis-server")
    folder = tmp_path_factory.mktemp("redis")
    port, password = free_port(), secrets.token_hex(16)
    args = [server, "--bind", "127.0.0.1", "--requirepass", password, "--save", "", "--appendonly", "no",
            "--dir", str(folder)]
    ca_file = None
    if request.param == "password+tls":
        from fedfraud.training.fraud.federated.hist import make_tls_files

        tls = make_tls_files(folder / "tls")
        ca_file = str(tls.server_cert)  # self-signed: the server certificate is its own CA
        args += ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(tls.server_cert),
                 "--tls-key-file", str(tls.server_key), "--tls-ca-cert-file", ca_file, "--tls-auth-clients", "no"]
    else:
        args += ["--port", str(port)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, proc, "redis-server")
        yield SecuredRedis(port, password, ca_file)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _features(server: SecuredRedis, repo: Path):
    base = FedfraudConfig().features
    tls = {"ssl": True, "ssl_ca_certs": server.ca_file} if server.ca_file else {}
    redis_cfg = base.redis.model_validate({**base.redis.model_dump(),
                                           "connection_string": f"127.0.0.1:{server.port},db=0", **tls})
    return base.model_copy(update={"profile": "redis", "repo_dir": str(repo), "redis": redis_cfg})


def _kv_url(server: SecuredRedis) -> str:
    return f"{server.scheme}://127.0.0.1:{server.port}/1"


def test_the_right_password_works_end_to_end(secured: SecuredRedis, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from fedfraud.feature_store.feast_store import apply_repo, open_store
    from fedfraud.feature_store.online import OnlineStateClient
    from fedfraud.serving.kvstore import RedisKV, open_kv

    monkeypatch.setenv(PASSWORD_ENV, secured.password)
    features = _features(secured, tmp_path / "repo")
    store = open_store(features)
    apply_repo(store)
    rendered = (tmp_path / "repo" / "feature_store.yaml").read_text(encoding="utf-8")
    assert secured.password not in rendered and "password=${FEDFRAUD_REDIS_PASSWORD}" in rendered
    assert "redis_type: redis" in rendered and ("ssl=true" in rendered) == (secured.ca_file is not None)

    cfg = FedfraudConfig()
    client = OnlineStateClient(store, cfg.egograph, features.location_cell_deg)
    (state,) = client.read_states(["card-auth-1"])
    assert not state.found
    state.ego.update(key=1, merchant=7, lat=40.0, lon=-74.0, ts_us=1_767_225_600_000_000, amount=12.5, mcc="home")
    state.activity.update(1_767_225_600_000_000, 12.5, 40.0, -74.0, "grocery_pos", 0.1)
    state.q_t = np.arange(4, dtype=np.float32)
    client.push_states([state])
    (back,) = client.read_states(["card-auth-1"])
    assert back.found and back.ego == state.ego and back.activity == state.activity
    sdk = store.get_online_features(features=["cardholder_ego_state:state_version", "cardholder_activity:amount_sum"],
                                    entity_rows=[{"cardholder": "card-auth-1"}]).to_dict()
    assert sdk["state_version"] == [1] and sdk["amount_sum"] == [12.5]

    kv = open_kv(_kv_url(secured), ssl_ca_certs=secured.ca_file)
    assert isinstance(kv, RedisKV)
    kv.put_many("fraud", [("card-auth-1", b"state bytes")])
    assert kv.get_many("fraud", ["card-auth-1", "nobody"]) == [b"state bytes", None]
    kv.close()
    store.teardown()


@pytest.mark.parametrize("password", ["wrong-password", None])
def test_a_wrong_or_missing_password_fails_at_start_up_in_one_line(secured: SecuredRedis, password: str | None,
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from fedfraud.feature_store.feast_store import open_store
    from fedfraud.serving.kvstore import open_kv

    if password is None:
        monkeypatch.delenv(PASSWORD_ENV, raising=False)
    else:
        monkeypatch.setenv(PASSWORD_ENV, password)
    for start in (lambda: open_store(_features(secured, tmp_path / "repo")),
                  lambda: open_kv(_kv_url(secured), ssl_ca_certs=secured.ca_file)):
        with pytest.raises(UserError) as err:
            start()
        message = str(err.value)
        assert "\n" not in message and f"${PASSWORD_ENV}" in message and f"127.0.0.1:{secured.port}" in message
        assert (password or secured.password) not in message


def test_the_cli_says_it_in_one_line(secured: SecuredRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from fedfraud.cli.app import main

    monkeypatch.setenv(PASSWORD_ENV, "wrong-password")
    tls = ["--set", "features.redis.ssl=true", "--set", f"features.redis.ssl_ca_certs={secured.ca_file}"]
    code = main(["--set", f"features.redis.connection_string=127.0.0.1:{secured.port},db=0",
                 *(tls if secured.ca_file else []), "features", "materialize", "--store", "redis",
                 "--repo", str(tmp_path / "repo")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: Redis at 127.0.0.1:")
    assert PASSWORD_ENV in err and "wrong-password" not in err


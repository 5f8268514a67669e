"""Issue 37 finding 7: Redis connections fail closed.

Without a password, a Redis that is not on loopback is refused before any connection is tried (serving's state
store and the Feast online store alike), and a loopback one is used with one warning; TLS always verifies the
server's certificate and host name, and a URL cannot turn that off. The loopback cases use the machine's Redis
on 127.0.0.1:6379 (no password), as the rest of the suite does.
"""

from __future__ import annotations

import logging
import socket

import pytest

from fedfraud.core.errors import UserError

PASSWORD_ENV = "FEDFRAUD_TEST_REDIS_PASSWORD"


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """No password in the environment and no warning given yet in this process."""
    from fedfraud.feature_store import redis_check

    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    monkeypatch.setattr(redis_check, "_WARNED", set(), raising=False)


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to resolve or reach a server fails the test: a refusal must come before the connection."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a connection was attempted: {args}")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.mark.parametrize("url", ["redis://redis.bank.internal:6379/1", "rediss://10.0.3.7:6380/0",
                                 "redis://0.0.0.0:6379/0"])
def test_state_store_beyond_loopback_without_a_password_is_refused_in_one_line(url: str, no_network: None) -> None:
    from fedfraud.serving.kvstore import RedisKV

    with pytest.raises(UserError, match=rf"is not on loopback and \${PASSWORD_ENV} is unset or empty") as err:
        RedisKV(url, password_env=PASSWORD_ENV)
    assert "\n" not in str(err.value)


def test_state_store_on_loopback_without_a_password_works_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    from fedfraud.serving.kvstore import RedisKV

    with caplog.at_level(logging.WARNING, logger="fedfraud.feature_store.redis_check"):
        for _ in range(3):
            kv = RedisKV("redis://127.0.0.1:6379/15", password_env=PASSWORD_ENV)
            assert kv.get_many("scores", ["__absent__"]) == [None]
            kv.close()
    warnings = [r.getMessage() for r in caplog.records if "without a password" in r.getMessage()]
    assert len(warnings) == 1 and PASSWORD_ENV in warnings[0]


@pytest.mark.parametrize("query", ["ssl_check_hostname=false", "ssl_cert_reqs=none", "SSL_CA_CERTS=/tmp/x.pem",
                                   "password=hunter2"])
def test_a_url_cannot_turn_tls_checks_off_nor_carry_a_password(query: str, no_network: None) -> None:
    from fedfraud.serving.kvstore import RedisKV

    with pytest.raises(UserError, match="no ssl options in the Redis URL|no credentials in the Redis URL"):
        RedisKV(f"rediss://127.0.0.1:6380/0?{query}", password_env=PASSWORD_ENV)


def test_state_store_tls_verifies_the_certificate_and_the_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedfraud.core.net import free_port
    from fedfraud.serving.kvstore import RedisKV

    monkeypatch.setenv(PASSWORD_ENV, "s3cret")
    kv = RedisKV(f"rediss://127.0.0.1:{free_port()}/0", password_env=PASSWORD_ENV)  # nothing listens: only logged
    options = kv._client.connection_pool.connection_kwargs
    assert options["ssl_check_hostname"] is True and options["ssl_cert_reqs"] == "required"
    kv.close()


def test_feast_redis_beyond_loopback_without_a_password_is_refused(no_network: None) -> None:
    from fedfraud.feature_store.store_config import RedisProfile

    remote = RedisProfile(connection_string="redis-0.bank.internal:6379,redis-1.bank.internal:6379,db=0",
                          redis_type="redis_cluster", password_env=PASSWORD_ENV)
    with pytest.raises(UserError, match="is not on loopback") as err:
        remote.require_password()
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match="is not on loopback"):
        RedisProfile(connection_string="redis.bank.internal:6379,db=0", password_env=PASSWORD_ENV).client()


def test_feast_redis_on_loopback_warns_once_and_tls_checks_the_host_name(caplog: pytest.LogCaptureFixture) -> None:
    from fedfraud.feature_store.store_config import RedisProfile

    local = RedisProfile(connection_string="127.0.0.1:6379,db=15", password_env=PASSWORD_ENV)
    with caplog.at_level(logging.WARNING, logger="fedfraud.feature_store.redis_check"):
        assert local.require_password() is None and local.require_password() is None
        assert local.client().ping()
    assert sum("without a password" in r.getMessage() for r in caplog.records) == 1
    tls = RedisProfile(connection_string="127.0.0.1:6380,db=0", ssl=True, password_env=PASSWORD_ENV)
    assert "ssl_check_hostname=true" in tls.online_store()["connection_string"]
    assert tls.client().connection_pool.connection_kwargs["ssl_check_hostname"] is True

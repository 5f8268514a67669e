from __future__ import annotations

import pytest

from fedfraud.config import load_config
from fedfraud.core.errors import ConfigError, UserError
from fedfraud.feature_store.activity import Activity
from fedfraud.feature_store.store_config import FeatureStoreConfig, RedisProfile, SqliteProfile, resolve_profile


def test_profiles_resolve_by_name() -> None:
    assert resolve_profile("sqlite") is SqliteProfile and resolve_profile("Redis") is RedisProfile
    cfg = FeatureStoreConfig(redis=RedisProfile(connection_string="h:1,db=3"))
    assert cfg.online_profile("redis").online_store()["connection_string"] == "h:1,db=3"
    assert cfg.online_profile().online_store() == {"type": "sqlite", "path": "data/online_store.db"}


def test_unknown_profile_is_one_line() -> None:
    with pytest.raises(UserError, match=r"^unknown feature store profile 'mongo'; valid: redis, sqlite$"):
        resolve_profile("mongo")
    with pytest.raises(ConfigError) as err:
        load_config(None, ["features.profile=mongo"])
    assert "\n" not in str(err.value) and "valid: redis, sqlite" in str(err.value)


def test_extra_keys_forbidden() -> None:
    with pytest.raises(ConfigError):
        load_config(None, ["features.redis.host=x"])


def test_activity_late_event_keeps_last_fields() -> None:
    a = Activity()
    a.update(10_000_000, 5.0, 1.0, 1.0, "a", 0.1)
    a.update(20_000_000, 7.0, 2.0, 2.0, "b", 0.1)
    a.update(15_000_000, 100.0, 3.0, 3.0, "c", 0.1)
    assert (a.tx_count, a.last_amount, a.last_mcc, a.last_seen_us, a.amount_max) == (3, 7.0, "b", 20_000_000, 100.0)
    assert Activity.from_features(a.to_features()) == a


def test_redis_password_is_a_reference_to_the_environment_never_a_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 17: the rendered online store names $FEDFRAUD_REDIS_PASSWORD (Feast expands it when it loads the
    file); no password, no reference; TLS and the Redis type are rendered as Feast reads them."""
    monkeypatch.delenv("FEDFRAUD_REDIS_PASSWORD", raising=False)
    plain = RedisProfile(connection_string="h:1,db=3").online_store()
    assert plain["connection_string"] == "h:1,db=3" and plain["redis_type"] == "redis"
    monkeypatch.setenv("FEDFRAUD_REDIS_PASSWORD", "hunter2")
    secured = RedisProfile(connection_string="s1:26379,s2:26379", redis_type="redis_sentinel", sentinel_master="m1",
                           ssl=True, ssl_ca_certs="/certs/ca.pem").online_store()
    assert secured["connection_string"] == ("s1:26379,s2:26379,password=${FEDFRAUD_REDIS_PASSWORD},ssl=true,"
                                            "ssl_ca_certs=/certs/ca.pem,ssl_cert_reqs=required,ssl_check_hostname=true")
    assert secured["redis_type"] == "redis_sentinel" and secured["sentinel_master"] == "m1"
    assert "hunter2" not in str(secured)


def test_a_password_in_the_config_is_refused() -> None:
    with pytest.raises(ConfigError, match="no password= in connection_string"):
        load_config(None, ["features.redis.connection_string=127.0.0.1:6379,password=hunter2"])
    with pytest.raises(ConfigError, match="no ssl= or ssl_ca_certs= in connection_string"):
        load_config(None, ["features.redis.connection_string=127.0.0.1:6379,ssl=true"])
    with pytest.raises(ConfigError, match="no credentials in fraud_state_path"):
        load_config(None, ["serving.fraud_state_path=redis://:hunter2@127.0.0.1:6379/1"])
    with pytest.raises(ConfigError):
        load_config(None, ["features.redis.redis_type=memcached"])


def test_render_rewrites_only_what_changed(tmp_path) -> None:
    """Every replica renders the repo as it opens the store: an unchanged file keeps its inode and mtime."""
    from fedfraud.feature_store.feast_store import render_repo

    cfg = FeatureStoreConfig()
    render_repo(cfg, tmp_path)
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in tmp_path.iterdir() if p.is_file()}
    assert {"definitions.py", "feature_store.yaml"} <= set(before)
    render_repo(cfg, tmp_path)
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in tmp_path.iterdir() if p.is_file()} == before
    render_repo(cfg, tmp_path, "redis")  # another profile: only the yaml changes, and no temp file is left
    after = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in tmp_path.iterdir() if p.is_file()}
    assert after.keys() == before.keys()
    assert after["definitions.py"] == before["definitions.py"]
    assert after["feature_store.yaml"] != before["feature_store.yaml"]
    assert "redis" in (tmp_path / "feature_store.yaml").read_text(encoding="utf-8")

from __future__ import annotations

import pytest

from fedfraud.config import load_config
from fedfraud.errors import ConfigError, UserError
from feature_store.activity import Activity
from feature_store.store_config import FeatureStoreConfig, RedisProfile, SqliteProfile, resolve_profile


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

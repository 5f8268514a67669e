"""The online store's bounded key cache: a batch that overflows it still gets every key (review of issue 42's
SQLite writer: a KeyError once 131,072 entities had been seen)."""

from __future__ import annotations

from fedfraud.feature_store.online import _ViewIO


def test_a_batch_that_overflows_the_cache_gets_every_key_and_each_is_built_once_per_fill() -> None:
    io = _ViewIO(online=None, config=None)  # type: ignore[arg-type]  # the cache needs neither
    io._KEY_CACHE = 4
    built: list[str] = []

    def build(missing: list) -> list[bytes]:
        built.extend(missing)
        return [str(e).encode() for e in missing]

    assert io._cached_keys(["a", "b", "c"], build) == [b"a", b"b", b"c"]
    assert io._cached_keys(["a", "b"], build) == [b"a", b"b"] and built == ["a", "b", "c"]  # cached
    # 3 cached + 2 new > 4: the cache is cleared, and "a" (cached before the clear) is built again with the new ones
    assert io._cached_keys(["a", "d", "e", "d"], build) == [b"a", b"d", b"e", b"d"]
    assert built == ["a", "b", "c", "a", "d", "e"]
    assert io._cached_keys([(3, "m")], build) == [b"(3, 'm')"]  # merchant entities are (bank, key) tuples

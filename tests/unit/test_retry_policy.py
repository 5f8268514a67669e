"""The one retry policy (:mod:`fedfraud.core.retry`, on tenacity) keeps what the hand-rolled loops did.

The waits are the loops' own rule (first wait, then doubling, capped; a first wait above the cap kept), the
give-up rules raise what the loops raised, and the registry's publish still takes the next number when a
concurrent publisher took its own.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from fedfraud.core.retry import RetryError, doubling, retrying
from fedfraud.training.registry import ModelRegistry


def _hand_rolled_waits(first: float, most: float, n: int) -> list[float]:
    """The waits of the loops this policy replaced: ``sleep(delay); delay = min(delay * 2, most)``."""
    out, delay = [], first
    for _ in range(n):
        out.append(delay)
        delay = min(delay * 2, most)
    return out


@pytest.mark.parametrize(("first", "most"), [(0.2, 2.0), (0.2, 5.0), (0.0, 2.0), (0.1, 0.1), (3.0, 2.0)])
def test_the_waits_are_the_hand_rolled_loops_waits(first: float, most: float) -> None:
    waits: list[float] = []
    fails = iter(range(8))

    def call() -> str:
        if next(fails, None) is not None:
            raise ConnectionError("down")
        return "up"

    policy = retrying(lambda exc: isinstance(exc, ConnectionError), first_s=first, most_s=most,
                      before_sleep=lambda state: waits.append(state.next_action.sleep))
    policy.sleep = lambda _s: None  # the wait lengths are what is checked, not the clock
    assert policy(call) == "up"
    assert waits == pytest.approx(_hand_rolled_waits(first, most, 8))
    assert doubling(first, most).first_s == first


def test_giving_up_raises_the_last_failure_and_a_refused_one_is_raised_at_once() -> None:
    tries: list[int] = []

    def always(exc: BaseException) -> Any:
        tries.append(1)
        raise exc

    with pytest.raises(OSError, match="taken 3"):
        retrying(lambda e: isinstance(e, OSError), attempts=3)(lambda: always(OSError(f"taken {len(tries) + 1}")))
    assert len(tries) == 3
    with pytest.raises(RetryError):
        retrying(lambda e: isinstance(e, OSError), attempts=2, reraise=False)(lambda: always(OSError("x")))
    tries.clear()
    with pytest.raises(ValueError):
        retrying(lambda e: isinstance(e, OSError), attempts=5)(lambda: always(ValueError("not retried")))
    assert len(tries) == 1
    started = time.monotonic()
    with pytest.raises(RetryError):
        retrying(lambda e: True, within_s=0.2, first_s=0.05, most_s=0.05, reraise=False)(
            lambda: always(TimeoutError()))
    assert 0.2 <= time.monotonic() - started < 2.0


def test_a_publish_that_loses_its_number_to_a_concurrent_publisher_takes_the_next(tmp_path: Path) -> None:
    class Stale(ModelRegistry):
        """Reads ``latest`` just before another process publishes: its first rename finds the number taken."""

        raced = False

        def latest(self, kind: str) -> Any:
            seen = super().latest(kind)
            if not self.raced:
                self.raced = True
                with ModelRegistry(self.root).publish(kind, config={"by": "other"}) as folder:
                    (folder / "model.json").write_text("{}", encoding="utf-8")
            return seen

    with Stale(tmp_path).publish("fraud", config={"by": "us"}) as folder:
        (folder / "model.json").write_text("{}", encoding="utf-8")
    reg = ModelRegistry(tmp_path)
    assert [(v.version, v.config["by"]) for v in reg.versions("fraud")] == [(1, "other"), (2, "us")]


def test_a_publish_that_cannot_write_its_metadata_fails_at_once_and_publishes_nothing(tmp_path: Path) -> None:
    """Only a taken version number is retried: a full disk is raised on the first try (it was retried 100 times)."""
    import errno

    class Full(ModelRegistry):
        tries = 0

        def latest(self, kind: str) -> Any:
            Full.tries += 1
            return super().latest(kind)

    reg = Full(tmp_path)
    with pytest.raises(OSError) as caught:
        with reg.publish("fraud", config={}) as folder:
            (folder / "model.json").write_text("{}", encoding="utf-8")
            (folder / "metadata.json").mkdir()  # the metadata write then fails (IsADirectoryError), as a full disk
    assert caught.value.errno not in (errno.EEXIST, errno.ENOTEMPTY)
    assert Full.tries == 1 and reg.versions("fraud") == []

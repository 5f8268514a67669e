"""Poison handling (:mod:`fedfraud.serving.poison`): bounded retries, bisection, blame, and outages.

The bisection tests call :func:`isolate_failures` on row numbers; the :class:`RetryingScorer` tests score real
decoded micro-batches with a scoring function that fails the way the stages do (one record raising, a store
refusing connections), and read the consumer's own retry counter.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from fedfraud.feature_store.schema import Validator
from fedfraud.serving.config import GuardSettings
from fedfraud.serving.kafka import DecodedBatch, decode_messages
from fedfraud.serving.metrics import PipelineMetrics
from fedfraud.serving.poison import Outage, RetryingScorer, is_outage, isolate_failures
from tests.kafka_messages import Msg

NOW = 1_800_000_000.0  # 2027-01-15, the validator's clock in these tests


# ---------------------------------------------------------------- bisecting a failing batch
def _scorer(poison: set[int], calls: list[list[int]], done: list[int]):
    def run(rows: list[int]) -> None:
        calls.append(rows)
        if poison.intersection(rows):
            raise OverflowError("cannot convert float infinity to integer")
        done.extend(rows)

    return run


@pytest.mark.parametrize("poison", [{0}, {37}, {99}, {3, 64}])
def test_bisection_pins_each_poison_record_and_scores_every_other_row_once_in_order(poison: set[int]) -> None:
    calls: list[list[int]] = []
    done: list[int] = []
    errors = isolate_failures(range(100), _scorer(poison, calls, done))
    assert set(errors) == poison and all("OverflowError" in e for e in errors.values())
    assert done == [i for i in range(100) if i not in poison]  # each clean row once, in order
    assert len(calls) <= 1 + len(poison) * 2 * 7  # about 2·log2(n) calls per poison record


def test_bisection_blames_no_record_in_an_outage() -> None:
    def store_down(rows: list[int]) -> None:
        raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    with pytest.raises(Outage):
        isolate_failures(range(10), store_down)

    def everything_fails(rows: list[int]) -> None:
        raise ValueError("same error for every record")

    with pytest.raises(Outage, match="every record"):
        isolate_failures(range(10), everything_fails)


def test_outage_is_recognised_through_a_wrapping_exception() -> None:
    class RayTaskError(RuntimeError):  # the shape Ray gives a remote exception: a wrapper with a cause
        pass

    class RedisConnectionError(Exception):
        pass

    try:
        try:
            raise RedisConnectionError("refused")
        except RedisConnectionError as inner:
            raise RayTaskError("replica failed") from inner
    except RayTaskError as exc:
        assert is_outage(exc)
    assert not is_outage(ValueError("amount is inf"))
    assert is_outage(TimeoutError())


def test_rows_that_all_fail_alone_are_blamed_once_the_caller_has_waited() -> None:
    def two_poison(rows: list[int]) -> None:
        raise ValueError("both rows are poison")

    assert set(isolate_failures(range(2), two_poison, blame_all=True)) == {0, 1}


# ---------------------------------------------------------------- scoring a micro-batch through failures
def _batch(n: int) -> DecodedBatch:
    rows = [{"transaction_id": f"t{i:03d}", "cardholder_id": f"c{i}", "merchant_id": "m1",
             "timestamp": f"2026-11-01T12:00:{i % 60:02d}Z", "amount": 12.5, "lat": 40.7, "lon": -74.0,
             "mcc": "grocery_pos"} for i in range(n)]
    validator = Validator(dedupe=False, max_future_s=86_400, clock=lambda: NOW)
    batch = decode_messages([Msg(json.dumps(r).encode(), i) for i, r in enumerate(rows)], validator)
    assert len(batch.frame) == n and not batch.dead
    return batch


class _Stages:
    """A scoring function that fails as the stages do: ``poison`` ids raise a ValueError whenever they are in the
    call; the first ``down`` calls meet a store that refuses connections; the first ``flaky`` calls fail once."""

    def __init__(self, poison: set[str] = frozenset(), down: int = 0, flaky: int = 0) -> None:
        self.poison, self.down, self.flaky = set(poison), down, flaky
        self.calls: list[list[str]] = []

    def __call__(self, frame: Any, produced_us: Any, content: list[str], *, sends: list[Any]) -> list[dict[str, Any]]:
        ids = frame["transaction_id"].astype(str).tolist()
        self.calls.append(ids)
        assert len(produced_us) == len(ids) and len(content) == len(ids)
        if len(self.calls) <= self.down:
            raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        if len(self.calls) <= self.flaky:
            raise RuntimeError("a transient failure")
        if self.poison.intersection(ids):
            raise ValueError("cannot convert float infinity to integer")
        sends.extend(ids)
        return [{"transaction_id": t, "decision": "approve"} for t in ids]


def _retrying_scorer(stages: _Stages, attempts: int = 3, budget_s: float = 30.0, stopping: threading.Event | None = None
            ) -> tuple[RetryingScorer, PipelineMetrics, list[float]]:
    metrics, progress = PipelineMetrics(), []
    guards = GuardSettings(stage_max_attempts=attempts, retry_backoff_s=0.0, retry_budget_s=budget_s)
    return (RetryingScorer(stages, guards, metrics, stopping or threading.Event(), lambda: progress.append(1.0)),
            metrics, progress)


def _retries(metrics: PipelineMetrics) -> float:
    return metrics.registry.get_sample_value("fedfraud_stage_retries_total", {"stage": "score"}) or 0.0


def test_a_clean_batch_is_scored_in_one_call_with_no_retry() -> None:
    stages = _Stages()
    scorer, metrics, _ = _retrying_scorer(stages)
    sends: list[Any] = []
    records = scorer.score(_batch(8), sends)
    assert [r["decision"] for r in records] == ["approve"] * 8 and len(sends) == 8
    assert len(stages.calls) == 1 and _retries(metrics) == 0 and scorer.retrying_since is None


def test_a_transient_failure_is_retried_and_counted_without_bisecting() -> None:
    stages = _Stages(flaky=2)
    scorer, metrics, _ = _retrying_scorer(stages, attempts=3)
    records = scorer.score(_batch(5), [])
    assert [r["decision"] for r in records] == ["approve"] * 5
    assert [len(c) for c in stages.calls] == [5, 5, 5]  # two failed tries, the third scores the whole batch
    assert _retries(metrics) == 2 and scorer.retrying_since is None


def test_bounded_retries_then_bisection_blames_only_the_poison_record() -> None:
    stages = _Stages(poison={"t005"})
    scorer, metrics, progress = _retrying_scorer(stages, attempts=3)
    sends: list[Any] = []
    records = scorer.score(_batch(12), sends)
    assert [len(c) for c in stages.calls[:3]] == [12, 12, 12]  # the bounded retries of the whole batch
    assert _retries(metrics) == 3  # each failed try counted, the last one too
    rejected = [r for r in records if r["decision"] == "rejected"]
    assert [r["transaction_id"] for r in rejected] == ["t005"]
    assert rejected[0]["reject_reason"] == "processing_error" and "ValueError" in rejected[0]["detail"]
    assert [r["transaction_id"] for r in records] == [f"t{i:03d}" for i in range(12)]  # frame order
    assert sends == [f"t{i:03d}" for i in range(12) if i != 5]  # every clean row decided once
    assert progress and scorer.retrying_since is None


def test_an_outage_is_waited_out_and_no_record_is_blamed() -> None:
    stages = _Stages(down=6)
    scorer, metrics, _ = _retrying_scorer(stages, attempts=2)
    records = scorer.score(_batch(6), [])
    assert [r["decision"] for r in records] == ["approve"] * 6  # nothing dead-lettered for the outage
    assert _retries(metrics) == 2 and len(stages.calls) == 7


def test_rows_that_all_fail_with_no_sign_of_infrastructure_are_blamed_after_the_budget() -> None:
    stages = _Stages(poison={"t000", "t001", "t002"})
    scorer, _, _ = _retrying_scorer(stages, attempts=1, budget_s=0.05)
    started = time.monotonic()
    records = scorer.score(_batch(3), [])
    assert time.monotonic() - started >= 0.05  # not before the budget ran out
    assert [r["decision"] for r in records] == ["rejected"] * 3


def test_stopping_ends_the_outage_wait_with_the_outage() -> None:
    stopping = threading.Event()
    stopping.set()
    scorer, _, _ = _retrying_scorer(_Stages(down=1000), attempts=2, stopping=stopping)
    with pytest.raises(ConnectionError):  # the retries stop at once: the failure itself is raised
        scorer.score(_batch(2), [])
    stopping.clear()
    stages = _Stages(down=1000)
    scorer, _, _ = _retrying_scorer(stages, attempts=1, stopping=stopping)
    threading.Timer(0.2, stopping.set).start()
    with pytest.raises(Outage):
        scorer.score(_batch(2), [])
    assert len(stages.calls) > 2  # it did wait the outage out until the stop

"""The stream's small-batch fast path of ``Validator.validate_records`` judges exactly like the frame path.

Property: for any batch of JSON-like records, the fast path either declines
(returns None, and the frame path judges the batch) or returns the very frame
the frame path accepts, with no rejects. Records are drawn near the edges of
every rule so that both sides of each are exercised.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fedfraud.feature_store import schema
from fedfraud.feature_store.schema import Validator

NOW = 1_800_000_000.0  # fixed wall clock: 2027-01-15

texts = st.one_of(
    st.text(min_size=0, max_size=8),
    st.text(alphabet="abc0123456789", min_size=1, max_size=12),
    st.integers(min_value=-(10**21), max_value=10**21),
    st.just("x" * schema.MAX_TEXT_LEN), st.just("x" * (schema.MAX_TEXT_LEN + 1)), st.just("  "), st.just("\ud800"),
    st.none(), st.booleans(), st.floats(allow_nan=True), st.just({"a": 1}),
)
stamps = st.one_of(
    st.datetimes(min_value=pd.Timestamp("1960-01-01").to_pydatetime(),
                 max_value=pd.Timestamp("2030-01-01").to_pydatetime()).map(lambda d: d.isoformat()),
    st.datetimes(min_value=pd.Timestamp("2020-01-01").to_pydatetime(),
                 max_value=pd.Timestamp("2028-01-01").to_pydatetime()).map(lambda d: d.isoformat() + "Z"),
    st.sampled_from(["2026-11-23T10:00:00+05:30", "2026-11-23 10:00:00", "2026-11-23", "2026-13-01T00:00:00",
                     "2026-11-23T24:00:00", "yesterday", "", "1700000000"]),
    st.integers(min_value=-10, max_value=5_000_000_000), st.none(), st.booleans(),
)
numbers = st.one_of(
    st.floats(min_value=-200, max_value=200), st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**17), max_value=10**17), st.sampled_from([0, 1e9, 1e9 + 1, 0.005, 2.675, -0.0]),
    st.none(), st.booleans(), st.just("12.5"),
)
labels = st.one_of(st.none(), st.booleans(), st.sampled_from([0, 1, 2, "yes", "maybe", 1.0]))


clean_texts = st.one_of(st.text(alphabet="abcXYZ0123456789-_", min_size=1, max_size=12), st.integers(0, 10**6))
clean_stamps = st.datetimes(min_value=pd.Timestamp("2017-01-01").to_pydatetime(),
                            max_value=pd.Timestamp("2027-01-20").to_pydatetime()).flatmap(
    lambda d: st.sampled_from([d.isoformat(), d.isoformat() + "Z", d.isoformat() + "+02:00", str(d)]))


def clean_records() -> st.SearchStrategy[dict[str, Any]]:
    """Records of the common types and mostly valid values (the window edges are inside the ranges drawn)."""
    return st.fixed_dictionaries({
        "transaction_id": clean_texts, "cardholder_id": clean_texts, "merchant_id": clean_texts, "mcc": clean_texts,
        "timestamp": clean_stamps, "amount": st.one_of(st.floats(0, 5000), st.integers(0, 5000)),
        "lat": st.floats(-90, 90), "lon": st.one_of(st.floats(-180, 180), st.integers(-180, 180)),
    }, optional={"is_fraud": st.sampled_from([None, True, False, 0, 1]),
                 "geo_source": st.sampled_from([None, "exact", "centroid"])})


def wild_records() -> st.SearchStrategy[dict[str, Any]]:
    fields = {"transaction_id": texts, "cardholder_id": texts, "merchant_id": texts, "mcc": texts,
              "timestamp": stamps, "amount": numbers, "lat": numbers, "lon": numbers, "is_fraud": labels,
              "geo_source": st.one_of(st.none(), st.sampled_from(["exact", "centroid"]), st.integers(0, 3))}
    return st.fixed_dictionaries({}, optional=fields)


def one_field_off() -> st.SearchStrategy[dict[str, Any]]:
    """A clean record with one field replaced by a wild value (or removed)."""
    return st.tuples(clean_records(), wild_records()).map(lambda cw: {**cw[0], **dict(list(cw[1].items())[:1])})


batches = st.one_of(
    st.lists(clean_records(), min_size=1, max_size=6),
    st.lists(st.one_of(clean_records(), one_field_off(), wild_records()), min_size=1, max_size=6),
)


def _frame_path(batch: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> schema.ValidationResult:
    with monkeypatch.context() as m:
        m.setattr(schema, "FAST_PATH_MAX_ROWS", 0)
        return _validator().validate_records(batch)


def _validator() -> Validator:
    return Validator(dedupe=False, max_future_s=86400, max_age_days=3650, clock=lambda: NOW)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=batches)
def test_fast_path_accepts_exactly_what_the_frame_path_accepts(batch: list[dict[str, Any]],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    slow = _frame_path(batch, monkeypatch)
    fast = schema._clean_records(batch, _validator()._window())
    note = "declined" if fast is None else "fast"
    event(note)
    if fast is None:  # declined: the frame path judges the batch (validate_records does exactly that)
        return
    assert slow.rejects.empty, slow.rejects.to_dict("records")
    pd.testing.assert_frame_equal(fast.frame(), slow.accepted)
    for column in (*schema.REQUIRED_COLUMNS, "geo_source"):  # what the stream hashes and sorts on, before a frame
        assert [str(v) for v in fast.values(column)] == [str(v) for v in slow.accepted[column].tolist()], column


def _clean(i: int) -> dict[str, Any]:
    return {"transaction_id": f"t{i}", "cardholder_id": "c1", "merchant_id": 17, "timestamp": "2026-11-20T08:15:00.25Z",
            "amount": 2.675 + i, "lat": 40.5, "lon": -73, "mcc": "5411", "is_fraud": None, "geo_source": None}


def test_a_clean_batch_takes_the_fast_path_and_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = [_clean(i) for i in range(5)]
    fast = _validator().clean_rows(batch)
    assert fast is not None and len(fast) == 5
    result = _validator().validate_records(batch)
    pd.testing.assert_frame_equal(result.accepted, _frame_path(batch, monkeypatch).accepted)
    assert result.accepted["merchant_id"].tolist() == ["17"] * 5 and result.rejects.empty


def test_one_dirty_record_sends_the_batch_to_the_frame_path_with_its_reason() -> None:
    batch = [_clean(0), {**_clean(1), "amount": True}, {**_clean(2), "timestamp": "2030-01-01T00:00:00"}]
    assert schema._clean_records(batch, _validator()._window()) is None
    result = _validator().validate_records(batch)
    assert result.accepted["transaction_id"].tolist() == ["t0"]
    assert result.rejects[["row", "reason"]].values.tolist() == [[1, "bad_type"], [2, "bad_timestamp"]]


def test_a_timestamp_that_overflows_in_utc_is_judged_by_the_frame_path_not_raised() -> None:
    """Year 1 at +01:00 is year 0 in UTC: datetime raises OverflowError; the fast path declines, the frame path
    rejects the record (it used to raise out of ``validate_records``)."""
    batch = [_clean(0), {**_clean(1), "timestamp": "0001-01-01T00:00:00+01:00"}]
    assert _validator().clean_rows(batch) is None
    result = Validator(dedupe=False).validate_records(batch)
    assert result.accepted["transaction_id"].tolist() == ["t0"]
    assert result.rejects["reason"].tolist() == ["bad_timestamp"]


def test_the_fast_path_builds_the_rows_asked_for_in_that_order(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = [_clean(i) for i in range(4)]
    fast = _validator().clean_rows(batch)
    assert fast is not None
    whole = _frame_path(batch, monkeypatch).accepted
    pd.testing.assert_frame_equal(fast.frame([3, 1]), whole.iloc[[3, 1]].reset_index(drop=True))
    empty = Validator(dedupe=False).validate_records([]).accepted
    pd.testing.assert_frame_equal(fast.frame([]), empty)

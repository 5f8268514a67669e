"""Issue 14's malformed-record probes, at the decode stage: every input is scorable, a copy or dead-lettered.

Each probe below crashed or fooled the consumer before (a crash loop, an endless
retry, or a silently wrong value); here it must come back as a dead letter with
a reason, and decoding must never raise. The Hypothesis test states the
property over arbitrary records and bytes.
"""

from __future__ import annotations

import base64
import json
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedfraud.feature_store.schema import RejectReason, Validator
from fedfraud.serving.kafka.dead_letters import dlq_message
from fedfraud.serving.kafka import DecodedBatch, decode_messages, dlq_value
from tests.unit.test_serving_codec import Msg  # a ConsumerRecord-shaped message

NOW = 1_800_000_000.0  # 2027-01-15, the validator's clock in these tests


def _record(i: int = 0, **overrides: object) -> dict[str, object]:
    row: dict[str, object] = {"transaction_id": f"t{i}", "cardholder_id": "c1", "merchant_id": "m1",
                              "timestamp": "2026-11-01T12:00:00Z", "amount": 12.5, "lat": 40.7, "lon": -74.0,
                              "mcc": "grocery_pos"}
    row.update(overrides)
    return row


def _validator() -> Validator:
    return Validator(dedupe=False, max_future_s=86_400, clock=lambda: NOW)


def _decode(values: list[bytes]) -> DecodedBatch:
    out = decode_messages([Msg(v, i) for i, v in enumerate(values)], _validator(), max_message_bytes=1 << 20)
    assert len(out.frame) + len(out.copies) + len(out.dead) == len(values)
    return out


def _reason_of(value: bytes) -> str:
    out = _decode([value])
    assert len(out.dead) == 1, f"accepted: {out.frame.to_dict('records')}"
    return out.dead[0].reason


PROBES = {
    "401-digit amount": (b'{"transaction_id":"t","cardholder_id":"c","merchant_id":"m",'
                         b'"timestamp":"2026-11-01T00:00:00Z","amount":' + b"9" * 401
                         + b',"lat":1,"lon":2,"mcc":"x"}', RejectReason.BAD_AMOUNT),
    "100,000-deep nesting": (b"[" * 100_000 + b"]" * 100_000, RejectReason.MALFORMED),
    "amount 1e308 (inf after rounding)": (json.dumps(_record(amount=1e308)).encode(), RejectReason.BAD_AMOUNT),
    "amount NaN token": (json.dumps(_record(amount=float("nan"))).encode(), RejectReason.MALFORMED),
    "amount Infinity token": (json.dumps(_record(amount=float("inf"))).encode(), RejectReason.MALFORMED),
    "amount true": (json.dumps(_record(amount=True)).encode(), RejectReason.BAD_TYPE),
    "cardholder_id an object": (json.dumps(_record(cardholder_id={"a": 1})).encode(), RejectReason.BAD_TYPE),
    "transaction_id an array": (json.dumps(_record(transaction_id=[1])).encode(), RejectReason.BAD_TYPE),
    "timestamp in 1900": (json.dumps(_record(timestamp="1900-01-01T00:00:00Z")).encode(),
                          RejectReason.BAD_TIMESTAMP),
    "timestamp a week ahead": (json.dumps(_record(timestamp="2027-01-22T00:00:00Z")).encode(),
                               RejectReason.BAD_TIMESTAMP),
    "id over the length limit": (json.dumps(_record(transaction_id="x" * 300)).encode(), RejectReason.TEXT_TOO_LONG),
    "lat a 30-digit integer": (json.dumps(_record(lat=10**30)).encode(), RejectReason.LAT_OUT_OF_RANGE),
}


@pytest.mark.parametrize("name", list(PROBES))
def test_probe_is_dead_lettered_with_its_reason(name: str) -> None:
    value, reason = PROBES[name]
    assert _reason_of(value) == reason.value


def test_nan_amount_in_a_record_is_a_bad_amount_not_a_missing_field() -> None:
    result = _validator().validate_records([_record(amount=float("nan"))])
    assert result.rejects["reason"].tolist() == [RejectReason.BAD_AMOUNT.value]


def test_oversized_message_is_not_parsed_and_its_dlq_record_is_capped() -> None:
    big = b'{"x":"' + b"a" * (10 << 20) + b'"}'
    out = decode_messages([Msg(big, 0)], _validator(), max_message_bytes=1 << 20)
    assert [d.reason for d in out.dead] == [RejectReason.OVERSIZED.value]
    record = json.loads(dlq_value(out.dead[0], max_payload_bytes=64 << 10))
    assert record["raw_bytes"] == len(big) and record["record"] is None and "raw_b64" not in record
    # with raw capture (an operator's opt-in) the kept bytes are capped
    value = dlq_value(out.dead[0], max_payload_bytes=64 << 10, raw_capture=True)
    record = json.loads(value)
    assert record["raw_truncated"] is True and len(base64.b64decode(record["raw_b64"])) == 64 << 10
    assert len(value) < 100_000  # far below max_request_size (1 MB)


def test_copies_in_one_batch_collapse_and_a_conflicting_reuse_is_dead_lettered() -> None:
    same = json.dumps(_record(7)).encode()
    other = json.dumps(_record(7, amount=99.0)).encode()
    out = _decode([same, same, json.dumps(_record(8)).encode(), same, other])
    assert out.frame["transaction_id"].tolist() == ["t7", "t8"]
    assert [(m.offset, row) for m, row in out.copies] == [(1, 0), (3, 0)]
    assert [(d.offset, d.reason) for d in out.dead] == [(4, RejectReason.CONFLICTING_DUPLICATE.value)]
    assert [m.offset for m in out.sources] == [0, 2] and len(out.content) == 2


def test_content_hash_ignores_json_key_order_and_sees_any_changed_field() -> None:
    a = _record(1)
    b = dict(reversed(list(a.items())))
    c = _record(1, merchant_id="m2")
    out = _decode([json.dumps(a).encode(), json.dumps(b).encode()])
    assert len(out.frame) == 1 and len(out.copies) == 1
    out = _decode([json.dumps(a).encode(), json.dumps(c).encode()])
    assert len(out.frame) == 1 and out.dead[0].reason == RejectReason.CONFLICTING_DUPLICATE.value


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)
fields = ("transaction_id", "cardholder_id", "merchant_id", "timestamp", "amount", "lat", "lon", "mcc", "is_fraud",
          "geo_source")
records = st.fixed_dictionaries({}, optional={f: json_values for f in fields})
# mostly-valid records with one field replaced: the interesting part of the space
mutated = st.builds(lambda f, v: {**_record(), f: v}, st.sampled_from(fields), json_values)
messages = st.one_of(
    records.map(lambda r: json.dumps(r).encode()),
    mutated.map(lambda r: json.dumps(r).encode()),
    st.binary(max_size=64),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages, min_size=1, max_size=12))
def test_fuzz_every_message_is_scorable_a_copy_or_dead_lettered_with_a_reason(values: list[bytes]) -> None:
    out = _decode(values)  # never raises; the count invariant is asserted inside
    reasons = {r.value for r in RejectReason}
    assert all(d.reason in reasons and d.detail for d in out.dead)
    frame = out.frame
    assert frame["amount"].map(lambda a: 0 <= a <= 1e9).all()
    assert frame["lat"].between(-90, 90).all() and frame["lon"].between(-180, 180).all()
    for col in ("transaction_id", "cardholder_id", "merchant_id", "mcc"):
        assert frame[col].map(lambda v: isinstance(v, str) and len(v) <= 256).all()
    for dead in out.dead:
        json.loads(dlq_value(dead))  # every DLQ record is valid JSON


def test_review_probes_bad_stamps_huge_keys_and_separator_lookalikes() -> None:
    """Found in review: an int64-overflowing produce stamp raised out of decoding; a 1 MB key made a DLQ record
    over max_request_size; ids joined with a separator could make two transactions look like copies."""
    huge_stamp = Msg(json.dumps(_record(1)).encode(), 0, headers=(("produced-us", b"9" * 20),), timestamp=2**62)
    out = decode_messages([huge_stamp], _validator())
    assert len(out.frame) == 1 and 0 < out.produced_us[0] < 2**62
    big_key = Msg(b"not json", 1, key=b"k" * 1_000_000)
    key, value, _ = dlq_message(decode_messages([big_key], _validator()).dead[0])
    assert len(key) < 100 and key.startswith(b"sha256:") and len(value) < 1000  # not a card token: a digest
    a = json.dumps(_record(0, cardholder_id="a\x1fb", transaction_id="c")).encode()
    b = json.dumps(_record(0, cardholder_id="a", transaction_id="b\x1fc")).encode()
    out = _decode([a, b])
    assert len(out.frame) == 2 and not out.copies and not out.dead


def test_records_of_partitions_revoked_during_the_batch_window_are_dropped() -> None:
    """Review finding: a rebalance between the polls of one batch could make two replicas score a partition."""
    from fedfraud.serving.consumer import _Revocations, _without

    revocations = _Revocations()
    revocations.on_partitions_revoked([("transactions", 1)])
    revocations.on_partitions_assigned([("transactions", 0)])
    msgs = [Msg(b"{}", i, partition=i % 2) for i in range(6)]
    assert [m.offset for m in _without(msgs, revocations.revoked)] == [0, 2, 4]
    assert _without(msgs, set()) == msgs

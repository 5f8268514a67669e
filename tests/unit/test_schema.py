"""Every RejectReason the validator can produce, and the accepted + rejected == input invariant."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fedfraud.feature_store.schema import (
    ARROW_SCHEMA,
    CANONICAL_COLUMNS,
    MAX_TEXT_LEN,
    RejectReason,
    Validator,
    frame_to_transactions,
    transactions_to_frame,
)


def _row(i: int = 0, **overrides: object) -> dict[str, object]:
    row: dict[str, object] = {
        "transaction_id": f"t{i}",
        "cardholder_id": "c1",
        "merchant_id": "m1",
        "timestamp": "2024-03-01 12:00:00",
        "amount": "12.50",
        "lat": "40.7",
        "lon": "-74.0",
        "mcc": "grocery_pos",
        "is_fraud": "0",
    }
    row.update(overrides)
    return row


def _judge(rows: list[dict[str, object]], validator: Validator | None = None, offset: int = 0):
    frame = pd.DataFrame(rows, dtype=object)
    result = (validator or Validator()).validate(frame, row_offset=offset)
    assert len(result.accepted) + len(result.rejects) == len(frame)
    return result


def _reasons(result) -> list[tuple[int, str]]:
    return list(zip(result.rejects["row"].tolist(), result.rejects["reason"].tolist(), strict=True))


def test_clean_row_accepted_with_canonical_dtypes() -> None:
    result = _judge([_row(0), _row(1, is_fraud="yes")])
    assert result.rejects.empty
    acc = result.accepted
    assert list(acc.columns) == list(CANONICAL_COLUMNS)
    assert str(acc["timestamp"].dtype) == "datetime64[us, UTC]"
    assert acc["amount"].tolist() == [12.5, 12.5]
    assert acc["is_fraud"].tolist() == [False, True]
    assert acc["geo_source"].tolist() == ["exact", "exact"]


@pytest.mark.parametrize("column", ["transaction_id", "cardholder_id", "merchant_id", "timestamp", "amount", "lat",
                                    "lon", "mcc"])
@pytest.mark.parametrize("blank", ["", "   ", None])
def test_missing_field(column: str, blank: object) -> None:
    result = _judge([_row(0, **{column: blank}), _row(1)])
    assert _reasons(result) == [(0, RejectReason.MISSING_FIELD.value)]
    assert result.rejects["detail"].tolist() == [column]


def test_missing_column_rejects_every_row() -> None:
    frame = pd.DataFrame([_row(0), _row(1)], dtype=object).drop(columns=["mcc"])
    result = Validator().validate(frame)
    assert result.accepted.empty
    assert set(result.rejects["reason"]) == {RejectReason.MISSING_FIELD.value}


@pytest.mark.parametrize("value", ["not a time", "2024-13-45 99:99:99", "-5", "99999999999"])
def test_bad_timestamp(value: str) -> None:
    result = _judge([_row(0, timestamp=value)])
    assert _reasons(result) == [(0, RejectReason.BAD_TIMESTAMP.value)]


def test_timestamps_from_epoch_and_iso_agree() -> None:
    result = _judge([_row(0, timestamp="1709294400"), _row(1, timestamp="2024-03-01T12:00:00Z"),
                     _row(2, timestamp=1709294400)])
    assert result.accepted["timestamp"].nunique() == 1


@pytest.mark.parametrize(
    ("value", "detail"),
    [("-0.01", "amount is negative"), ("NaN", "amount is not a number"), ("abc", "amount is not a number"),
     ("inf", "amount is not finite"), ("-inf", "amount is not finite")],
)
def test_bad_amount(value: str, detail: str) -> None:
    result = _judge([_row(0, amount=value)])
    assert _reasons(result) == [(0, RejectReason.BAD_AMOUNT.value)]
    assert result.rejects["detail"].tolist() == [detail]


def test_numeric_nan_amount_is_a_missing_field() -> None:
    frame = pd.DataFrame([_row(0), _row(1)])
    frame["amount"] = [math.nan, math.inf]
    result = Validator().validate(frame)
    assert result.rejects["reason"].tolist() == [RejectReason.MISSING_FIELD.value, RejectReason.BAD_AMOUNT.value]


def test_zero_amount_is_accepted() -> None:
    assert _judge([_row(0, amount="0")]).rejects.empty


@pytest.mark.parametrize("lat", ["90.0001", "-91", "abc"])
def test_lat_out_of_range(lat: str) -> None:
    assert _reasons(_judge([_row(0, lat=lat)])) == [(0, RejectReason.LAT_OUT_OF_RANGE.value)]


@pytest.mark.parametrize("lon", ["180.5", "-181"])
def test_lon_out_of_range(lon: str) -> None:
    assert _reasons(_judge([_row(0, lon=lon)])) == [(0, RejectReason.LON_OUT_OF_RANGE.value)]


def test_range_edges_accepted() -> None:
    result = _judge([_row(0, lat="90", lon="180"), _row(1, lat="-90", lon="-180")])
    assert result.rejects.empty


def test_duplicate_id_within_a_chunk() -> None:
    result = _judge([_row(0), _row(1), _row(0, amount="3")])
    assert _reasons(result) == [(2, RejectReason.DUPLICATE_ID.value)]
    assert result.accepted["amount"].tolist() == [12.5, 12.5]  # the first occurrence wins


def test_duplicate_id_across_chunks_uses_row_offset() -> None:
    validator = Validator()
    first = _judge([_row(0), _row(1)], validator, offset=0)
    second = _judge([_row(2), _row(1)], validator, offset=2)
    assert first.rejects.empty
    assert _reasons(second) == [(3, RejectReason.DUPLICATE_ID.value)]


def test_rejected_first_occurrence_does_not_block_a_valid_one() -> None:
    validator = Validator()
    result = _judge([_row(0, amount="-1"), _row(0)], validator)
    assert _reasons(result) == [(0, RejectReason.BAD_AMOUNT.value)]
    assert result.accepted["transaction_id"].tolist() == ["t0"]
    later = _judge([_row(0)], validator, offset=2)  # now it has been accepted once
    assert _reasons(later) == [(2, RejectReason.DUPLICATE_ID.value)]


def test_dedupe_off_accepts_duplicates() -> None:
    result = _judge([_row(0), _row(0)], Validator(dedupe=False))
    assert len(result.accepted) == 2


@pytest.mark.parametrize("column", ["transaction_id", "cardholder_id", "merchant_id", "mcc"])
def test_text_too_long(column: str) -> None:
    ok = _row(0, **{column: "x" * MAX_TEXT_LEN})
    bad = _row(1, **{column: "x" * (MAX_TEXT_LEN + 1)})
    if column == "transaction_id":
        ok["transaction_id"], bad["transaction_id"] = "a" * MAX_TEXT_LEN, "b" * (MAX_TEXT_LEN + 1)
    assert _reasons(_judge([ok, bad])) == [(1, RejectReason.TEXT_TOO_LONG.value)]


@pytest.mark.parametrize("column", ["transaction_id", "cardholder_id", "merchant_id", "mcc"])
def test_invalid_utf8_via_surrogateescape(column: str) -> None:
    # What pandas yields for the bytes b"caf\xe9" read with encoding_errors="surrogateescape".
    bad_text = b"caf\xe9".decode("utf-8", errors="surrogateescape")
    result = _judge([_row(0, **{column: bad_text}), _row(1, **{column: "café"})])
    assert _reasons(result) == [(0, RejectReason.INVALID_UTF8.value)]
    assert result.rejects["detail"].tolist() == [column]


def test_invalid_utf8_raw_bytes() -> None:
    assert _reasons(_judge([_row(0, merchant_id=b"\xff\xfe")])) == [(0, RejectReason.INVALID_UTF8.value)]


@pytest.mark.parametrize("label", ["maybe", "2", "-1", "fraud"])
def test_bad_label(label: str) -> None:
    assert _reasons(_judge([_row(0, is_fraud=label)])) == [(0, RejectReason.BAD_LABEL.value)]


def test_labels_parse_and_blank_label_is_unknown() -> None:
    labels = ["1", "0", "true", "False", "Yes", "no", "", None]
    result = _judge([_row(i, is_fraud=v) for i, v in enumerate(labels)])
    assert result.rejects.empty
    assert result.accepted["is_fraud"].tolist() == [True, False, True, False, True, False, pd.NA, pd.NA]


def test_first_failing_check_names_the_reason() -> None:
    # Missing fields are checked before everything else; one reason per row.
    result = _judge([_row(0, merchant_id="", amount="-1", lat="999")])
    assert _reasons(result) == [(0, RejectReason.MISSING_FIELD.value)]


def test_invariant_on_a_mixed_batch() -> None:
    bad_text = b"\xff".decode("utf-8", errors="surrogateescape")
    rows = [
        _row(0), _row(1, amount="-3"), _row(2, timestamp="nope"), _row(3, lat="100"), _row(4, lon="200"),
        _row(0), _row(6, mcc="m" * 300), _row(7, cardholder_id=bad_text), _row(8, is_fraud="x"),
        _row(9, merchant_id=""), _row(10),
    ]  # fmt: skip
    result = _judge(rows, offset=100)
    assert len(result.accepted) == 2
    assert result.rejects["row"].tolist() == list(range(101, 110))
    record_level = {RejectReason.MALFORMED, RejectReason.BAD_TYPE, RejectReason.OVERSIZED,
                    RejectReason.CONFLICTING_DUPLICATE, RejectReason.PROCESSING_ERROR,  # not judged on a frame
                    RejectReason.CARD_NUMBER, RejectReason.UNTOKENIZED_CARD}  # the stream's rules (card_tokens)
    assert sorted(result.rejects["reason"]) == sorted(r.value for r in RejectReason if r not in record_level)


def test_records_and_transactions_round_trip() -> None:
    result = Validator().validate_records([_row(0), _row(1, amount="-1")])
    assert len(result.accepted) == 1
    txs = frame_to_transactions(result.accepted)
    again = transactions_to_frame(txs)
    pd.testing.assert_frame_equal(again, result.accepted, check_dtype=False)
    assert [f.name for f in ARROW_SCHEMA] == list(CANONICAL_COLUMNS)

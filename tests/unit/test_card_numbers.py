"""No card number in clear (issue 17, item 5): tokens on the wire, card numbers rejected and masked, coordinates
coarsened on every path."""

from __future__ import annotations

import base64
import json

import numpy as np
import pandas as pd
import pytest

from fedfraud.feature_store.config import EncoderConfig, PrivacyConfig
from fedfraud.feature_store.privacy import PrivateFeaturizer, pseudonymize
from fedfraud.feature_store.schema import (
    COORDINATE_DECIMALS,
    RejectReason,
    Validator,
    card_number_spans,
    is_card_token,
    mask_card_numbers,
    mask_card_numbers_bytes,
)
from fedfraud.serving.config import GuardSettings
from fedfraud.serving.kafka.dead_letters import dlq_message
from fedfraud.serving.kafka import decode_messages, dlq_value, ingress_validator
from tests.unit.test_serving_codec import Msg  # a ConsumerRecord-shaped message

CARD = "4539578763621486"  # Luhn-valid
NOT_A_CARD = "4539578763621487"  # one digit off: fails Luhn
SECRET = b"k" * 32
TOKEN = pseudonymize([CARD], SECRET)[0]


def _record(**overrides: object) -> dict[str, object]:
    row: dict[str, object] = {"transaction_id": "t1", "cardholder_id": TOKEN, "merchant_id": "m1",
                              "timestamp": "2026-11-01T12:00:00Z", "amount": 12.5, "lat": 40.712345,
                              "lon": -74.006789, "mcc": "grocery_pos"}
    row.update(overrides)
    return row


def _decode(*records: dict[str, object], key: bytes | None = None):
    guards = GuardSettings(max_future_s=None, max_age_days=None)
    msgs = [Msg(json.dumps(r).encode(), i) for i, r in enumerate(records)]
    if key is not None:
        for m in msgs:
            m.key = key
    return decode_messages(msgs, ingress_validator(guards))


def test_card_number_detection_and_masking() -> None:
    assert card_number_spans(f"card {CARD} paid") == [(5, 21)]
    assert card_number_spans("4539 5787 6362 1486") and card_number_spans("4539-5787-6362-1486")
    assert not card_number_spans(NOT_A_CARD) and not card_number_spans("40.71234567890123")  # a float's digits
    assert not card_number_spans("1" + CARD + "1")  # part of a longer number
    # a stretch of a hex id or of a card token is not a card number (else 0.4% of random ids would be)
    glued = f"ct_{CARD}abcdefabcdefabcd"
    assert is_card_token(glued) and not card_number_spans(glued) and not card_number_spans(f"{CARD}ab12")
    assert mask_card_numbers(f"x {CARD}.") == "x ************1486."
    assert mask_card_numbers("4539 5787 6362 1486") == "**** **** **** 1486"
    assert mask_card_numbers_bytes(f'{{"cardholder_id": {CARD}}}'.encode()) == b'{"cardholder_id": ************1486}'


def test_tokens_are_idempotent_and_key_the_same_budget() -> None:
    assert is_card_token(TOKEN) and not is_card_token(CARD) and not is_card_token(TOKEN.upper())
    assert pseudonymize([TOKEN, CARD], SECRET) == [TOKEN, TOKEN]  # the stream's token is the offline token
    featurizer = PrivateFeaturizer(EncoderConfig(), PrivacyConfig(), SECRET)
    assert featurizer.epsilon([CARD]) == pytest.approx(featurizer.epsilon([TOKEN]))
    raw = pd.DataFrame([_record(cardholder_id=CARD)])
    tokenized = pd.DataFrame([_record()])
    a, b = featurizer.transform(raw), featurizer.transform(tokenized)
    assert list(a.cardholder) == list(b.cardholder) == [TOKEN]
    assert np.array_equal(a.location, b.location) and np.array_equal(a.time, b.time)


@pytest.mark.parametrize("column", ["cardholder_id", "merchant_id", "transaction_id", "mcc"])
def test_the_stream_dead_letters_a_card_number_masked(column: str) -> None:
    for value in (CARD, f"shop {CARD}", "4539 5787 6362 1486"):
        out = _decode(_record(**{column: value}), key=CARD.encode())
        assert len(out.dead) == 1 and out.frame.empty
        dead = out.dead[0]
        assert dead.reason == RejectReason.CARD_NUMBER.value and column in dead.detail
        key, value, _ = dlq_message(dead, raw_capture=True)  # raw capture on: still no payload for this reason
        record = json.loads(value)
        wire = json.dumps(record) + (key or b"").decode()
        assert "raw_b64" not in record and record["record"][column].endswith("1486")
        assert "4539578763621486" not in wire.replace(" ", "").replace("-", "") and "1486" in wire


def test_the_stream_accepts_only_tokens() -> None:
    out = _decode(_record(cardholder_id="customer-17"), _record(transaction_id="t2"))
    assert [d.reason for d in out.dead] == [RejectReason.UNTOKENIZED_CARD.value]
    assert out.frame["cardholder_id"].tolist() == [TOKEN]
    # a number that is not a card (fails Luhn) is not a card number, but is not a token either
    assert _decode(_record(cardholder_id=NOT_A_CARD)).dead[0].reason == RejectReason.UNTOKENIZED_CARD.value


def test_every_dead_letter_masks_card_numbers_in_its_payload() -> None:
    """Whatever the reason (here a bad amount), the DLQ keeps the canonical fields, masked, and the captured
    bytes (an operator's opt-in) masked too, but not the card number."""
    out = _decode(_record(amount=-1, merchant_id=f"shop {CARD}", note=f"card {CARD}"))
    assert out.dead[0].reason == RejectReason.CARD_NUMBER.value
    out = _decode(_record(amount=-1, note=f"card {CARD}"))
    assert out.dead[0].reason == RejectReason.BAD_AMOUNT.value
    record = json.loads(dlq_value(out.dead[0], raw_capture=True))
    assert "note" not in record["record"] and record["record"]["amount"] == -1
    raw = base64.b64decode(record["raw_b64"])
    assert CARD.encode() not in raw and b"************1486" in raw


@pytest.mark.parametrize("n", [1, 300])  # the per-record fast path and the frame path
def test_coordinates_are_coarsened_on_every_path(n: int) -> None:
    records = [_record(transaction_id=f"t{i}") for i in range(n)]
    stream = Validator(dedupe=False, card_tokens=True).validate_records(records).accepted
    ingest = Validator(dedupe=True).validate(pd.DataFrame(records)).accepted
    for frame in (stream, ingest):
        assert frame["lat"].tolist() == [round(40.712345, COORDINATE_DECIMALS)] * n
        assert frame["lon"].tolist() == [round(-74.006789, COORDINATE_DECIMALS)] * n

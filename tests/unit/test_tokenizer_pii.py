from pathlib import Path

import pytest

from fedfraud.core.errors import UserError
from fedfraud.training.tokenizer.corpus import read_jsonl
from fedfraud.training.tokenizer.pii import (
    PIIDetector, PIISpan, evaluate_detector, iban_ok, luhn_ok, resolve_recognizer, wipe,
)

FIXTURE = Path(__file__).parents[1] / "fixtures" / "tokenizer" / "pii_labelled.jsonl"


def test_recall_and_precision_on_shipped_labelled_corpus():
    docs = list(read_jsonl(FIXTURE))
    scores = evaluate_detector(PIIDetector(), [(d.text, d.pii) for d in docs])
    assert scores.n_gold > 500
    assert scores.recall >= 0.95
    assert scores.precision >= 0.95
    assert scores.char_recall >= 0.95
    for label in ("EMAIL", "CARD", "SSN", "IBAN", "PHONE"):
        assert scores.per_label[label]["recall"] >= 0.95, label


def test_checksums():
    assert luhn_ok("4111111111111111")
    assert not luhn_ok("4111111111111112")
    assert iban_ok("GB82 WEST 1234 5698 7654 32")
    assert not iban_ok("GB82 WEST 1234 5698 7654 33")


def test_wipe_removes_union_of_overlapping_spans():
    text = "call 555-123-4567 now"
    assert wipe(text, [PIISpan(5, 12, "PHONE"), PIISpan(8, 17, "PHONE")]) == "call  now"
    assert PIIDetector()("Mr. John Smith, SSN 123-45-6789.") == "Mr. , SSN ."


def test_amounts_and_dates_are_not_pii():
    text = "I was charged $1,250.00 on 03/14/2023 and waited 45 days; rate 27.45%."
    assert PIIDetector().detect(text) == []


def test_unknown_recognizer_lists_valid_names():
    with pytest.raises(UserError, match="valid: person, email"):
        resolve_recognizer("passport")


def test_ner_extra_named_when_missing():
    try:
        import presidio_analyzer  # noqa: F401
    except ImportError:
        with pytest.raises(UserError, match="pii-ner"):
            resolve_recognizer("ner")
    else:
        assert resolve_recognizer("ner").find("My name is John Smith.")

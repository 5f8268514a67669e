"""The bank's outcome store (exactly once per transaction id) and label message validation."""

from __future__ import annotations

import pytest

from fedfraud.feature_store.outcomes import OutcomeStore
from fedfraud.serving.labels import label_message, parse_label


def _label(tx: str, fraud: bool) -> dict:
    row, reason, _ = parse_label(label_message(tx, fraud, "2026-11-20T00:00:00+00:00", "chargeback"))
    assert reason == ""
    return row


def test_a_label_applied_twice_is_stored_once_and_counted(tmp_path):
    with OutcomeStore(tmp_path / "o.sqlite") as store:
        first = store.apply(labels=[_label("t1", True), _label("t2", False)], positions={("fraud-labels", 0): 2})
        again = store.apply(labels=[_label("t1", True), _label("t3", False)], positions={("fraud-labels", 0): 4})
        assert (first.labels, again.labels, again.duplicate_labels) == (2, 1, 1)
        assert store.count("labels") == 3
        assert store.counters()["duplicate_labels"] == 1
        assert store.positions() == {("fraud-labels", 0): 4}
        store.apply(positions={("fraud-labels", 0): 3})  # positions never move back
        assert store.positions() == {("fraud-labels", 0): 4}
        labels = store.labels().set_index("transaction_id")["is_fraud"].to_dict()
        assert labels == {"t1": True, "t2": False, "t3": False}


def test_labelled_pairs_match_champion_and_challenger_tags(tmp_path):
    shadow = {"cardholder": "c", "anomaly_model": "anomaly:v2", "anomaly_score": 0.1, "scored_us": 1}
    with OutcomeStore(tmp_path / "o.sqlite") as store:
        store.apply(shadow=[
            {**shadow, "transaction_id": "t1", "fraud_model": "fraud:v2", "score": 0.9,
             "champion_fraud_model": "fraud:v1", "champion_score": 0.2},
            {**shadow, "transaction_id": "t2", "fraud_model": "fraud:v3", "score": 0.9,
             "champion_fraud_model": "fraud:v1", "champion_score": 0.2},
        ], labels=[_label("t1", True), _label("t2", True)])
        pairs = store.labelled_pairs("fraud:v1", "fraud:v2")
        assert pairs["transaction_id"].tolist() == ["t1"]
        assert pairs.iloc[0][["champion_score", "challenger_score"]].tolist() == [0.2, 0.9]


@pytest.mark.parametrize(("raw", "reason"), [
    (b"{not json", "not_json"),
    (b"[1, 2]", "not_an_object"),
    (b'{"label": "fraud"}', "bad_transaction_id"),
    (b'{"transaction_id": "", "label": "fraud"}', "bad_transaction_id"),
    (b'{"transaction_id": "t", "label": "maybe"}', "bad_label"),
    (b'{"transaction_id": "t", "label": true}', "bad_label"),
    (b'{"transaction_id": "t", "label": "genuine", "labelled_at": 5}', "bad_labelled_at"),
    (b"\xff\xfe", "not_json"),
])
def test_bad_label_messages_get_a_reason(raw, reason):
    row, got, detail = parse_label(raw)
    assert row is None and got == reason and detail


def test_a_good_label_parses():
    row, reason, _ = parse_label(b'{"transaction_id": "t9", "label": "genuine", "source": "analyst"}')
    assert reason == "" and row["is_fraud"] == 0 and row["source"] == "analyst" and row["labelled_at"] is None


def test_a_chargeback_overrides_an_earlier_genuine_verdict_but_not_the_reverse(tmp_path):
    with OutcomeStore(tmp_path / "o.sqlite") as store:
        store.apply(labels=[_label("t1", False), _label("t2", True)])
        later = store.apply(labels=[_label("t1", True), _label("t2", False)])
        assert (later.labels, later.duplicate_labels) == (1, 1)
        assert store.labels().set_index("transaction_id")["is_fraud"].to_dict() == {"t1": True, "t2": True}


def test_unlabelled_shadow_pairs_count_as_genuine_only_once_mature(tmp_path):
    base = {"cardholder": "c", "fraud_model": "fraud:v2", "anomaly_model": "anomaly:v2", "score": 0.5,
            "anomaly_score": None, "champion_fraud_model": "fraud:v1", "champion_score": 0.4}
    with OutcomeStore(tmp_path / "o.sqlite") as store:
        store.apply(shadow=[{**base, "transaction_id": "old", "scored_us": 100},
                            {**base, "transaction_id": "young", "scored_us": 900},
                            {**base, "transaction_id": "other-gnn", "anomaly_model": "anomaly:v3", "scored_us": 100}])
        assert store.labelled_pairs("fraud:v1", "fraud:v2").empty  # no label, no maturity rule: nothing
        mature = store.labelled_pairs("fraud:v1", "fraud:v2", "anomaly:v2", mature_before_us=500)
        assert mature["transaction_id"].tolist() == ["old"] and not mature["is_fraud"].any()

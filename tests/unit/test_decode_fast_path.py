"""``decode_messages`` on a clean micro-batch (hashes, order and copies from the cleaned values, one frame)
returns exactly what the frame path returns: the same frame in event order, content hashes, produce stamps,
copies, sources and dead letters.

Batches are drawn from small pools of ids, cardholders, timestamps and amounts, so exact copies, conflicting
duplicates (same id, other content), out-of-order timestamps and timestamp ties (broken by transaction_id)
are common; unparseable messages ride along, since they leave the rest of the batch on the fast path.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fedfraud.feature_store import schema
from fedfraud.feature_store.schema import Validator
from fedfraud.serving.kafka import codec
from fedfraud.serving.kafka import PRODUCED_HEADER, DecodedBatch, content_hashes, decode_messages
from tests.kafka_messages import Msg

NOW = 1_800_000_000.0




records = st.fixed_dictionaries({
    "transaction_id": st.sampled_from(["t1", "t2", "t10", "a"]),
    "cardholder_id": st.sampled_from(["c1", "c2"]),
    "merchant_id": st.sampled_from(["m1", 7]),
    "timestamp": st.sampled_from(["2026-11-20T08:15:00Z", "2026-11-20T08:15:00.250000+00:00",
                                  "2026-11-20T09:15:00+01:00", "2026-11-19 23:59:59", "2026-11-20T08:14:59.5Z"]),
    "amount": st.sampled_from([10.0, 2.675, 10, 0.004]),
    "lat": st.sampled_from([40.5, 40.504]), "lon": st.sampled_from([-73, -73.001]), "mcc": st.just("5411"),
}, optional={"is_fraud": st.sampled_from([None, True, 0]), "geo_source": st.sampled_from([None, "centroid"])})

messages = st.lists(
    st.tuples(
        st.one_of(records.map(lambda r: json.dumps(r).encode()), st.sampled_from([b"\xff{", b"[1]"])),
        st.one_of(st.none(), st.integers(0, 2_000_000_000_000_000).map(lambda us: str(us).encode()),
                  st.just(b"soon")),
    ),
    min_size=1, max_size=12,
).flatmap(lambda ms: st.lists(st.sampled_from(ms), min_size=len(ms), max_size=len(ms) + 4))  # exact repeats


def _validator() -> Validator:
    return Validator(dedupe=False, max_future_s=86400, max_age_days=3650, clock=lambda: NOW)


def _msgs(drawn: list[tuple[bytes, bytes | None]]) -> list[Msg]:
    return [Msg(value, i, headers=() if stamp is None else ((PRODUCED_HEADER, stamp),))
            for i, (value, stamp) in enumerate(drawn)]


def _comparable(out: DecodedBatch) -> dict[str, Any]:
    return {
        "produced_us": out.produced_us.tolist(), "n_input": out.n_input, "content": out.content,
        "copies": [(m.offset, row) for m, row in out.copies], "sources": [m.offset for m in out.sources],
        "dead": [(d.offset, d.reason, d.detail, d.raw, d.key) for d in out.dead],
    }


def _both(msgs: list[Msg], monkeypatch: pytest.MonkeyPatch) -> tuple[DecodedBatch, DecodedBatch, bool]:
    took_fast = _validator().clean_rows([r for r in map(_json_object, msgs) if r is not None]) is not None
    fast = decode_messages(msgs, _validator())
    with monkeypatch.context() as m:
        m.setattr(schema, "FAST_PATH_MAX_ROWS", 0)
        slow = decode_messages(msgs, _validator())
    return fast, slow, took_fast


def _json_object(msg: Msg) -> dict[str, Any] | None:
    try:
        value = json.loads(msg.value)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=messages)
def test_clean_batches_decode_as_on_the_frame_path(drawn: list[tuple[bytes, bytes | None]],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    msgs = _msgs(drawn)
    fast, slow, took_fast = _both(msgs, monkeypatch)
    event("fast" if took_fast else "no record")
    event("copies" if fast.copies else "no copies")
    event("conflicts" if any(d.reason == "conflicting_duplicate" for d in fast.dead) else "no conflicts")
    pd.testing.assert_frame_equal(fast.frame, slow.frame)
    assert _comparable(fast) == _comparable(slow)
    assert fast.content == content_hashes(fast.frame)  # the one hash rule, whichever path computed it
    assert codec.event_order(fast.frame) is None  # already in event order


def test_out_of_order_ties_copies_and_conflicts(monkeypatch: pytest.MonkeyPatch) -> None:
    base = {"cardholder_id": "c1", "merchant_id": "m", "amount": 1.0, "lat": 1.0, "lon": 2.0, "mcc": "5411"}
    rows = [
        {**base, "transaction_id": "t3", "timestamp": "2026-11-20T08:00:02Z"},
        {**base, "transaction_id": "t2", "timestamp": "2026-11-20T08:00:01Z"},  # tie with t1, after it by id
        {**base, "transaction_id": "t1", "timestamp": "2026-11-20T08:00:01Z"},
        {**base, "transaction_id": "t3", "timestamp": "2026-11-20T08:00:02Z"},  # copy of the first
        {**base, "transaction_id": "t2", "timestamp": "2026-11-20T08:00:01Z", "amount": 5.0},  # conflict
    ]
    msgs = [Msg(json.dumps(r).encode(), i, headers=((PRODUCED_HEADER, str(100 + i).encode()),))
            for i, r in enumerate(rows)]
    fast, slow, took_fast = _both(msgs, monkeypatch)
    assert took_fast
    assert fast.frame["transaction_id"].tolist() == ["t1", "t2", "t3"]
    assert fast.produced_us.tolist() == [102, 101, 100]
    assert [(m.offset, row) for m, row in fast.copies] == [(3, 2)]
    assert [(d.offset, d.reason) for d in fast.dead] == [(4, "conflicting_duplicate")]
    pd.testing.assert_frame_equal(fast.frame, slow.frame)
    assert _comparable(fast) == _comparable(slow)


def test_a_batch_of_only_dead_letters_has_the_canonical_empty_frame() -> None:
    out = decode_messages([Msg(b"nope", 0), Msg(b"[]", 1)], _validator())
    assert out.n_input == 2 and len(out.dead) == 2 and out.produced_us.dtype == np.int64
    pd.testing.assert_frame_equal(out.frame, Validator(dedupe=False).validate_records([]).accepted)


def test_a_failure_building_the_clean_frame_does_not_escape(monkeypatch: pytest.MonkeyPatch) -> None:
    """The contract holds even if the fast path breaks (say, a pandas upgrade): no raise, every message counted."""
    def broken(self: schema.CleanRows, rows: Any = None) -> pd.DataFrame:
        raise RuntimeError("broken")

    monkeypatch.setattr(schema.CleanRows, "frame", broken)
    base = {"cardholder_id": "c1", "merchant_id": "m", "amount": 1.0, "lat": 1.0, "lon": 2.0, "mcc": "5411",
            "timestamp": "2026-11-20T08:00:02Z"}
    msgs = [Msg(json.dumps({**base, "transaction_id": t}).encode(), i) for i, t in enumerate(["t1", "t1", "t2"])]
    out = decode_messages([*msgs, Msg(b"{", 3)], _validator())
    assert out.n_input == 4 and len(out.frame) + len(out.copies) + len(out.dead) == 4
    assert [d.offset for d in out.dead] == [3, 0, 1, 2]  # each record judged alone (and failing) once, no copies
    assert {d.reason for d in out.dead} == {"malformed"}

"""Issue 37, finding 2: no card number reaches a DLQ, whatever its disguise and whichever DLQ path it takes.

Every hostile message goes through the code that sends DLQ records (the consumer's decode rejects, its stage
rejects, the label joiner) into a recording producer; the test then looks for the card number's first 12
digits in everything that was sent (key, value, headers), also after base64-decoding every field, reading the
JSON strings unescaped and stripping every non-digit.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from fedfraud.feature_store.outcomes import OutcomeStore
from fedfraud.feature_store.schema import luhn_ok
from fedfraud.serving.config import GuardSettings, ServingConfig
from fedfraud.serving.consumer import StreamConsumer
from fedfraud.serving.kafka import decode_messages
from fedfraud.serving.labels import JoinStats, LabelJoiner
from tests.kafka_messages import Msg

CARDS = ("4111111111111111", "4539578763621486")  # Luhn-valid test card numbers
TOKEN = "ct_" + "ab" * 16  # a card token (the stream's cardholder_id)


def _groups(card: str) -> list[str]:
    return [card[i:i + 4] for i in range(0, len(card), 4)]


def _tx(**overrides: Any) -> dict[str, Any]:
    """A valid wire transaction (token, past timestamp), exact coordinates as a careless producer sends them."""
    row: dict[str, Any] = {"transaction_id": "tx-a", "cardholder_id": TOKEN, "merchant_id": "m-a",
                           "timestamp": "2026-11-01T12:00:00Z", "amount": 12.5, "lat": 40.712345,
                           "lon": -74.006789, "mcc": "grocery_pos"}
    row.update(overrides)
    return row


def _escaped(card: str) -> str:
    """``card`` as JSON text with its 11th digit written as a ``\\u00XX`` escape."""
    return card[:10] + f"\\u{ord(card[10]):04x}" + card[11:]


def _json(row: dict[str, Any], **raw_fields: str) -> bytes:
    """``row`` as JSON with ``raw_fields`` spliced in as raw JSON text (escapes, exponent floats)."""
    text = json.dumps(row)[:-1]
    return (text + "".join(f', "{k}": {v}' for k, v in raw_fields.items()) + "}").encode()


def respell(value: bytes, words: dict[str, str]) -> bytes:
    """``value`` with each of ``words`` replaced, in the body's own encoding (UTF-8, or UTF-16 with its BOM)."""
    encoding = "utf-16" if value.startswith((b"\xff\xfe", b"\xfe\xff")) else "utf-8"
    text = value.decode(encoding)
    for old, new in words.items():
        text = text.replace(old, new)
    return text.encode(encoding)


def decode_disguises(card: str) -> dict[str, tuple[bytes | None, bytes]]:
    """(key, value) of messages the decode stage rejects, each hiding ``card`` in another way."""
    g = _groups(card)
    bad = {"amount": -1}  # rejected whatever else they hold
    exponent = f"{card[0]}.{card[1:]}e15"
    return {
        "plain": (None, json.dumps(_tx(merchant_id=card, **bad)).encode()),
        "spaced": (None, json.dumps(_tx(merchant_id=" ".join(g), **bad)).encode()),
        "dashed": (None, json.dumps(_tx(merchant_id="-".join(g), **bad)).encode()),
        "underscored": (None, json.dumps(_tx(merchant_id="_".join(g), **bad)).encode()),
        "dotted": (None, json.dumps(_tx(merchant_id=".".join(g), **bad)).encode()),
        "PAN prefix": (None, json.dumps(_tx(merchant_id="PAN" + card, **bad)).encode()),
        "PAN: spaced": (None, json.dumps(_tx(mcc="PAN: " + " ".join(g), **bad)).encode()),
        "JSON escape": (None, _json(_tx(**bad), merchant_id=f'"{_escaped(card)}"')),
        "exponent float": (None, _json({k: v for k, v in _tx().items() if k != "amount"}, amount=exponent)),
        "extra fields": (None, json.dumps(_tx(pan=card, name="Ann Lee", dob="1990-01-01", street="1 Main St",
                                              **bad)).encode()),
        "key": (card.encode(), json.dumps(_tx(**bad)).encode()),
        "cardholder_id": (None, json.dumps(_tx(cardholder_id=card)).encode()),
        "untokenized": (None, json.dumps(_tx(cardholder_id="cust" + card)).encode()),
        "UTF-16 body": (None, json.dumps(_tx(pan=card, merchant_id="PAN" + card, **bad)).encode("utf-16")),
        "UTF-16 body, no BOM": (None, json.dumps(_tx(pan=card, **bad)).encode("utf-16-le")),
        "unparseable body": (None, f"PAN {card} ".encode() + b"\xff{"),
        "unparseable UTF-16": (None, f"card {' '.join(g)} ".encode("utf-16-le") + b"\x00\xd8"),
        "bare number": (None, card.encode()),
    }


def stage_disguises(card: str) -> dict[str, tuple[bytes | None, bytes]]:
    """(key, value) of messages that pass validation (the scoring stages reject them later), hiding ``card``."""
    g = _groups(card)
    exponent = f"{card[0]}.{card[1:]}e15"
    return {
        "PAN prefix": (None, json.dumps(_tx(merchant_id="PAN" + card)).encode()),
        "underscored": (None, json.dumps(_tx(merchant_id="_".join(g))).encode()),
        "dotted": (None, json.dumps(_tx(mcc=".".join(g))).encode()),
        "extra fields": (None, json.dumps(_tx(pan=card, name="Ann Lee", dob="1990-01-01",
                                              street="1 Main St")).encode()),
        "extra PAN: spaced": (None, json.dumps(_tx(note="PAN: " + " ".join(g))).encode()),
        "extra JSON escape": (None, _json(_tx(), pan=f'"{_escaped(card)}"')),
        "extra exponent float": (None, _json(_tx(), pan=exponent)),
        "key": (card.encode(), json.dumps(_tx()).encode()),
        "UTF-16 body": (None, json.dumps(_tx(pan=card)).encode("utf-16")),
    }


def label_disguises(card: str) -> dict[str, tuple[bytes | None, bytes]]:
    """(key, value) of ``fraud-labels`` messages the joiner dead-letters, hiding ``card``."""
    g = _groups(card)
    label = {"transaction_id": "tx-a", "label": "maybe", "labelled_at": "2026-11-20T00:00:00Z"}
    return {
        "transaction_id": (None, json.dumps({**label, "transaction_id": "-".join(g) + "x" * 300}).encode()),
        "label echoed in the detail": (None, json.dumps({**label, "label": "PAN" + card}).encode()),
        "source": (None, json.dumps({**label, "source": "_".join(g)}).encode()),
        "extra fields": (None, json.dumps({**label, "pan": card, "name": "Ann Lee"}).encode()),
        "JSON escape": (None, _json(label, source=f'"{_escaped(card)}"')),
        "key": (card.encode(), json.dumps(label).encode()),
        "UTF-16 body": (None, json.dumps({**label, "pan": card}).encode("utf-16")),
        "unparseable body": (None, f"PAN {card} ".encode() + b"\xff{"),
        "not an object": (None, f'["{card}"]'.encode()),
    }


# ---------------------------------------------------------------------------------------------------- the check
def _strings(value: Any) -> list[str]:
    """Every scalar of a parsed JSON value as text (strings come back unescaped)."""
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (str(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [str(value)]


def _b64(text: str) -> bytes | None:
    try:
        return base64.b64decode(text, validate=True) if len(text) >= 8 else None
    except (binascii.Error, ValueError):
        return None


def _readings(blob: bytes) -> list[str]:
    """Ways a reader can read ``blob`` (raw, UTF-16 either way; stripping non-digits covers NUL padding)."""
    return [blob.decode("latin-1"), blob.decode("utf-16-le", "ignore"), blob.decode("utf-16-be", "ignore")]


def recoverable(card: str, sent: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]]) -> list[str]:
    """The readings of the sent DLQ messages in which ``card``'s first 12 digits appear (none, hopefully)."""
    prefix = card[:12]
    texts: list[str] = []
    for key, value, headers in sent:
        for blob in (key or b"", value, *(v for _, v in headers)):
            texts += _readings(blob)
        strings = _strings(json.loads(value))
        texts += strings
        texts.append(value.decode("unicode_escape", "ignore"))  # JSON escapes read as characters
        for s in strings:
            decoded = _b64(s)
            if decoded is not None:
                texts += _readings(decoded)
    return [t[:120] for t in texts if prefix in t or prefix in re.sub(r"[^0-9]", "", t)]


# ---------------------------------------------------------------------------------------------------- the paths
@dataclass
class _Sent:
    is_done: bool = True
    exception: BaseException | None = None


@dataclass
class RecordingProducer:
    """A producer that keeps what it is given: (topic, key, value, headers)."""

    sent: list[tuple[str, bytes | None, bytes, list[tuple[str, bytes]]]] = field(default_factory=list)

    def send(self, topic: str, key: bytes | None = None, value: bytes = b"", headers: Any = None) -> _Sent:
        self.sent.append((topic, key, value, list(headers or [])))
        return _Sent()

    def flush(self, timeout: float | None = None) -> None:
        return None

    def messages(self, topic: str) -> list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]]:
        return [(k, v, h) for t, k, v, h in self.sent if t == topic]


def _msgs(disguises: dict[str, tuple[bytes | None, bytes]], topic: str = "transactions") -> list[Msg]:
    out = []
    for i, (key, value) in enumerate(disguises.values()):
        out.append(Msg(value, offset=10 * (i + 1), key=key, topic=topic))
    return out


def _consumer(raw_capture: bool) -> StreamConsumer:
    guards = {"max_future_s": None, "max_age_days": None}
    if raw_capture:
        guards["dlq_raw_capture"] = True
    serving = ServingConfig(guards=GuardSettings(**guards))
    return StreamConsumer(serving, "127.0.0.1:1", score=lambda *a, **k: [])


def decode_path(card: str, raw_capture: bool = False) -> tuple[int, RecordingProducer]:
    """The consumer's decode rejects (what ``StreamConsumer._process`` sends for ``decoded.dead``)."""
    consumer, producer = _consumer(raw_capture), RecordingProducer()
    msgs = _msgs(decode_disguises(card))
    decoded = decode_messages(msgs, consumer.validator, consumer.guards.max_message_bytes)
    assert len(decoded.dead) == len(msgs), [m for m in msgs if m.offset not in {d.offset for d in decoded.dead}]
    for dead in decoded.dead:
        consumer._dead_letter(producer, dead)
    return len(msgs), producer


def stage_path(card: str, raw_capture: bool = False) -> tuple[int, RecordingProducer]:
    """The consumer's stage rejects: rows that passed decoding, rejected by the scoring stages."""
    consumer, producer = _consumer(raw_capture), RecordingProducer()
    msgs = _msgs(stage_disguises(card))
    for i, m in enumerate(msgs):  # distinct ids: none is a copy of another
        m.value = respell(m.value, {'"tx-a"': f'"tx-{chr(97 + i)}"'})
    decoded = decode_messages(msgs, consumer.validator, consumer.guards.max_message_bytes)
    assert not decoded.dead and len(decoded.frame) == len(msgs)
    records = [{"transaction_id": tx, "decision": "rejected", "reject_reason": reason,
                "detail": f"ValueError: merchant {merchant!r} card {card}"}
               for tx, merchant, reason in zip(decoded.frame["transaction_id"], decoded.frame["merchant_id"],
                                               ["processing_error", "conflicting_duplicate"] * len(msgs), strict=False)]
    consumer._rejects_and_copies(producer, decoded, records, [])
    return len(msgs), producer


def label_path(card: str, tmp_path: Any, raw_capture: bool = False) -> tuple[int, RecordingProducer]:
    """The label joiner's DLQ: one poll of hostile ``fraud-labels`` messages through :meth:`LabelJoiner.step`."""
    msgs = _msgs(label_disguises(card), topic="fraud-labels")
    joiner = object.__new__(LabelJoiner)  # no broker: the consumer and producer are stand-ins
    joiner.topics = ServingConfig().topics
    joiner.max_message_bytes = 1 << 20
    joiner._kind = {joiner.topics.labels: "labels"}
    joiner._producer = producer = RecordingProducer()
    joiner.raw_capture = raw_capture

    joiner._take = lambda timeout_ms: msgs  # one poll: these records
    joiner._positions = {}
    joiner.stats = JoinStats()
    with OutcomeStore(tmp_path / f"outcomes-{card}-{raw_capture}.sqlite") as joiner.store:
        assert joiner.step() == len(msgs)
    assert sum(joiner.stats.dead_lettered.values()) == len(msgs)
    return len(msgs), producer


# ---------------------------------------------------------------------------------------------------- the tests
def _the_check_finds_what_the_old_dlq_kept() -> None:
    assert all(luhn_ok(card) for card in CARDS)
    assert recoverable(CARDS[0], [(None, json.dumps({"raw_b64": base64.b64encode(
        "4111_1111_1111_1111".encode("utf-16")).decode()}).encode(), [])])
    assert recoverable(CARDS[0], [(b"PAN4111111111111111", b"{}", [])])
    assert recoverable(CARDS[0], [(None, b'{"a": "4111111111\\u003111111"}', [])])


@pytest.mark.parametrize("raw_capture", [False, True])
@pytest.mark.parametrize("card", CARDS)
def test_decode_rejects_keep_no_card_number(card: str, raw_capture: bool) -> None:
    _the_check_finds_what_the_old_dlq_kept()  # the check below is not vacuous
    n, producer = decode_path(card, raw_capture)
    sent = producer.messages(ServingConfig().topics.dlq)
    assert len(sent) == n  # one DLQ record per rejected message
    assert recoverable(card, sent) == []


@pytest.mark.parametrize("raw_capture", [False, True])
@pytest.mark.parametrize("card", CARDS)
def test_stage_rejects_keep_no_card_number(card: str, raw_capture: bool) -> None:
    n, producer = stage_path(card, raw_capture)
    sent = producer.messages(ServingConfig().topics.dlq)
    assert len(sent) == n
    assert recoverable(card, sent) == []


@pytest.mark.parametrize("raw_capture", [False, True])
@pytest.mark.parametrize("card", CARDS)
def test_the_labels_dlq_keeps_no_card_number(card: str, raw_capture: bool, tmp_path) -> None:
    n, producer = label_path(card, tmp_path, raw_capture)
    sent = producer.messages(ServingConfig().topics.labels_dlq)
    assert len(sent) == n
    assert recoverable(card, sent) == []


def test_a_dead_letter_keeps_the_canonical_fields_masked_and_coarse_and_no_payload() -> None:
    card = CARDS[1]
    _, producer = stage_path(card)
    records = [json.loads(v) for _, v, _ in producer.messages(ServingConfig().topics.dlq)]
    canonical = {"transaction_id", "cardholder_id", "merchant_id", "timestamp", "amount", "lat", "lon", "mcc"}
    for r in records:
        assert set(r["record"]) == canonical  # pan, name, dob, street, note dropped
        assert (r["record"]["lat"], r["record"]["lon"]) == (40.71, -74.01)  # the validator's 0.01°
        assert r["record"]["cardholder_id"] == TOKEN and "raw_b64" not in r
        assert r["raw_bytes"] > 0 and len(r["raw_sha256"]) == 64
    by_id = {r["record"]["transaction_id"]: r["record"] for r in records}
    assert by_id["tx-a"]["merchant_id"] == "PAN************1486"
    assert by_id["tx-b"]["merchant_id"] == "****_****_****_1486"


def test_card_rejects_never_keep_the_payload_and_unparseable_bytes_only_a_digest() -> None:
    from fedfraud.serving.kafka.dead_letters import payload_digest

    _, producer = decode_path(CARDS[0], raw_capture=True)
    sent = {json.loads(v)["offset"]: (k, json.loads(v)) for k, v, _ in producer.messages("transactions-dlq")}
    names = list(decode_disguises(CARDS[0]))
    by_name = {name: sent[10 * (i + 1)] for i, name in enumerate(names)}
    for name in ("cardholder_id", "untokenized", "plain"):
        record = by_name[name][1]
        assert record["reason"] in {"card_number_in_clear", "untokenized_card"} and "raw_b64" not in record
    assert by_name["untokenized"][1]["record"]["cardholder_id"] == "*" * 16 + "1111"  # not a token: last 4 only
    unparseable = by_name["unparseable body"][1]
    assert unparseable["record"] is None and unparseable["raw_bytes"] == len(f"PAN {CARDS[0]} ") + 2
    assert unparseable["raw_sha256"] == payload_digest(f"PAN {CARDS[0]} ".encode() + b"\xff{")
    # a key that is not a card token is replaced by a digest (of its masked bytes); a card token is kept
    assert by_name["key"][0].startswith(b"sha256:") and by_name["plain"][0] is None
    consumer, tokens = _consumer(False), RecordingProducer()
    msg = Msg(json.dumps(_tx(amount=-1)).encode(), 0, key=TOKEN.encode())
    consumer._dead_letter(tokens, decode_messages([msg], consumer.validator).dead[0])
    assert tokens.sent[0][1] == TOKEN.encode()


def test_the_chaos_audit_finds_a_dead_lettered_transaction_in_the_masked_record() -> None:
    """``fedfraud bench chaos`` counts a transaction the stages dead-lettered as accounted for, not lost: the DLQ
    record names it in ``record`` now that it keeps no payload."""
    from fedfraud.bench.chaos import audit

    consumer, producer = _consumer(False), RecordingProducer()
    decoded = decode_messages([Msg(json.dumps(_tx(transaction_id="t2")).encode(), 0)], consumer.validator)
    consumer._rejects_and_copies(producer, decoded, [{"transaction_id": "t2", "decision": "rejected",
                                                      "reject_reason": "processing_error"}], [])
    dead = [json.loads(v) for _, v, _ in producer.messages("transactions-dlq")]
    row = audit("malformed records", {"t1", "t2"}, 0, [{"transaction_id": "t1"}], dead, 0.0, None)
    assert (row.decided, row.dead_lettered, row.lost) == (1, 1, 0)

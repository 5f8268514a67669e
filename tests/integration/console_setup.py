"""The analyst's console set up against real parts, shared by ``test_console.py`` (httpx) and
``test_console_browser.py`` (headless Chromium): a generated bank whose Feast repo is applied and materialized on
SQLite, topics of the calling module on the session's embedded broker, a registry with a promotion, and the
console over HTTP (uvicorn on a free port).

The decisions are records in the scorer's layout with seeded scores (``fedfraud.bench.console.decision_records``):
running the scorer would need a trained model and Ray Serve, and the console reads nothing else of it. One hostile
transaction and decision are added: a merchant name with HTML and a card number, exact coordinates, a reason with
HTML.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

HOSTILE_MERCHANT = '<script>alert("x")</script><img src=x onerror=alert(1)> Shop'
HOSTILE_REASON = '"><script>alert(2)</script>'
EXACT_LAT, EXACT_LON = 40.712776, -74.005974
PAN = "4111111111111111"
PAN_SPACED = "4111 1111 1111 1111"
#: the card number's first 8 digits, what a cut at 64 characters left of the 56 x's + PAN reason before the fix
PAN_PREFIX = "41111111"


def build_console_bank(work: Path) -> tuple[Any, Any, Path, Path]:
    """(config, transactions, applied Feast repo, work folder) of one small generated bank (40 cardholders)."""
    from fedfraud.bench.console import build_bank
    from fedfraud.config import FedfraudConfig

    cfg = FedfraudConfig()
    frame, repo = build_bank(work, cfg, cardholders=40, days=14, seed=3)
    return cfg, frame, repo, work


@contextmanager
def served_console(bank: tuple[Any, Any, Path, Path], kafka_broker: Any, hostile_newest: bool = True
                   ) -> Iterator[dict[str, Any]]:
    """Topics of their own on ``kafka_broker``, filled; a registry with two versions and a promotion; the console
    served until the block ends. ``hostile_newest``: the hostile decision is the newest (top of the queue) or the
    oldest (its last page, so that a screenshot of the first page shows ordinary declines).
    """
    from fedfraud.bench.console import fill_topics
    from fedfraud.console.runtime import ConsoleServer, close_console, open_console
    from fedfraud.core.credentials import new_token
    from fedfraud.core.net import free_port
    from fedfraud.serving.config import TopicNames
    from fedfraud.serving.kafka import confirm_sent, json_bytes, make_producer
    from fedfraud.training.registry import ModelRegistry

    cfg, frame, repo, work = bank
    run = f"console{time.monotonic_ns()}"
    topics = TopicNames(**{name: f"{run}-{value}" for name, value in TopicNames().model_dump().items()})
    kafka_broker.ensure_topics((t, 4) for t in topics.all())
    cfg = cfg.model_copy(update={"serving": cfg.serving.model_copy(update={"topics": topics})})
    decisions = fill_topics(kafka_broker.bootstrap_servers, frame, cfg, topics, seed=5)

    card = decisions[0]["cardholder"]
    hostile_tx = {"transaction_id": f"{run}-hostile", "cardholder_id": card, "merchant_id": f"{HOSTILE_MERCHANT} {PAN}",
                  "timestamp": "2026-01-20T10:00:00+00:00", "amount": 12.5, "lat": EXACT_LAT, "lon": EXACT_LON,
                  "mcc": "misc_net", "is_fraud": None}
    decided = decisions[-1]["decided_us"] + 10 if hostile_newest else decisions[0]["decided_us"] - 10
    hostile_decision = {**decisions[0], "transaction_id": hostile_tx["transaction_id"], "score": 0.97,
                        "decision": "fraud", "decided_us": decided,
                        "top_reasons": [{"feature": HOSTILE_REASON, "value": 1.0, "contribution": 0.5},
                                        {"feature": f"merchant {PAN_SPACED}", "value": PAN, "contribution": 0.4},
                                        {"feature": "x" * 56 + PAN, "value": 2.0, "contribution": 0.3}]}
    producer = make_producer(kafka_broker.bootstrap_servers, cfg.serving.producer)
    confirm_sent(producer, [producer.send(topics.transactions, key=card.encode(), value=json_bytes(hostile_tx)),
                            producer.send(topics.decisions, key=card.encode(), value=json_bytes(hostile_decision))])
    producer.close()

    registry = ModelRegistry(work / f"registry-{run}")
    for _ in range(2):
        with registry.publish("fraud", config={}, metrics={"test_pr_auc": 0.9}):
            pass
    registry.promote("fraud", 1, actor="cli:test", reason=f"<b>backtest</b> 2026-11, card {PAN} in the note",
                      evidence={"note": f"card {PAN_SPACED}", "pr_auc": 0.9})

    token = new_token()
    audit = work / f"audit-{run}.jsonl"
    parts = open_console(cfg, kafka_broker.bootstrap_servers, audit, registry.root, repo, wait_s=60, token=token)
    server = ConsoleServer(parts, port=free_port()).start()
    try:
        yield {"url": server.url, "app": server.app, "token": token, "decisions": decisions + [hostile_decision],
               "topics": topics, "hostile": hostile_tx, "audit": audit, "bootstrap": kafka_broker.bootstrap_servers,
               "frame": frame, "cfg": cfg}
    finally:
        server.stop()
        close_console(parts)


def client(console: dict[str, Any], token: str | None = "valid", analyst: str | None = "alice") -> httpx.Client:
    """An HTTP client of the console: the bearer token (``valid``: the right one) and ``X-Analyst``."""
    headers = {}
    if token is not None:
        headers["Authorization"] = f"Bearer {console['token'] if token == 'valid' else token}"
    if analyst:
        headers["X-Analyst"] = analyst
    return httpx.Client(base_url=console["url"], headers=headers, timeout=30)


def queue_rows(html: str) -> list[str]:
    """The transaction ids of a queue page, in order."""
    return re.findall(r'<a href="/case/[^"]+">([^<]+)</a>', html)


def newest_decline(console: dict[str, Any]) -> str:
    """The transaction id of the newest decline that is not the hostile one."""
    return next(d["transaction_id"] for d in sorted(console["decisions"], key=lambda d: d["decided_us"], reverse=True)
                if d["decision"] == "fraud" and d["transaction_id"] != console["hostile"]["transaction_id"])


def assert_label_on_topic_audited_and_joined(console: dict[str, Any], tx: str, analyst: str, outcomes: Path) -> None:
    """The analyst's "Fraud" on ``tx`` is on ``fraud-labels`` once with ``source: analyst:<name>``, in the audit
    log as acknowledged, and in the bank's outcome store after the real ``LabelJoiner`` read the topic (the path
    chargebacks take).
    """
    from fedfraud.feature_store.outcomes import OutcomeStore
    from fedfraud.serving.labels import LabelJoiner, parse_label
    from fedfraud.serving.replay import collect

    topics = console["topics"]
    labels = collect(console["bootstrap"], topics.labels, [tx], timeout_s=20)
    assert len(labels) == 1, labels
    row, reason, _ = parse_label(json.dumps(labels[0]).encode())
    assert reason == "" and row["is_fraud"] == 1 and row["source"] == f"analyst:{analyst}"

    audit = [json.loads(line) for line in Path(console["audit"]).read_text().splitlines()]
    assert [(a["transaction_id"], a["label"], a["actor"], a["result"]) for a in audit if a["transaction_id"] == tx] \
        == [(tx, "fraud", f"analyst:{analyst}", "acknowledged")]

    with OutcomeStore(outcomes) as store:
        joiner = LabelJoiner(console["bootstrap"], store, topics)
        try:
            joiner.run(idle_s=1.0)
        finally:
            joiner.close()
        stored = store.labels()
    mine = stored[stored["transaction_id"] == tx]
    assert mine[["is_fraud", "source"]].values.tolist() == [[True, f"analyst:{analyst}"]]

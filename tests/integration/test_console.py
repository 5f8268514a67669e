"""The analyst's console against real parts: the session's embedded broker (topics of its own), a Feast repo
applied and materialized on SQLite, the model registry, and the console over HTTP (uvicorn on a free port).

The decisions are records in the scorer's layout with seeded scores (``fedfraud.bench.console.decision_records``):
running the scorer would need a trained model and Ray Serve, and the console reads nothing else of it.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from fedfraud.credentials import new_token

pytestmark = pytest.mark.integration

HOSTILE_MERCHANT = '<script>alert("x")</script><img src=x onerror=alert(1)> Shop'
HOSTILE_REASON = '"><script>alert(2)</script>'
EXACT_LAT, EXACT_LON = 40.712776, -74.005974
PAN = "4111111111111111"


@pytest.fixture(scope="module")
def bank(tmp_path_factory: pytest.TempPathFactory):
    from fedfraud.bench.console import build_bank
    from fedfraud.config import FedfraudConfig

    cfg = FedfraudConfig()
    work = tmp_path_factory.mktemp("console-bank")
    frame, repo = build_bank(work, cfg, cardholders=40, days=14, seed=3)
    return cfg, frame, repo, work


@pytest.fixture(scope="module")
def console(bank, kafka_broker):
    """Topics of this module on the session's broker, filled; a registry with a promotion; the console served."""
    from fedfraud.bench.console import fill_topics
    from fedfraud.console.runtime import ConsoleServer, close_console, open_console
    from fedfraud.net import free_port
    from fedfraud.serving.config import TopicNames
    from fedfraud.serving.kafka import confirm_sent, json_bytes, make_producer
    from fedfraud.training.registry import ModelRegistry

    cfg, frame, repo, work = bank
    run = f"console{time.monotonic_ns()}"
    topics = TopicNames(**{name: f"{run}-{value}" for name, value in TopicNames().model_dump().items()})
    kafka_broker.ensure_topics((t, 4) for t in topics.all())
    cfg = cfg.model_copy(update={"serving": cfg.serving.model_copy(update={"topics": topics})})
    decisions = fill_topics(kafka_broker.bootstrap_servers, frame, cfg, topics, seed=5)

    # one hostile transaction: a merchant name with HTML, a card number and exact coordinates, a reason with HTML
    card = decisions[0]["cardholder"]
    hostile_tx = {"transaction_id": f"{run}-hostile", "cardholder_id": card, "merchant_id": f"{HOSTILE_MERCHANT} {PAN}",
                  "timestamp": "2026-01-20T10:00:00+00:00", "amount": 12.5, "lat": EXACT_LAT, "lon": EXACT_LON,
                  "mcc": "misc_net", "is_fraud": None}
    hostile_decision = {**decisions[0], "transaction_id": hostile_tx["transaction_id"], "score": 0.97,
                        "decision": "fraud", "decided_us": decisions[-1]["decided_us"] + 10,
                        "top_reasons": [{"feature": HOSTILE_REASON, "value": 1.0, "contribution": 0.5}]}
    producer = make_producer(kafka_broker.bootstrap_servers, cfg.serving.producer)
    confirm_sent(producer, [producer.send(topics.transactions, key=card.encode(), value=json_bytes(hostile_tx)),
                            producer.send(topics.decisions, key=card.encode(), value=json_bytes(hostile_decision))])
    producer.close()

    registry = ModelRegistry(work / f"registry-{run}")
    for _ in range(2):
        with registry.publish("fraud", config={}, metrics={"test_pr_auc": 0.9}):
            pass
    registry.promote("fraud", 1, actor="cli:test", reason="<b>backtest</b> 2026-11")

    token = new_token()
    audit = work / f"audit-{run}.jsonl"
    parts = open_console(cfg, kafka_broker.bootstrap_servers, audit, registry.root, repo, wait_s=60, token=token)
    server = ConsoleServer(parts, port=free_port()).start()
    try:
        yield {"url": server.url, "token": token, "decisions": decisions + [hostile_decision], "topics": topics,
               "hostile": hostile_tx, "audit": audit, "bootstrap": kafka_broker.bootstrap_servers, "frame": frame,
               "cfg": cfg}
    finally:
        server.stop()
        close_console(parts)


def _client(console, token: str | None = "valid", analyst: str | None = "alice") -> httpx.Client:
    headers = {}
    if token is not None:
        headers["Authorization"] = f"Bearer {console['token'] if token == 'valid' else token}"
    if analyst:
        headers["X-Analyst"] = analyst
    return httpx.Client(base_url=console["url"], headers=headers, timeout=30)


def _rows(html: str) -> list[str]:
    """The transaction ids of a queue page, in order."""
    return re.findall(r'<a href="/case/[^"]+">([^<]+)</a>', html)


def test_queue_pages_newest_first_without_reading_everything_and_filters(console):
    declines = [d for d in console["decisions"] if d["decision"] == "fraud"]
    newest = [d["transaction_id"] for d in sorted(declines, key=lambda d: d["decided_us"], reverse=True)]
    with _client(console) as c:
        first = c.get("/")
        assert first.status_code == 200
        assert f"{len(declines)} matching" in first.text
        assert _rows(first.text) == newest[:50]
        assert len(newest) > 25  # so that the next pages split them
        one, two = (c.get("/", params={"page": p, "size": 25}) for p in (1, 2))
        assert one.status_code == two.status_code == 200
        assert _rows(one.text) == newest[:25] and _rows(two.text) == newest[25:50]
        assert "page 2 of 2" in two.text
        beyond = c.get("/", params={"page": 10_000})
        assert beyond.status_code == 200 and _rows(beyond.text) == []

        high = c.get("/", params={"min_score": "0.5", "decision": "any"})
        want = {d["transaction_id"] for d in console["decisions"] if d["score"] >= 0.5}
        assert f"{len(want)} matching" in high.text
        assert set(_rows(high.text)) <= want

        reason = c.get("/", params={"reason": "amount"})
        with_reason = [d for d in declines if any(r["feature"] == "amount" for r in d["top_reasons"])]
        assert f"{len(with_reason)} matching" in reason.text

        none = c.get("/", params={"model": "fraud:v99"})
        assert "0 matching" in none.text
        fragment = c.get("/queue", headers={"HX-Request": "true"})
        assert fragment.status_code == 200 and "<html" not in fragment.text and _rows(fragment.text)[:5] == newest[:5]


def test_case_view_shows_token_graph_timeline_and_no_card_number_or_exact_place(console):
    hostile = console["hostile"]
    with _client(console) as c:
        page = c.get(f"/case/{quote(hostile['transaction_id'])}")
    assert page.status_code == 200
    html = page.text
    assert hostile["cardholder_id"] in html  # the card token
    assert re.search(r'<img id="ego-graph"[^>]+src="data:image/svg\+xml;base64,', html), "no ego graph drawn"
    assert "The card&#39;s recent timeline" in html or "The card's recent timeline" in html
    assert "40.71, -74.01" in html  # the place at 0.01°
    for exact in ("40.712776", "74.005974", "40.7128", "74.0060"):
        assert exact not in html
    assert PAN not in html and "************1111" in html  # masked but its last 4
    for pan in console["frame"]["cardholder_id"].astype(str).unique():
        assert pan not in html


def test_xss_merchant_name_and_reason_render_as_text(console):
    hostile = console["hostile"]
    with _client(console) as c:
        case = c.get(f"/case/{quote(hostile['transaction_id'])}").text
        queue = c.get("/", params={"reason": HOSTILE_REASON}).text
    for html in (case, queue):
        assert "<script>alert" not in html and "onerror=alert(1)>" not in html
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in case
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in queue
    assert len(re.findall(r"<script\b", case)) == 1  # htmx only
    assert re.search(r'<script src="/static/htmx.min.js"></script>', case)


def test_fraud_click_from_a_browser_session_produces_a_label_the_joiner_stores(console, tmp_path):
    from fedfraud.feature_store.outcomes import OutcomeStore
    from fedfraud.serving.labels import LabelJoiner, parse_label
    from fedfraud.serving.replay import collect

    declined = next(d for d in reversed(console["decisions"]) if d["decision"] == "fraud"
                    and d["transaction_id"] != console["hostile"]["transaction_id"])
    tx = declined["transaction_id"]
    with httpx.Client(base_url=console["url"], timeout=30) as browser:
        assert browser.get("/").status_code == 401
        login = browser.post("/login", data={"analyst": "alice", "token": console["token"]})
        assert login.status_code == 303 and browser.cookies.get("fedfraud_console_token")
        queue = browser.get("/")  # click 1: the queue is the landing page
        assert tx in queue.text
        case = browser.get(f"/case/{quote(tx)}")  # click 2: open the decline
        assert case.status_code == 200
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', case.text).group(1)
        assert browser.post(f"/label/{quote(tx)}", data={"label": "fraud"}).status_code == 403  # no CSRF field
        done = browser.post(f"/label/{quote(tx)}", data={"label": "fraud", "csrf": csrf},
                            headers={"HX-Request": "true"})  # click 3: "Fraud"
        assert done.status_code == 200, done.text
        assert "acknowledged by the broker" in done.text and "analyst:alice" in done.text

    topics = console["topics"]
    labels = collect(console["bootstrap"], topics.labels, [tx], timeout_s=20)
    assert len(labels) == 1
    row, reason, _ = parse_label(json.dumps(labels[0]).encode())
    assert reason == "" and row["is_fraud"] == 1 and row["source"] == "analyst:alice"

    audit = [json.loads(line) for line in Path(console["audit"]).read_text().splitlines()]
    assert [(a["transaction_id"], a["label"], a["actor"], a["result"]) for a in audit if a["transaction_id"] == tx] \
        == [(tx, "fraud", "analyst:alice", "acknowledged")]

    with OutcomeStore(tmp_path / "outcomes.sqlite") as store:  # the bank's joiner: the path chargebacks take
        joiner = LabelJoiner(console["bootstrap"], store, topics)
        try:
            joiner.run(idle_s=1.0)
        finally:
            joiner.close()
        stored = store.labels()
    mine = stored[stored["transaction_id"] == tx]
    assert mine[["is_fraud", "source"]].values.tolist() == [[True, "analyst:alice"]]

    deadline = time.monotonic() + 10  # the console's own reader sees the label too
    while time.monotonic() < deadline:
        with _client(console) as c:
            if "Labelled <strong>fraud</strong> by analyst:alice" in c.get(f"/case/{quote(tx)}").text:
                break
        time.sleep(0.2)
    else:
        pytest.fail("the case never showed the label it produced")


def test_without_a_token_401_with_a_wrong_one_403(console):
    with _client(console, token=None) as c:
        for path in ("/", "/models", f"/case/{console['decisions'][0]['transaction_id']}"):
            r = c.get(path)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert 'action="/login"' in r.text
        assert c.post(f"/label/{console['decisions'][0]['transaction_id']}", data={"label": "fraud"}).status_code == 401
        assert c.get("/healthz").status_code == 200 and c.get("/static/htmx.min.js").status_code == 200
        assert c.post("/login", data={"analyst": "mallory", "token": "guess"}).status_code == 403
        c.cookies.set("fedfraud_console_token", "guess")
        assert c.get("/").status_code == 403
    with _client(console, token="not-the-token") as c:
        assert c.get("/").status_code == 403


def test_bad_input_gets_4xx_never_500(console):
    known = console["decisions"][0]["transaction_id"]
    gets = ["/?page=0", "/?page=-1", "/?page=abc", "/?page=99999999999", "/?min_score=nan", "/?min_score=2",
            "/?max_score=-0.1", "/?size=7", "/?decision=maybe", "/?bank=-1", "/?reason=" + "r" * 100,
            "/?reason=%00", "/case/" + "x" * 300, "/case/no-such-transaction", "/case/%00", "/case/"]
    with _client(console) as c:
        for path in gets:
            r = c.get(path)
            assert 400 <= r.status_code < 500, (path, r.status_code)
        posts = [(f"/label/{known}", {"label": "maybe"}, 422), ("/label/no-such-transaction", {"label": "fraud"}, 404),
                 (f"/label/{known}", "x=" + "a" * 10_000, 413), (f"/label/{known}", b"label=\xff\xfe", 422)]
        for path, body, status in posts:
            kw = {"data": body} if isinstance(body, dict) else {
                "content": body if isinstance(body, bytes) else body.encode(),
                "headers": {"Content-Type": "application/x-www-form-urlencoded"}}
            r = c.post(path, **kw)
            assert r.status_code == status, (path, r.status_code)
    with _client(console, analyst=None) as c:  # a script without X-Analyst cannot label anonymously
        assert c.post(f"/label/{known}", data={"label": "fraud"}).status_code == 400
    with _client(console, analyst="bad name<>") as c:
        assert c.post(f"/label/{known}", data={"label": "fraud"}).status_code == 400


def test_models_page_shows_champion_and_the_escaped_promotion_history(console):
    with _client(console) as c:
        page = c.get("/models")
    assert page.status_code == 200
    assert "fraud: champion v1" in page.text and "v2" in page.text
    assert "&lt;b&gt;backtest&lt;/b&gt; 2026-11" in page.text and "cli:test" in page.text
    assert 'method="post"' not in page.text.split("<main>")[1]  # read-only: promote and roll back stay in the CLI

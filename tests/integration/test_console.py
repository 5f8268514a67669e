"""The analyst's console against real parts: the session's embedded broker (topics of its own), a Feast repo
applied and materialized on SQLite, the model registry, and the console over HTTP (uvicorn on a free port).

The set-up (``tests/integration/console_setup.py``, shared with the headless-Chromium test) produces decisions in the
scorer's layout with seeded scores (``fedfraud.bench.console.decision_records``): running the scorer would need a
trained model and Ray Serve, and the console reads nothing else of it.
"""

from __future__ import annotations

import re
import time
from urllib.parse import quote

import httpx
import pytest

from tests.integration.console_setup import (
    HOSTILE_REASON,
    PAN,
    PAN_PREFIX,
    PAN_SPACED,
    assert_label_on_topic_audited_and_joined,
    build_console_bank,
    newest_decline,
    served_console,
)
from tests.integration.console_setup import client as _client
from tests.integration.console_setup import queue_rows as _rows

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bank(tmp_path_factory: pytest.TempPathFactory):
    return build_console_bank(tmp_path_factory.mktemp("console-bank"))


@pytest.fixture(scope="module")
def console(bank, kafka_broker):
    """Topics of this module on the session's broker, filled; a registry with a promotion; the console served."""
    with served_console(bank, kafka_broker) as served:
        yield served


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


def test_card_number_in_a_reason_is_masked_in_case_and_queue(console):
    """The case's top reasons come from the decision record read back whole: a card number in a reason's feature
    or value was shown as is there, and the queue's 64-character cut kept 8 of its digits (masked after the cut).
    """
    hostile = console["hostile"]
    with _client(console) as c:
        case = c.get(f"/case/{quote(hostile['transaction_id'])}").text
        queue = c.get("/", params={"decision": "any", "size": 200}).text
        cut = c.get("/", params={"reason": "x" * 56 + "*" * 8}).text
    for html in (case, queue):
        for leak in (PAN, PAN_SPACED, PAN_PREFIX, "4111 1111"):
            assert leak not in html
    assert "merchant **** **** **** 1111" in case and '<td class="num">************1111</td>' in case
    assert "x" * 56 + "********" in queue
    assert "1 matching" in cut  # the masked reason is what the filter offers and matches


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
    tx = newest_decline(console)
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
        # a non-ASCII CSRF field was a 500 (hmac.compare_digest refuses such a str)
        assert browser.post(f"/label/{quote(tx)}", data={"label": "fraud", "csrf": "é" * 64}).status_code == 403
        assert browser.post(f"/label/{quote(tx)}", data={"label": "fraud", "csrf": "0" * 64}).status_code == 403
        done = browser.post(f"/label/{quote(tx)}", data={"label": "fraud", "csrf": csrf},
                            headers={"HX-Request": "true"})  # click 3: "Fraud"
        assert done.status_code == 200, done.text
        assert "acknowledged by the broker" in done.text and "analyst:alice" in done.text

    assert_label_on_topic_audited_and_joined(console, tx, "alice", tmp_path / "outcomes.sqlite")

    deadline = time.monotonic() + 10  # the console's own reader sees the label too
    while time.monotonic() < deadline:
        with _client(console) as c:
            if "Labelled <strong>fraud</strong> by analyst:alice" in c.get(f"/case/{quote(tx)}").text:
                break
        time.sleep(0.2)
    else:
        pytest.fail("the case never showed the label it produced")


def test_every_route_but_login_healthz_and_static_answers_401_without_a_token(console):
    """Walks the running app's own route table, so a route added later is covered too."""
    from starlette.routing import Mount, Route

    known = quote(console["decisions"][0]["transaction_id"])
    public = {"/login", "/healthz"}
    tried = []
    with _client(console, token=None) as c:
        for route in console["app"].routes:
            if isinstance(route, Mount):
                assert route.path == "/static"
                continue
            assert isinstance(route, Route)
            path = re.sub(r"\{[^}]+\}", known, route.path)
            for method in sorted(route.methods or ()):
                if method == "HEAD":
                    continue
                r = c.request(method, path, data={"label": "fraud"} if method == "POST" else None)
                tried.append((method, route.path, r.status_code))
                if route.path in public:
                    assert r.status_code != 401, (method, route.path)
                else:
                    assert r.status_code == 401, (method, route.path, r.status_code)
                    assert console["decisions"][0]["transaction_id"] not in r.text
    assert {p for _, p, _ in tried} >= {"/", "/queue", "/case/{transaction_id:path}", "/label/{transaction_id:path}",
                                        "/models", "/logout"}


def test_static_path_traversal_finds_nothing(console):
    """Raw request lines (http.client sends the path as is; httpx would resolve the dots), without a token: the
    static mount is the one place that skips authentication."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(console["url"])
    paths = ["/static/../web.py", "/static/%2e%2e/web.py", "/static/..%2fweb.py", "/static/%2e%2e%2fweb.py",
             "/static/../../../../../../etc/passwd", "/static//etc/passwd", "/static/%2fetc%2fpasswd",
             "/static/..%5cweb.py", "/static/../templates/base.html", "/static/%2e%2e/templates/base.html",
             "/static/../models", "/static/..;/models"]
    for path in paths:
        conn = http.client.HTTPConnection(where.hostname, where.port, timeout=10)
        try:
            conn.request("GET", path)
            answer = conn.getresponse()
            body = answer.read().decode("utf-8", "replace")
        finally:
            conn.close()
        assert answer.status == 404, (path, answer.status)
        assert "import" not in body and "root:" not in body and "{%" not in body and "Decisions" not in body, path


def test_security_headers_on_every_answer(console):
    """A CSP with no 'unsafe-*' (htmx's eval off), no framing (clickjacking on the label buttons), nosniff, no
    referrer, and no caching of pages that show cases."""
    from fedfraud.console.web import SECURITY_HEADERS

    known = quote(console["decisions"][0]["transaction_id"])
    with _client(console) as c, _client(console, token=None) as anonymous:
        answers = {"queue": c.get("/"), "case": c.get(f"/case/{known}"), "models": c.get("/models"),
                   "422": c.get("/?page=0"), "404": c.get("/case/nope"), "401": anonymous.get("/"),
                   "login": anonymous.get("/login"), "static": anonymous.get("/static/htmx.min.js")}
    for name, r in answers.items():
        for header, value in SECURITY_HEADERS.items():
            assert r.headers.get(header) == value, (name, header)
        assert "unsafe" not in r.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
        if name != "static":
            assert r.headers["cache-control"] == "no-store", name


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
            "/?reason=%00", "/case/" + "x" * 300, "/case/no-such-transaction", "/case/%00", "/case/",
            # str.isdigit() digits int() refuses, and more digits than int() parses: both were 500s
            "/?page=%C2%B2", "/?size=%C2%B2", "/?bank=%E2%81%B9", "/queue?page=%C2%B3", "/?page=" + "9" * 5000,
            "/?bank=" + "1" * 4400, "/?page=%D9%A1", "/?min_score=0." + "1" * 100, "/case/%ED%A0%80", "/case/%FF"]
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
    # a card number in a promotion's reason or evidence is masked like the topics' text
    assert PAN not in page.text and PAN_SPACED not in page.text
    assert "card ************1111 in the note" in page.text and "card **** **** **** 1111" in page.text
    assert 'method="post"' not in page.text.split("<main>")[1]  # read-only: promote and roll back stay in the CLI


# ---------------------------------------------------------------------------------------------------------------
# The Models page's live figures: shadow agreement and drift PSI over time (fedfraud/console/monitor.py).
# Records in the scorer's layouts (FraudStage._records + emit's decided_us; FraudStage._shadow_records) on topics
# of their own, a registry whose champion carries a drift reference as the fraud pipeline stores it.

HOSTILE_TAG = f'<script>alert(3)</script> $x^$ {PAN}'


def _decision(tx: str, card: str, score: float, anomaly: float | None, model: str, at_us: int) -> dict:
    """A ``fraud-decisions`` record as the scorer sends it (decision at the model's 0.5 threshold)."""
    fraud = score >= 0.5
    return {"transaction_id": tx, "cardholder": card, "score": score, "decision": "fraud" if fraud else "legit",
            "anomaly_score": anomaly, "top_reasons": [{"feature": "amount", "value": 1.0, "contribution": 0.4}]
            if fraud else [], "models": {"anomaly": "anomaly:v1", "fraud": model}, "produced_us": at_us - 900,
            "redelivered": False, "decided_us": at_us}


def _shadow(decision: dict, challenger: str, challenger_fraud: bool, at_us: int) -> dict:
    """A ``shadow-scores`` record as the scorer sends it: the challenger's score and decision, the champion's beside."""
    return {"transaction_id": decision["transaction_id"], "cardholder": decision["cardholder"],
            "champion": {"fraud_model": decision["models"]["fraud"], "anomaly_model": "anomaly:v1",
                         "score": decision["score"], "anomaly_score": decision["anomaly_score"]},
            "challenger": {"fraud_model": challenger, "anomaly_model": "anomaly:v1",
                           "score": 0.9 if challenger_fraud else 0.1, "anomaly_score": decision["anomaly_score"],
                           "decision": "fraud" if challenger_fraud else "legit"},
            "scored_us": at_us}


@pytest.fixture(scope="module")
def monitored(kafka_broker, tmp_path_factory):
    """Champion fraud:v1 (with a drift reference) decides 2,000 transactions: 1,000 scored like its reference, then
    1,000 with a shifted score; challenger fraud:v2 (no reference) shadows the last 300; fraud:v2 then decides 1,000
    of its own. One shadow record is sent twice, one has no decision, one names a hostile challenger.
    """
    import json

    import numpy as np

    from fedfraud.config import FedfraudConfig
    from fedfraud.console.runtime import ConsoleServer, close_console, open_console
    from fedfraud.core.credentials import new_token
    from fedfraud.core.net import free_port
    from fedfraud.serving.config import TopicNames
    from fedfraud.serving.kafka import confirm_sent, json_bytes, make_producer
    from fedfraud.training.registry import ModelRegistry
    from fedfraud.training.retrain.drift import DRIFT_FILE, DriftReference

    work = tmp_path_factory.mktemp("console-monitor")
    rng = np.random.default_rng(11)
    run = f"monitor{time.monotonic_ns()}"
    topics = TopicNames(**{name: f"{run}-{value}" for name, value in TopicNames().model_dump().items()})
    kafka_broker.ensure_topics((t, 4) for t in topics.all())
    cfg = FedfraudConfig()
    cfg = cfg.model_copy(update={"serving": cfg.serving.model_copy(update={"topics": topics})})

    def anomaly(n):  # a missing anomaly score is a state of its own (the reference's NaN bin)
        return np.where(rng.random(n) < 0.1, np.nan, rng.gamma(2.0, 0.5, n))

    registry = ModelRegistry(work / "registry")
    reference = DriftReference.from_matrix(["amount", "anomaly_score", "fraud_score"],
                                           np.column_stack([rng.lognormal(3, 1, 20_000), anomaly(20_000),
                                                            rng.beta(2, 8, 20_000)]))
    with registry.publish("fraud", config={}, metrics={"test_pr_auc": 0.8}) as folder:
        (folder / DRIFT_FILE).write_text(json.dumps(reference.to_json()), encoding="utf-8")
    with registry.publish("fraud", config={}, metrics={"test_pr_auc": 0.85}):
        pass
    registry.promote("fraud", 1, actor="cli:test", reason="first")
    registry.set_alias("fraud", "challenger", 2, actor="cli:test", reason="retrain")

    start = time.time_ns() // 1000 - 3_600_000_000
    scores = np.r_[rng.beta(2, 8, 1000), rng.beta(8, 2, 1000), rng.beta(2, 8, 1000)]
    anomalies = anomaly(3000)
    decisions = [_decision(f"{run}-{i:05d}", f"ct_{i % 50:032x}", float(scores[i]),
                           None if np.isnan(anomalies[i]) else float(anomalies[i]),
                           "fraud:v1" if i < 2000 else "fraud:v2", start + i * 1_000_000) for i in range(3000)]
    shadows = [_shadow(d, "fraud:v2", bool(rng.random() < 0.5) if rng.random() < 0.3 else d["decision"] == "fraud",
                       d["decided_us"] + 500) for d in decisions[1700:2000]]
    extra = [shadows[-1],  # at-least-once: the same shadow score again
             _shadow({**decisions[0], "transaction_id": f"{run}-no-decision"}, "fraud:v2", True, start),
             _shadow(decisions[5], HOSTILE_TAG, True, start + 5_000_500)]

    producer = make_producer(kafka_broker.bootstrap_servers, cfg.serving.producer)
    sends = [producer.send(topics.decisions, key=d["cardholder"].encode(), value=json_bytes(d)) for d in decisions]
    sends += [producer.send(topics.shadow_scores, key=s["cardholder"].encode(), value=json_bytes(s))
              for s in shadows + extra]
    confirm_sent(producer, sends)
    producer.close()

    token = new_token()
    parts = open_console(cfg, kafka_broker.bootstrap_servers, work / "audit.jsonl", registry.root,
                         work / "no-feature-repo", wait_s=60, token=token)
    server = ConsoleServer(parts, port=free_port()).start()
    try:
        yield {"url": server.url, "token": token, "parts": parts, "decisions": decisions, "shadows": shadows,
               "reference": reference, "topics": topics, "bootstrap": kafka_broker.bootstrap_servers,
               "producer": cfg.serving.producer, "start": start}
    finally:
        server.stop()
        close_console(parts)


def test_models_page_shadow_agreement_is_the_share_of_equal_decisions_on_the_topics(monitored):
    from fedfraud.console.monitor import model_monitor, windows

    decided = {d["transaction_id"]: d["decision"] for d in monitored["decisions"]}
    shadows = sorted(monitored["shadows"], key=lambda s: s["scored_us"])
    equal = [s["challenger"]["decision"] == decided[s["transaction_id"]] for s in shadows]
    agreed, scored = sum(equal), len(equal)
    assert 0 < agreed < scored  # both kinds present, so the figure is not trivially 0 or 1

    monitor = model_monitor(monitored["parts"].index, lambda tag: None, min_rows=500)
    pair = next(s for s in monitor.agreement if s.challenger == "fraud:v2")
    assert (pair.champion, pair.pairs, pair.agreed) == ("fraud:v1", scored, agreed)  # the duplicate counted once
    last = windows(scored, 1, 24)[-1]
    assert pair.points[-1].value == pytest.approx(sum(equal[last]) / (last.stop - last.start))
    assert pair.points[-1].at_us == shadows[-1]["scored_us"] and len(pair.points) == len(windows(scored, 1, 24))
    assert monitor.unmatched == 1

    with _client(monitored) as c:
        page = c.get("/models")
    assert page.status_code == 200
    row = re.search(r'<table id="agreement">.*?</table>', page.text, re.S)
    assert row is not None
    assert f"<td>fraud:v2</td><td>fraud:v1</td><td class=\"num\">{agreed / scored:.3f}</td>" in row.group(0)
    assert f"{agreed} / {scored}" in row.group(0)
    assert 'id="agreement-chart"' in page.text and "data:image/svg+xml;base64," in page.text
    assert "1 shadow scores whose decision is not indexed" in page.text
    # a hostile challenger tag is text, its card number masked; its $...$ did not break the drawing
    assert "&lt;script&gt;alert(3)&lt;/script&gt;" in page.text and "<script>alert(3)" not in page.text
    assert PAN not in page.text and "************1111" in page.text
    with httpx.Client(base_url=monitored["url"], timeout=30) as anonymous:
        assert anonymous.get("/models").status_code == 401


def test_models_page_drift_psi_is_near_zero_like_the_reference_and_large_once_shifted(monitored):
    import numpy as np

    from fedfraud.console.monitor import DriftReferences, model_monitor
    from fedfraud.training.retrain.drift import psi

    parts = monitored["parts"]
    assert parts.drift_min_rows == 500  # the scorer's retrain.drift_min_rows
    monitor = model_monitor(parts.index, DriftReferences(parts.registry_root), parts.drift_min_rows)
    champion = next(s for s in monitor.drift if s.model == "fraud:v1")
    assert "training reference stored with fraud:v1 (20000 rows)" in champion.baseline
    score = [p.value for p in champion.psi["fraud_score"]]
    anomaly = [p.value for p in champion.psi["anomaly_score"]]
    assert [p.rows for p in champion.psi["fraud_score"]] == [500] * 4  # 2,000 decisions in windows of 500
    assert max(score[:2]) < 0.1 < 1.0 < min(score[2:])  # like the reference, then shifted
    assert max(anomaly) < 0.1  # the anomaly score did not move

    ref = monitored["reference"]
    j = ref.names.index("fraud_score")
    newest = np.asarray([d["score"] for d in monitored["decisions"][1500:2000]]).reshape(-1, 1)
    one = type(ref)(("fraud_score",), (ref.edges[j],), (ref.shares[j],), ref.rows)
    by_hand = psi(ref.shares[j], one.counts(newest)[0])
    assert score[-1] == pytest.approx(by_hand)

    challenger = next(s for s in monitor.drift if s.model == "fraud:v2")  # no reference: vs its first window
    assert "its own first window (500 decisions; fraud:v2 has no training reference)" == challenger.baseline
    assert len(challenger.psi["fraud_score"]) == 1 and challenger.psi["fraud_score"][0].value < 0.1

    with _client(monitored) as c:
        page = c.get("/models")
    table = re.search(r'<table id="drift">.*?</table>', page.text, re.S)
    assert table is not None
    assert f"<td>fraud_score</td><td class=\"num\">{by_hand:.3f}</td>" in table.group(0)
    assert 'id="drift-chart"' in page.text


def test_a_shadow_score_read_before_its_decision_joins_when_the_decision_arrives(monitored):
    """The two topics are read in no fixed order: a shadow score waits for its decision (own models: v3 and v4,
    so the other tests' figures do not change)."""
    from fedfraud.serving.kafka import confirm_sent, json_bytes, make_producer

    index = monitored["parts"].index
    decision = _decision("late-decision", f"ct_{7:032x}", 0.9, 0.3, "fraud:v3", monitored["start"] + 10_000_000)
    shadow = _shadow(decision, "fraud:v4", False, decision["decided_us"] + 500)

    def pair():
        _, joined, unmatched = index.monitor_rows()
        return [d.decision for s, d in joined if s.challenger == "fraud:v4"], unmatched

    producer = make_producer(monitored["bootstrap"], monitored["producer"])
    try:
        before = pair()[1]
        confirm_sent(producer, [producer.send(monitored["topics"].shadow_scores, key=b"k", value=json_bytes(shadow))])
        deadline = time.monotonic() + 20
        while pair() != ([], before + 1) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pair() == ([], before + 1)  # read, waiting for its decision
        confirm_sent(producer, [producer.send(monitored["topics"].decisions, key=b"k", value=json_bytes(decision))])
        while pair() != (["fraud"], before) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pair() == (["fraud"], before)
    finally:
        producer.close()
    with _client(monitored) as c:
        page = c.get("/models")
    assert '<td>fraud:v4</td><td>fraud:v3</td><td class="num">0.000</td>' in page.text  # legit vs fraud

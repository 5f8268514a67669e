"""``fedfraud demo``'s console (issue 40: "the demo prints the console's URL, and the console shows the demo's stream
live"): the demo's hook, :func:`fedfraud.demo.open_live_console`, against an embedded broker started as the stream
stage starts it, with the run's token made as ``run_demo`` makes it.

The transactions go to ``transactions`` as the stream stage's replay sends them (``wire_records``, tokenized and
rounded, through the project's producer) and the decisions to ``fraud-decisions`` in the scorer's layout, keyed by
card as the scorer keys them, with seeded scores (``fedfraud.bench.console.decision_records``). The scorer itself
is not run: it needs a trained model and Ray Serve (minutes), and the console reads nothing else of it. The whole
``make demo`` (about 10 minutes) is not run here either.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fedfraud.config import FedfraudConfig

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def demo_broker() -> Iterator[Any]:
    """An embedded broker with the pipeline's default topics, as ``fedfraud.serving.runtime.start`` makes it for the
    stream stage (a broker of this module: the session's is shared, and the demo's console reads default names).
    """
    from fedfraud.serving.kafka.broker import EmbeddedBroker

    s = FedfraudConfig().serving
    broker = EmbeddedBroker(topics={t: s.partitions for t in s.topics.all()}).start()
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def demo_cfg(tmp_path_factory: pytest.TempPathFactory) -> tuple[FedfraudConfig, Path]:
    """The run's config as ``run_demo`` sets it: feature repo and registry under the run's folder, and a random API
    token written to ``<out>/api-token`` (no token configured)."""
    from fedfraud.config import update_section
    from fedfraud.serving.auth import per_run_token

    out = tmp_path_factory.mktemp("demo-out")
    cfg = update_section(FedfraudConfig(), "features", repo_dir=str(out / "feature_repo"))
    auth = per_run_token(cfg.serving.auth.model_copy(update={"token_file": None}), out)
    assert auth.token_file == str(out / "api-token")
    return update_section(cfg, "serving", registry_root=str(out / "registry"), auth=auth), out


def _stream(bootstrap: str, cfg: FedfraudConfig, cardholders: int, seed: int) -> list[dict[str, Any]]:
    """Transactions of a small generated bank as the replay sends them, and one decision each as the scorer
    produces it; returns the decisions, acknowledged by the broker."""
    from fedfraud.bench.console import decision_records
    from fedfraud.feature_store.privacy import PrivateFeaturizer
    from fedfraud.serving.kafka import confirm_sent, json_bytes, make_producer
    from fedfraud.serving.replay import wire_records
    from fedfraud.training.data.config import GeneratorConfig
    from fedfraud.training.data.synthetic import generate_frame

    frame, _ = generate_frame(GeneratorConfig(banks=1, cardholders=cardholders, days=4, seed=seed))
    frame = frame.sort_values(["timestamp", "transaction_id"]).reset_index(drop=True)
    s = cfg.serving
    wire = wire_records(frame, PrivateFeaturizer.for_bank(cfg.encoder, cfg.privacy, s.bank_id))
    decisions = decision_records(wire, seed)
    producer = make_producer(bootstrap, s.producer, client_id="fedfraud-replay", security=s.kafka_security)
    try:
        futures = [producer.send(s.topics.transactions, key=r["cardholder_id"].encode(), value=json_bytes(r))
                   for r in wire]
        futures += [producer.send(s.topics.decisions, key=d["cardholder"].encode(), value=json_bytes(d))
                    for d in decisions]
        confirm_sent(producer, futures, timeout_s=60)
    finally:
        producer.close()
    return decisions


def _queue_ids(client: httpx.Client) -> list[str]:
    page = client.get("/", params={"size": 200})
    assert page.status_code == 200, page.text[:300]
    return re.findall(r'<a href="/case/[^"]+">([^<]+)</a>', page.text)


def _wait_for_queue(client: httpx.Client, want: list[str], timeout_s: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    shown = _queue_ids(client)
    while shown[:len(want)] != want and time.monotonic() < deadline:
        time.sleep(0.3)
        shown = _queue_ids(client)
    return shown


def _running(broker: Any) -> bool:
    """Whether the embedded broker's process is up (a call, so a checker does not keep a narrowed property)."""
    return bool(broker.running)


def _refused(url: str) -> bool:
    try:
        httpx.get(url, timeout=2)
    except httpx.TransportError:
        return True
    return False


@pytest.mark.slow  # about 25 s on 2 busy cores, most of it importing the feature store's modules
def test_the_demo_s_console_shows_its_stream_live_at_the_printed_url(demo_broker, demo_cfg) -> None:
    from fedfraud.demo import open_live_console

    cfg, out = demo_cfg
    token = Path(cfg.serving.auth.token_file or "").read_text().strip()
    printed: list[str] = []
    with socket.socket() as taken:  # the port asked for is taken: the console takes a free one and says which
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        live = open_live_console(cfg, demo_broker.bootstrap_servers, out, port=busy, progress=printed.append)
        assert live is not None, printed
    try:
        (line,) = printed
        match = re.fullmatch(r"console: (http://127\.0\.0\.1:(\d+)/) shows this demo's stream live; log in with the "
                             r"API token in (\S+)", line)
        assert match, line
        url, port, token_file = match.group(1), int(match.group(2)), match.group(3)
        assert port != busy and token_file == str(out / "api-token")
        assert httpx.get(url, timeout=10).status_code == 401  # the demo's token guards it, as the scorer

        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
            assert _queue_ids(c) == []  # the stream stage opens it before the first transaction
            shown: list[str] = []
            for seed in (1, 2):  # two bursts of the stream, each seen while the console runs
                decisions = _stream(demo_broker.bootstrap_servers, cfg, cardholders=15, seed=seed)
                produced = sorted((d for d in decisions if d["decision"] == "fraud"), key=lambda d: d["decided_us"],
                                  reverse=True)
                assert produced, "the seeded scores made no decline"
                newest = [d["transaction_id"] for d in produced]
                shown = _wait_for_queue(c, newest[:200])
                assert shown[:len(newest[:200])] == newest[:200], (len(shown), len(newest))
            case = c.get(f"/case/{shown[0]}")
            assert case.status_code == 200 and shown[0] in case.text
            assert "ct_" in case.text  # the card token, read back by offset from the demo's topics
    finally:
        live.close()
    assert _refused(url)
    assert demo_broker.running  # not handed over: the stream stage's runtime stops its broker itself


def test_held_console_keeps_the_broker_until_it_is_stopped_then_stops_both(demo_cfg) -> None:
    """``--hold-console``: the stream stage hands its broker to the console; holding ends on Ctrl-C (here: the
    event the CLI's wait would see set) and stops the server, the readers and the broker."""
    from fedfraud.demo import open_live_console
    from fedfraud.serving.kafka.broker import EmbeddedBroker

    cfg, out = demo_cfg
    s = cfg.serving
    broker = EmbeddedBroker(topics={t: s.partitions for t in s.topics.all()}).start()
    try:
        live = open_live_console(cfg, broker.bootstrap_servers, out, port=0, progress=lambda _: None)
        assert live is not None
        live.broker = broker
        stop = threading.Event()
        holding = threading.Thread(target=live.hold, args=(stop,), daemon=True)
        holding.start()
        time.sleep(1.0)
        assert holding.is_alive() and _running(broker)
        assert httpx.get(f"{live.url}healthz", timeout=10).status_code == 200
        stop.set()
        holding.join(timeout=30)
        assert not holding.is_alive()
        assert not _running(broker) and _refused(live.url)
    finally:
        broker.stop()


def test_a_console_that_cannot_start_leaves_the_demo_going(demo_cfg, demo_broker) -> None:
    """``fedfraud --insecure-no-auth demo``: the console never runs open, so it does not start; the demo gets one
    line saying why and no exception (its ten-minute run goes on)."""
    from fedfraud.config import update_section
    from fedfraud.demo import open_live_console

    cfg, out = demo_cfg
    open_cfg = update_section(cfg, "serving", auth=cfg.serving.auth.model_copy(update={"disabled": True}))
    printed: list[str] = []
    assert open_live_console(open_cfg, demo_broker.bootstrap_servers, out, port=0, progress=printed.append) is None
    assert len(printed) == 1 and printed[0].startswith("console: not started (UserError: the console always needs "
                                                       "the API token"), printed


def test_demo_refuses_hold_without_console() -> None:
    from fedfraud.demo import DemoArgs

    with pytest.raises(ValueError, match="--hold-console needs the console"):
        DemoArgs(out=Path("x"), console=False, hold_console=True)
    with pytest.raises(ValueError, match="--console-port"):
        DemoArgs(out=Path("x"), console_port=70_000)

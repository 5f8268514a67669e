"""Issue 37 finding 4: the HTTP endpoints cannot be made to read, parse or write what an anonymous client wants.

The FastAPI apps of the scorer and the tokenizer are driven as ASGI apps, in process, with a ``receive`` that
counts the body bytes the app pulls: the token is checked before any byte is read, a body over the configured
cap is refused before the app reads past the cap, and the open probes answer a status only and write nothing.
``ray.serve.get_replica_context`` is pointed at the object under test (what Serve does in a replica).
"""

from __future__ import annotations

import asyncio
import json
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fedfraud.serving.auth import BearerAuth
from fedfraud.serving.config import AuthSettings, GuardSettings

# the replicas here are made without Serve (object.__new__ of the ingress class), whose __del__ is a coroutine
pytestmark = pytest.mark.filterwarnings("ignore:coroutine .*ASGIIngressWrapper.__del__.* was never awaited")

TOKEN = "t0ken-for-this-test"
GOOD = {"authorization": f"Bearer {TOKEN}"}
CHUNK = 64 << 10


@dataclass
class Reply:
    status: int
    body: bytes
    pulled: int  # body bytes the app asked for

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class _Body:
    chunks: list[bytes]
    pulled: int = 0
    _sent: list[bytes] = field(default_factory=list)

    async def receive(self) -> dict[str, Any]:
        if self.chunks:
            chunk = self.chunks.pop(0)
            self.pulled += len(chunk)
            return {"type": "http.request", "body": chunk, "more_body": bool(self.chunks)}
        await asyncio.sleep(3600)  # like a client that sent everything and waits for the answer
        raise AssertionError("unreachable")


def _call(app: Any, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b"",
          declare_length: bool = True, query: str = "") -> Reply:
    """One request through the ASGI app; ``body`` arrives in 64 KiB chunks, as from a socket."""
    headers = dict(headers or {})
    if declare_length:
        headers["content-length"] = str(len(body))
    else:
        headers["transfer-encoding"] = "chunked"
    source = _Body([body[i:i + CHUNK] for i in range(0, len(body), CHUNK)] or [b""])
    messages: list[dict[str, Any]] = []
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": query.encode(), "root_path": "",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    asyncio.run(app(scope, source.receive, send))
    start = next(m for m in messages if m["type"] == "http.response.start")
    payload = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return Reply(start["status"], payload, source.pulled)


@pytest.fixture
def replica(monkeypatch: pytest.MonkeyPatch):
    """Makes ``obj`` the servable object of the current replica, as Serve does for a request."""
    from ray import serve

    def use(obj: Any) -> Any:
        monkeypatch.setattr(serve, "get_replica_context", lambda: types.SimpleNamespace(servable_object=obj))
        return obj

    return use


# ---------------------------------------------------------------------------------------------------- tokenizer
def _tokenizer(replica, max_body_bytes: int | None = None) -> Any:
    from fedfraud.serving.tokenizer_service import TokenizerService, TokenizerServiceArgs, api

    service = object.__new__(TokenizerService.func_or_class)  # no tokenizer loaded: none of these requests needs one
    service.bearer = BearerAuth(TOKEN)
    cap = {} if max_body_bytes is None else {"max_body_bytes": max_body_bytes}
    service.args = TokenizerServiceArgs(registry_root="unused", **cap)
    replica(service)
    return api


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
@pytest.mark.parametrize("declare_length", [True, False])
def test_tokenizer_checks_the_token_before_reading_a_byte_of_the_body(replica, path: str,
                                                                      declare_length: bool) -> None:
    api = _tokenizer(replica)
    big = json.dumps({"texts": ["a" * (2 << 20)]}).encode()  # 2 MiB of valid JSON
    for headers, status in (({}, 401), ({"authorization": "Bearer wrong"}, 403)):
        reply = _call(api, "POST", path, headers, big, declare_length)
        assert reply.status == status, reply.body
        assert reply.pulled == 0


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
def test_tokenizer_refuses_a_body_over_its_cap_before_reading_past_it(replica, path: str) -> None:
    api = _tokenizer(replica, max_body_bytes=4096)
    big = json.dumps({"texts": ["a" * (1 << 20)]}).encode()
    declared = _call(api, "POST", path, GOOD, big)
    assert declared.status == 413 and declared.pulled == 0  # Content-Length says it all: nothing read
    streamed = _call(api, "POST", path, GOOD, big, declare_length=False)
    assert streamed.status == 413 and streamed.pulled <= CHUNK  # the first chunk passes the cap: stop there
    assert "4096" in streamed.json()["detail"]


def test_tokenizer_answers_422_not_500_for_a_body_that_is_not_its_request(replica) -> None:
    api = _tokenizer(replica)
    for body in (b"{not json", b'{"texts": "not a list"}', b'{"texts": []}', b"[]", b"\xff\xfe"):
        assert _call(api, "POST", "/tokenize", GOOD, body).status == 422, body
    assert _call(api, "POST", "/detokenize", GOOD, b'{"ids": [["x"]]}').status == 422
    assert _call(api, "POST", "/tokenize", {**GOOD, "content-length": "12x"}, b"", declare_length=False).status == 400


# ------------------------------------------------------------------------------------------------------- scorer
def test_score_refuses_a_body_over_the_configured_cap_before_reading_past_it(replica) -> None:
    """The configured ``http_max_body_bytes`` (4 KiB here) is applied while reading, not the 64 MiB hard cap."""
    from fedfraud.serving.app import api
    from fedfraud.serving.http_body import HARD_BODY_CAP

    replica(types.SimpleNamespace(bearer=BearerAuth(TOKEN), guards=GuardSettings(http_max_body_bytes=4096)))
    body = b"[" + b"{}," * (300 << 10) + b"{}]"  # ~900 KiB: far under the hard cap, far over the configured one
    assert len(body) < HARD_BODY_CAP
    declared = _call(api, "POST", "/score", GOOD, body)
    assert declared.status == 413 and declared.pulled == 0
    streamed = _call(api, "POST", "/score", GOOD, body, declare_length=False)
    assert streamed.status == 413 and streamed.pulled <= CHUNK
    anonymous = _call(api, "POST", "/score", {}, body, declare_length=False)
    assert anonymous.status == 401 and anonymous.pulled == 0


class _Consumer:
    """The consumer loop's health as the replica sees it."""

    def __init__(self, problems: list[str]) -> None:
        self._problems = problems
        self.joined = True

    def problems(self) -> list[str]:
        return list(self._problems)

    def stop(self) -> None:
        """Nothing runs."""


def _scorer(replica, tmp_path: Path, consumer: _Consumer | None, ready_error: Exception | None = None) -> Any:
    """A StreamScorer with a real metrics object and real durable counters on a SQLite state store."""
    from fedfraud.serving.app import StreamScorer
    from fedfraud.serving.kvstore import SqliteKV
    from fedfraud.serving.metrics import DurableCounters, PipelineMetrics

    def ready() -> None:
        if ready_error is not None:
            raise ready_error

    scorer = object.__new__(StreamScorer.func_or_class)
    scorer.bearer = BearerAuth(TOKEN)
    scorer.consumer = consumer
    scorer.metrics = PipelineMetrics()
    scorer.metrics.set_model("fraud", "fraud:v7")
    kv = SqliteKV(tmp_path / "state.db")
    scorer.durable = DurableCounters(kv, "group", "replica-a")
    scorer.hot = types.SimpleNamespace(ready=ready, close=lambda: None)
    replica(scorer)
    return kv


def test_healthz_is_read_only_and_says_only_ok_or_not(replica, tmp_path: Path) -> None:
    from fedfraud.serving.app import api

    kv = _scorer(replica, tmp_path, consumer=None)
    for _ in range(3):
        reply = _call(api, "GET", "/healthz")
        assert reply.status == 200 and reply.json() == {"status": "ok"}
    assert kv.items("counters") == []  # no probe wrote the state store


def test_healthz_hides_the_reasons_volumes_and_models_behind_the_token(replica, tmp_path: Path) -> None:
    from fedfraud.serving.app import api

    reason = "consumer loop died: KafkaException: broker kafka-0.bank.internal:9093 " + "x" * 5000
    kv = _scorer(replica, tmp_path, consumer=_Consumer([reason]))
    public = _call(api, "GET", "/healthz")
    assert public.status == 503 and public.json() == {"status": "unhealthy"}
    assert _call(api, "GET", "/healthz", query="detail=true").status == 401
    assert _call(api, "GET", "/healthz", {"authorization": "Bearer guess"}, query="detail=true").status == 403
    detail = _call(api, "GET", "/healthz", GOOD, query="detail=true")
    assert detail.status == 503
    body = detail.json()
    assert body["problems"] == [reason] and body["models"] == {"fraud": "fraud:v7"} and "consumed" in body
    assert kv.items("counters") == []


def test_readyz_says_only_ready_or_not_and_keeps_the_store_error_behind_the_token(replica, tmp_path: Path) -> None:
    from fedfraud.serving.app import api

    _scorer(replica, tmp_path, consumer=None, ready_error=ConnectionError("redis-0.bank.internal:6379 refused"))
    public = _call(api, "GET", "/readyz")
    assert public.status == 503 and public.json() == {"status": "not ready"}
    detail = _call(api, "GET", "/readyz", GOOD, query="detail=1")
    assert detail.status == 503 and "redis-0.bank.internal" in detail.json()["problems"][0]


# ------------------------------------------------------------------------------------------- no auth off-loopback
@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"])
def test_auth_may_be_off_on_loopback(host: str) -> None:
    from fedfraud.serving.auth import check_open_http

    check_open_http(AuthSettings(disabled=True), host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.0.0.5", "scorer.bank.internal"])
def test_auth_off_beyond_loopback_is_refused_in_one_line(host: str) -> None:
    from fedfraud.core.errors import UserError
    from fedfraud.serving.auth import check_open_http

    with pytest.raises(UserError, match="only allowed on a loopback address") as err:
        check_open_http(AuthSettings(disabled=True), host)
    assert "\n" not in str(err.value)
    check_open_http(AuthSettings(), host)  # with a token, any host is fine


def test_tokenizer_cli_refuses_no_auth_on_a_public_host(capsys: pytest.CaptureFixture[str]) -> None:
    from fedfraud.cli.app import main

    assert main(["tokenizer", "serve", "--insecure-no-auth", "--host", "0.0.0.0", "--registry", "/nonexistent"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "only allowed on a loopback address" in err


class _Started(Exception):
    """Stops a start-up right after ``serve.start``: what it was given is all the test needs."""


def _capture_serve_start(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    from ray import serve

    seen: dict[str, Any] = {}

    def start(**kwargs: Any) -> None:
        seen.update(kwargs)
        raise _Started

    monkeypatch.setattr(serve, "start", start)
    return seen


def test_the_runtime_gives_serve_the_configured_request_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedfraud.config import load_config
    from fedfraud.core.credentials import API_TOKEN_ENV
    from fedfraud.serving import runtime

    monkeypatch.setenv(API_TOKEN_ENV, TOKEN)
    monkeypatch.setattr(runtime, "ensure_ray", lambda *args, **kwargs: False)
    seen = _capture_serve_start(monkeypatch)
    cfg = load_config(None, ["serving.http_request_timeout_s=12.5"])
    with pytest.raises(_Started):
        runtime.start(cfg, bootstrap_servers="127.0.0.1:1", apply_features=False)
    assert seen["http_options"]["request_timeout_s"] == 12.5
    assert load_config(None, []).serving.http_request_timeout_s == 30.0  # on by default


def test_the_tokenizer_cli_gives_serve_the_timeout_and_the_service_the_body_cap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    from fedfraud.cli.app import main
    from fedfraud.core.credentials import API_TOKEN_ENV
    from fedfraud.serving import tokenizer_service
    from fedfraud.training.tokenizer.config import TokenizerConfig
    from fedfraud.training.tokenizer.export import build_tokenizer
    from fedfraud.training.tokenizer.trainer import publish_tokenizer

    cfg = TokenizerConfig(vocab_size=300)
    publish_tokenizer(tmp_path, build_tokenizer([(b"t", b"h")], cfg.special_tokens), cfg, metrics={}, privacy={},
                      card="test")
    monkeypatch.setenv(API_TOKEN_ENV, TOKEN)
    monkeypatch.setattr(ray, "init", lambda *args, **kwargs: None)
    built: list[Any] = []
    real_build = tokenizer_service.build_tokenizer_app
    monkeypatch.setattr(tokenizer_service, "build_tokenizer_app", lambda args: built.append(args) or real_build(args))
    seen = _capture_serve_start(monkeypatch)
    with pytest.raises(_Started):
        main(["--set", "serving.http_request_timeout_s=7", "--set", "serving.guards.http_max_body_bytes=2048",
              "tokenizer", "serve", "--registry", str(tmp_path)])
    assert seen["http_options"]["request_timeout_s"] == 7
    assert built[0].max_body_bytes == 2048

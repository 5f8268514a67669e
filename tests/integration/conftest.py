"""Shared fixtures of the integration suite: one Ray instance, one embedded Kafka broker, free ports."""

from __future__ import annotations

import pytest

from fedfraud import net


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
    from serving.broker import EmbeddedBroker
    from serving.config import ServingConfig

    s = ServingConfig()
    with EmbeddedBroker(topics={t: s.partitions for t in s.topics.all()}) as broker:
        yield broker

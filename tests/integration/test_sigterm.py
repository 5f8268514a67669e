"""SIGTERM stops a fedfraud command the way Ctrl-C does: its ``finally`` blocks run, nothing it started is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

pytestmark = pytest.mark.integration

CHILD = textwrap.dedent(
    """
    import time
    from fedfraud.cli.app import sigterm_unwinds
    from fedfraud.serving.kafka.broker import EmbeddedBroker

    with sigterm_unwinds():
        with EmbeddedBroker() as broker:  # what `fedfraud serve` and the demo start, in a session of its own
            print(broker._proc.pid, flush=True)
            time.sleep(120)
    """
)


def test_sigterm_stops_the_embedded_broker_it_started() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()  # type: ignore[union-attr]
        assert line.strip().isdigit(), child.stderr.read()  # type: ignore[union-attr]
        broker = psutil.Process(int(line))
        assert broker.is_running() and broker.pid != child.pid
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=30)
        deadline = time.monotonic() + 10
        while broker.is_running() and broker.status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the broker outlived the command"
            time.sleep(0.1)
        assert "KeyboardInterrupt" in child.stderr.read()  # type: ignore[union-attr]  # unwound, not killed
    finally:
        if child.poll() is None:
            child.kill()


def test_the_previous_handler_comes_back() -> None:
    from fedfraud.cli.app import sigterm_unwinds

    before = signal.getsignal(signal.SIGTERM)
    with sigterm_unwinds():
        assert signal.getsignal(signal.SIGTERM) is not before
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    assert signal.getsignal(signal.SIGTERM) is before

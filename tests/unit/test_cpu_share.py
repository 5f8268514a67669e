"""The serving bench's CPU shares come from the real /proc: a busy child uses about a core, a sleeper none."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from fedfraud.bench.cpu_share import CpuSampler, serving_role

pytestmark = pytest.mark.skipif(not CpuSampler().available, reason="needs Linux /proc")


BUSY, IDLE = "while True: pass", "import time; time.sleep(60)"


@contextmanager
def _children(*programs: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [subprocess.Popen([sys.executable, "-c", program]) for program in programs]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _measure(roles: dict[int, str], during: Callable[[], None]) -> tuple[CpuSampler, float, float]:
    """Sample at 20 Hz; the window is ``during()``, after 0.3 s of settling."""
    with CpuSampler(lambda pid, argv: roles.get(pid), interval_s=0.05) as cpu:
        time.sleep(0.3)
        start = time.perf_counter()
        during()
        end = time.perf_counter()
        time.sleep(0.1)
    return cpu, start, end


def test_a_busy_process_uses_about_a_core_and_a_sleeping_one_none():
    with _children(BUSY, IDLE) as (busy, idle):
        cpu, start, end = _measure({busy.pid: "busy", idle.pid: "idle"}, lambda: time.sleep(1.0))
    share = cpu.share(start, end)
    # one core when it gets one; the 2-core machine may be shared, so only a lower bound that a sleeper never reaches
    assert 0.3 < share["busy"] <= 1.2
    assert share["idle"] < 0.05
    assert cpu.share(end + 10, end + 11) == {}  # no sample brackets a window after the sampler stopped


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` so far, from /proc/<pid>/stat."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_process_that_exits_inside_the_window_keeps_the_cpu_it_used_there():
    """Two busy processes of one role, one killed half-way: the role's share counts both up to their ends.

    The reference is the CPU the two processes really used in the window (their /proc counters), so the test holds
    on a loaded machine too; dropping the killed process's CPU (the earlier bug) falls well short of it.
    """
    used: dict[str, float] = {}
    with _children(BUSY, BUSY) as (first, second):
        def kill_one_half_way() -> None:
            first_0, second_0 = _cpu_s(first.pid), _cpu_s(second.pid)
            time.sleep(0.6)
            used["second"] = _cpu_s(second.pid) - second_0
            second.kill()
            second.wait()
            time.sleep(0.6)
            used["first"] = _cpu_s(first.pid) - first_0

        cpu, start, end = _measure({first.pid: "busy", second.pid: "busy"}, kill_one_half_way)
    counted = cpu.share(start, end)["busy"] * (end - start)
    assert used["second"] > 0.05  # it ran before the kill
    assert 0.8 * (used["first"] + used["second"]) - 0.03 <= counted <= 1.2 * (used["first"] + used["second"]) + 0.03


def test_roles_come_from_the_command_line():
    assert serving_role(5, ["ray::ServeReplica:fedfraud:StreamScorer"], me=1) == "scoring replicas"
    assert serving_role(5, ["/root/.calfkit/bin/tansu-v0.6.0-510f3e2", "broker"], me=1) == "embedded broker"
    assert serving_role(5, ["/usr/bin/redis-server", "127.0.0.1:6379"], me=1) == "redis"
    assert serving_role(5, ["ray::ProxyActor"], me=1) == "Ray and Serve (others)"
    assert serving_role(5, ["/x/site-packages/ray/core/src/ray/raylet/raylet", "--flag"], me=1) == \
        "Ray and Serve (others)"
    assert serving_role(5, ["/v/bin/python", "/v/lib/python3.11/site-packages/ray/dashboard/agent.py"], me=1) == \
        "Ray and Serve (others)"
    assert serving_role(1, ["python", "-m", "fedfraud"], me=1) == "bench (load generator)"
    assert serving_role(5, ["/usr/bin/postgres"], me=1) is None
    # a path with ray in it is not Ray: Ray's images run as user "ray", and its logs sit in /tmp/ray
    assert serving_role(5, ["/usr/bin/python3", "/home/ray/app/worker.py"], me=1) is None
    assert serving_role(5, ["tail", "-f", "/tmp/ray/session_latest/logs/raylet.out"], me=1) is None

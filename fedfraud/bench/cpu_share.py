"""Where the machine's cores go during a benchmark: CPU time of each process, grouped by role, over a time window.

A latency figure on a shared 2-core machine depends on every process that
wants those cores at the same moment, not only on the code under test. The
serving bench reports, for each offered load, the share of a core used by the
scoring replicas, the embedded broker, Redis, the rest of Ray and Serve, and the
bench itself (the load generator: the decisions are collected after the window). Linux only (``/proc``);
elsewhere the sampler records nothing and the bench prints no such table.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

__all__ = ["CpuSampler", "serving_role"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_RAY_BINARIES = {"raylet", "gcs_server"}

#: One sample: perf_counter time, and pid → (role, CPU seconds so far) of every counted process alive then.
Sample = tuple[float, dict[int, tuple[str, float]]]


def serving_role(pid: int, argv: list[str], me: int | None = None) -> str | None:
    """The role of a process in a serving bench, from its command line; None for processes that are not counted."""
    if pid == (me if me is not None else os.getpid()):
        return "bench (load generator)"
    if not argv:
        return None
    exe = Path(argv[0]).name
    if argv[0].startswith("ray::"):  # Ray workers and actors retitle themselves ray::<class or task>
        return "scoring replicas" if "StreamScorer" in argv[0] else "Ray and Serve (others)"
    if exe.startswith("tansu"):
        return "embedded broker"
    if exe.startswith("redis-server"):
        return "redis"
    if exe in _RAY_BINARIES or any("site-packages/ray/" in a for a in argv[:2]):  # raylet, GCS, dashboard, agents
        return "Ray and Serve (others)"
    return None


class CpuSampler:
    """Samples the CPU seconds of every counted process every ``interval_s`` in a background thread."""

    def __init__(self, role: Callable[[int, list[str]], str | None] = serving_role, interval_s: float = 0.2,
                 proc: Path = Path("/proc")) -> None:
        self.role = role
        self.interval_s = interval_s
        self.proc = proc
        self.samples: list[Sample] = []
        self._roles: dict[int, str | None] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return (self.proc / "self" / "stat").exists()

    def _cpu(self) -> dict[int, tuple[str, float]]:
        """Pid → (role, CPU seconds so far) of the counted processes alive now."""
        out: dict[int, tuple[str, float]] = {}
        for entry in self.proc.iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                if pid not in self._roles:
                    argv = (entry / "cmdline").read_bytes().split(b"\0")
                    self._roles[pid] = self.role(pid, [a.decode(errors="replace") for a in argv if a])
                role = self._roles[pid]
                if role is None:
                    continue
                stat = (entry / "stat").read_text()
            except OSError:  # the process ended between listing and reading
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            out[pid] = (role, (int(fields[11]) + int(fields[12])) / _TICK)
        return out

    def sample(self) -> None:
        self.samples.append((time.perf_counter(), self._cpu()))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> CpuSampler:
        if self.available:
            self.sample()
            self._thread = threading.Thread(target=self._run, name="fedfraud-cpu-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self.sample()

    def share(self, start: float, end: float) -> dict[str, float]:
        """Cores used by each role between two ``time.perf_counter()`` instants (1.0 = one core), over the samples
        that bracket the window most tightly (up to ``interval_s`` wider on each side; empty if none do).

        Per process: its CPU at the closing sample (or at its last sample, if it exited inside the window) minus
        its CPU at the opening sample (0 if it started inside the window).
        """
        first = max((i for i, (t, _) in enumerate(self.samples) if t <= start), default=None)
        last = min((i for i, (t, _) in enumerate(self.samples) if t >= end), default=None)
        if first is None or last is None or self.samples[last][0] <= self.samples[first][0]:
            return {}
        opening = self.samples[first][1]
        seen: dict[int, tuple[str, float]] = {}
        for _, cpu in self.samples[first + 1 : last + 1]:
            seen.update(cpu)  # the latest reading of every process alive at some sample in the window
        out: dict[str, float] = {}
        for pid, (role, cpu_s) in seen.items():
            used = cpu_s - opening.get(pid, (role, 0.0))[1]
            out[role] = out.get(role, 0.0) + max(used, 0.0)
        span = self.samples[last][0] - self.samples[first][0]
        return {role: used / span for role, used in out.items()}

"""What starts retrain cycles: a cron schedule, a drift trigger, and the promotion policy on a timer.

The scheduler is APScheduler (3.x): in-process, cron syntax, ``max_instances=1``
and ``coalesce`` per job, and no server to run. A bank's retrain job needs
nothing more on one machine; on Kubernetes the same command runs from a
CronJob (``infra/k8s/retrain-cronjob.yaml``). Ray's job submission has no cron
trigger of its own (KubeRay's ``RayCronJob`` is that CronJob around a
RayJob), so it would add a cluster dependency without adding a feature here.

Each cycle runs as a child process (``python -m fedfraud retrain run``), as a
CronJob pod would: Flower's simulation starts and shuts down its own Ray
runtime, which must not be the runtime of a Ray Serve deployment in the same
process, and a cycle's memory is returned when it ends. The registry's
retrain lock (:func:`fedfraud.training.retrain.cycle.cycle_lock`) keeps two cycles
from overlapping whoever starts them.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from fedfraud.core.credentials import API_TOKEN_ENV, bearer_headers, read_secret
from fedfraud.core.errors import UserError

if TYPE_CHECKING:
    from fedfraud.config import FedfraudConfig

__all__ = ["RetrainScheduler", "SchedulerEvent", "max_drift_psi"]

log = logging.getLogger(__name__)


def max_drift_psi(metrics_url: str, ignore: tuple[str, ...] = (), timeout_s: float = 5.0,
                  token: str | None = None) -> tuple[float, str | None]:
    """The largest ``fedfraud_drift_psi`` of a ``/metrics`` scrape and its feature (``(nan, None)`` if none),
    leaving out the features in ``ignore``; ``token`` is serving's API token (``/metrics`` is behind it).
    """
    from prometheus_client.parser import text_string_to_metric_families

    request = urllib.request.Request(metrics_url, headers=bearer_headers(token))
    with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 - configured URL
        text = resp.read().decode("utf-8")
    best, name = float("nan"), None
    for family in text_string_to_metric_families(text):
        if family.name != "fedfraud_drift_psi":
            continue
        for sample in family.samples:
            if sample.labels.get("feature") in ignore:
                continue
            if name is None or sample.value > best:
                best, name = float(sample.value), sample.labels.get("feature")
    return best, name


@dataclass
class SchedulerEvent:
    """One thing the scheduler did: a cycle (with its trigger and outcome), a drift check or a policy run."""

    at: str
    what: str
    detail: dict[str, Any] = field(default_factory=dict)


class RetrainScheduler:
    """Cron-scheduled and drift-triggered retrain cycles of one registry, plus the promotion policy."""

    def __init__(self, cfg: FedfraudConfig, data: Path, registry: Path, outcomes: Path | None = None,
                 policy: bool = True) -> None:
        from apscheduler.schedulers.background import BackgroundScheduler

        self.cfg, self.data, self.registry, self.outcomes = cfg, Path(data), Path(registry), outcomes
        self.events: list[SchedulerEvent] = []
        self._last_drift_cycle = -float("inf")
        self._lock = threading.Lock()
        self._cycle_done = threading.Condition(self._lock)
        self.cycles = 0
        self.scheduler = BackgroundScheduler(timezone=UTC)
        self._add_jobs(policy)

    def _add_jobs(self, policy: bool) -> None:
        from apscheduler.triggers.cron import CronTrigger

        r = self.cfg.retrain
        common = {"max_instances": 1, "coalesce": True, "misfire_grace_time": 3600}
        self.scheduler.add_job(self.run_cycle, CronTrigger.from_crontab(r.schedule, timezone=UTC),
                               args=["schedule"], id="retrain-cron", **common)
        if r.metrics_url:
            self.scheduler.add_job(self.check_drift, "interval", seconds=r.drift_check_s, id="drift-check", **common)
        if policy and self.outcomes is not None:
            self.scheduler.add_job(self.run_policy, "interval", seconds=r.policy_check_s, id="promotion-policy",
                                   **common)

    def _event(self, what: str, **detail: Any) -> None:
        self.events.append(SchedulerEvent(datetime.now(UTC).isoformat(timespec="seconds"), what, detail))

    # ------------------------------------------------------------------ jobs
    def run_cycle(self, trigger: str) -> dict[str, Any]:
        """One cycle in a child process (``python -m fedfraud retrain run``); returns its result or error."""
        # the child gets this exact config; the file holds the bank's settings, so 0600 and gone afterwards
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="fedfraud-retrain-", delete=False) as fh:
            fh.write(yaml.safe_dump(self.cfg.model_dump(mode="json")))
        cmd = [*_niced(self.cfg.retrain.nice), sys.executable, "-m", "fedfraud", "--config", fh.name, "retrain",
               "run", "--data", str(self.data), "--registry", str(self.registry), "--trigger", trigger, "--json"]
        t0 = time.perf_counter()
        log.info("retrain cycle starting trigger=%s", trigger)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        finally:
            Path(fh.name).unlink(missing_ok=True)
        seconds = round(time.perf_counter() - t0, 1)
        if proc.returncode == 0:
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            detail = {"trigger": trigger, "seconds": seconds, "anomaly": result.get("anomaly"),
                      "fraud": result.get("fraud"), "cycle": result.get("cycle")}
        else:
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            result = {"error": tail, "returncode": proc.returncode}
            detail = {"trigger": trigger, "seconds": seconds, "error": tail}
            log.error("retrain cycle failed trigger=%s rc=%d: %s", trigger, proc.returncode, tail)
        with self._cycle_done:
            self.cycles += 1
            self._event("cycle", **detail)
            self._cycle_done.notify_all()
        return result

    def check_drift(self) -> None:
        """Start an unscheduled cycle when an input's PSI passes the threshold (once per cooldown)."""
        r = self.cfg.retrain
        assert r.metrics_url is not None
        try:
            token = read_secret(API_TOKEN_ENV, r.metrics_token_file)
            value, feature = max_drift_psi(r.metrics_url, r.drift_ignore, token=token)
        except urllib.error.HTTPError as exc:
            hint = f" (set ${API_TOKEN_ENV} or retrain.metrics_token_file)" if exc.code in (401, 403) else ""
            log.warning("drift check could not read %s: HTTP %d%s", r.metrics_url, exc.code, hint)
            return
        except (OSError, UserError) as exc:
            log.warning("drift check could not read %s: %s", r.metrics_url, exc)
            return
        if feature is None or not value >= r.drift_psi_threshold:
            return
        now = time.monotonic()
        if now - self._last_drift_cycle < r.drift_cooldown_s:
            return
        self._last_drift_cycle = now
        self._event("drift", feature=feature, psi=round(value, 3), threshold=r.drift_psi_threshold)
        log.warning("drift psi=%.3f on %s >= %.2f: starting an unscheduled retrain", value, feature,
                    r.drift_psi_threshold)
        self.scheduler.add_job(self.run_cycle, args=["drift"], id="retrain-drift", replace_existing=True,
                               max_instances=1)

    def run_policy(self) -> dict[str, Any]:
        """Run the promotion policy once (nothing to do without a challenger)."""
        from fedfraud.training.retrain.policy import decide_promotion

        assert self.outcomes is not None
        if not Path(self.outcomes).exists():
            return {"action": "wait", "reason": f"no outcome store at {self.outcomes} yet"}
        decision = decide_promotion(self.registry, self.outcomes, self.cfg.retrain, actor="scheduler")
        if decision.action != "wait":
            self._event("policy", action=decision.action, reason=decision.reason)
        return decision.to_json()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> RetrainScheduler:
        self.scheduler.start()
        job = self.scheduler.get_job("retrain-cron")
        log.info("retrain scheduler started: cron %r, next cycle %s", self.cfg.retrain.schedule,
                 job.next_run_time if job else None)
        return self

    def wait_for_cycles(self, n: int, timeout_s: float) -> bool:
        """Block until ``n`` cycles have finished (True) or ``timeout_s`` passed (False)."""
        with self._cycle_done:
            return self._cycle_done.wait_for(lambda: self.cycles >= n, timeout=timeout_s)

    def next_run(self) -> datetime | None:
        job = self.scheduler.get_job("retrain-cron")
        return job.next_run_time if job else None

    def shutdown(self, wait: bool = True) -> None:
        if self.scheduler.running:
            self.scheduler.shutdown(wait=wait)


def _niced(level: int) -> list[str]:
    """The ``nice -n LEVEL`` prefix of a cycle's command (inherited by the Ray processes the cycle starts), or none
    when the level is 0 or the machine has no ``nice``.
    """
    import shutil

    if level <= 0:
        return []
    found = shutil.which("nice")
    if found is None:
        log.warning("no `nice` on this machine: the retrain cycle runs at serving's CPU priority")
        return []
    return [found, "-n", str(level)]

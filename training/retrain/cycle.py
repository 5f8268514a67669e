"""One federated retrain cycle: window the banks' offline stores, train the anomaly GNN, then the fraud model,
and register both as the ``challenger``.

Guarantees:

* **No overlap.** A cycle holds an exclusive ``flock`` on ``<registry>/.retrain.lock``
  for its whole run; a second cycle fails at once with :class:`RetrainBusy`
  (the scheduler also runs at most one instance, but the lock covers cycles
  started by hand, by cron on another pod, or by the drift trigger).
* **Idempotent.** A cycle is named by its window end and a hash of its
  config and the number of labels that have come back; its steps are recorded
  in ``<registry>/retrain/<cycle>/state.json``. Running the same cycle again
  returns the recorded result; new labels make a new cycle.
* **Resumable.** A cycle killed mid-way resumes at its first unfinished step;
  the federated anomaly training resumes from its last round checkpoint.
  A crash between a publish and the state write leaves one unaliased version
  behind (never served: serving follows aliases), and the step runs again.

Labels: each bank's window takes ``is_fraud`` from the labels that came back
(``bank_<k>/outcomes.sqlite``, written by :mod:`fedfraud.serving.labels`) where the
offline row has none. Unlabelled rows older than ``label_maturity_days``
count as genuine; younger unlabelled rows are left out of the window.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pyarrow.parquet as pq

from fedfraud.core.errors import UserError
from fedfraud.feature_store.outcomes import OUTCOMES_FILE, OutcomeStore
from fedfraud.feature_store.layout import TRANSACTIONS_FILE, bank_dir, list_banks, read_bank
from fedfraud.training.data.writer import canonical_table
from fedfraud.training.registry import ModelRef, ModelRegistry

if TYPE_CHECKING:
    from fedfraud.config import FedfraudConfig

__all__ = ["CycleResult", "RetrainBusy", "cycle_lock", "run_cycle", "window_dataset"]

log = logging.getLogger(__name__)

LOCK_FILE = ".retrain.lock"
STATE_FILE = "state.json"


class RetrainBusy(UserError):
    """Another retrain cycle holds the registry's retrain lock."""


@dataclass
class CycleResult:
    """What one cycle did (also its ``state.json``)."""

    cycle: str
    trigger: str
    window_start: str
    window_end: str
    rows: int = 0
    frauds: int = 0
    labels_used: int = 0
    anomaly: str | None = None
    fraud: str | None = None
    merchant_risk: str | None = None  # the release day written to the online store, or why none was
    seconds: dict[str, float] = field(default_factory=dict)
    resumed: list[str] = field(default_factory=list)
    done: bool = False


@contextmanager
def cycle_lock(registry: Path) -> Iterator[None]:
    """Hold the registry's retrain lock (non-blocking: raises :class:`RetrainBusy` if another cycle has it)."""
    registry.mkdir(parents=True, exist_ok=True)
    path = registry / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            raise RetrainBusy(f"another retrain cycle is running (lock {path}, held by pid {holder})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def window_dataset(data: Path, out: Path, end: pd.Timestamp, window_days: float,
                   maturity_days: float) -> dict[str, int]:
    """Write each bank's window under ``out`` with labels joined; returns rows, frauds and labels used."""
    start = end - pd.Timedelta(days=window_days)
    mature = end - pd.Timedelta(days=maturity_days)
    totals = {"rows": 0, "frauds": 0, "labels_used": 0, "left_out_unlabelled": 0}
    for bank in list_banks(data):
        frame = read_bank(data, bank)
        frame = frame[(frame["timestamp"] > start) & (frame["timestamp"] <= end)].copy()
        label = frame["is_fraud"].astype("boolean") if "is_fraud" in frame else pd.Series(pd.NA, index=frame.index,
                                                                                         dtype="boolean")
        store_path = bank_dir(data, bank) / OUTCOMES_FILE
        if store_path.exists():
            with OutcomeStore(store_path) as store:
                came_back = store.labels().set_index("transaction_id")["is_fraud"]
            joined = frame["transaction_id"].astype(str).map(came_back).astype("boolean")
            use = label.isna() & joined.notna()
            label = label.where(~use, joined)
            totals["labels_used"] += int(use.sum())
        unknown = label.isna()
        old = frame["timestamp"] <= mature
        label = label.where(~(unknown & old), False)
        keep = ~(unknown & ~old)
        totals["left_out_unlabelled"] += int((~keep).sum())
        frame = frame[keep.to_numpy()].copy()
        frame["is_fraud"] = label[keep].astype(bool).to_numpy()
        target = bank_dir(out, bank)
        target.mkdir(parents=True, exist_ok=True)
        pq.write_table(canonical_table(frame.reset_index(drop=True)), target / TRANSACTIONS_FILE)
        totals["rows"] += len(frame)
        totals["frauds"] += int(frame["is_fraud"].sum())
    return totals


def _labels_seen(data: Path) -> int:
    """How many labels have come back to the banks' outcome stores: part of a cycle's identity, so labels that
    arrive after a cycle make the next one a new cycle even when no transaction was added.
    """
    total = 0
    for bank in list_banks(data):
        path = bank_dir(data, bank) / OUTCOMES_FILE
        if path.exists():
            with OutcomeStore(path) as store:
                total += store.count("labels")
    return total


def _cycle_id(cfg: FedfraudConfig, data: Path, end: pd.Timestamp) -> str:
    keyed = json.dumps({"data": str(data.resolve()), "labels": _labels_seen(data), "anomaly": cfg.anomaly.model_dump(),
                        "federated": cfg.federated.model_dump(exclude={"ray_host"}), "fraud": cfg.fraud.model_dump(),
                        "retrain": cfg.retrain.model_dump(exclude={"schedule", "metrics_url", "metrics_token_file"})},
                       sort_keys=True, default=str)
    return f"{end:%Y%m%dT%H%M%S}-{hashlib.sha256(keyed.encode()).hexdigest()[:8]}"


def _save(path: Path, result: CycleResult) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(result), indent=2), encoding="utf-8")
    os.replace(tmp, path)


def _pin_champions(reg: ModelRegistry, cycle: str) -> None:
    """Before a cycle publishes, make the serving version of each kind an explicit champion.

    ``champion`` follows ``latest`` until a version is promoted; without the
    pin, the versions this cycle publishes would become champion unevaluated.
    """
    for kind in ("anomaly", "fraud"):
        if "champion" not in reg.aliases(kind) and reg.latest(kind) is not None:
            reg.set_alias(kind, "champion", "latest", actor="retrain", reason=f"pinned before retrain cycle {cycle} "
                          "(was following latest)")


def _publish_merchant_risk(cfg: FedfraudConfig, data: Path, end: pd.Timestamp) -> str:
    """The day's merchant-risk release into the online store (the job's schedule is the retrain schedule); a
    store that was never applied is reported, not raised: the models of the cycle do not depend on it.
    """
    from fedfraud.feature_store.online import OnlineStateClient
    from fedfraud.training.merchant_risk.publish import publish_release

    try:
        client = OnlineStateClient.open(cfg.features, cfg.egograph)
    except UserError as err:
        log.warning("retrain merchant_risk skipped: %s", err)
        return f"skipped: {err}"
    done = publish_release(cfg, data, client, pd.Timestamp(end).date().isoformat(), progress=False)
    return done.date


def run_cycle(cfg: FedfraudConfig, data: Path, registry: Path, *, bank: int | None = None,
              end: pd.Timestamp | None = None, trigger: str = "manual") -> CycleResult:
    """Run (or resume, or return) the cycle of ``data``'s window ending at ``end`` (default: its newest row).

    ``bank`` is the bank whose fraud model is published (default ``serving.bank_id``).
    """
    from fedfraud.training.anomaly.federated.task import RunSettings
    from fedfraud.training.anomaly.federated.trainer import run_federated
    from fedfraud.training.fraud.pipeline import train_and_publish

    data, registry = Path(data), Path(registry)
    if not list_banks(data):
        raise UserError(f"{data}: no bank_<k>/{TRANSACTIONS_FILE} to retrain on")
    bank = cfg.serving.bank_id if bank is None else bank
    r = cfg.retrain
    if end is None:
        end = max(read_bank(data, b, columns=["timestamp"])["timestamp"].max() for b in list_banks(data))
    cycle = _cycle_id(cfg, data, end)
    home = registry / "retrain" / cycle
    state_path = home / STATE_FILE
    with cycle_lock(registry):
        home.mkdir(parents=True, exist_ok=True)
        if state_path.exists():
            result = CycleResult(**json.loads(state_path.read_text(encoding="utf-8")))
            if result.done:
                log.info("retrain cycle=%s already done (anomaly=%s fraud=%s)", cycle, result.anomaly, result.fraud)
                return result
            result.resumed.append(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        else:
            start = end - pd.Timedelta(days=r.window_days)
            result = CycleResult(cycle, trigger, start.isoformat(), end.isoformat())
        _pin_champions(ModelRegistry(registry), cycle)
        window = home / "data"
        t0 = time.perf_counter()
        if not result.rows:
            totals = window_dataset(data, window, end, r.window_days, r.label_maturity_days)
            result.rows, result.frauds, result.labels_used = totals["rows"], totals["frauds"], totals["labels_used"]
            result.seconds["window"] = round(time.perf_counter() - t0, 2)
            _save(state_path, result)
            log.info("retrain cycle=%s window rows=%d frauds=%d labels_used=%d left_out_unlabelled=%d", cycle,
                     totals["rows"], totals["frauds"], totals["labels_used"], totals["left_out_unlabelled"])
        if result.anomaly is None:
            t0 = time.perf_counter()
            run_cfg = cfg if r.rounds is None else cfg.model_copy(
                update={"federated": cfg.federated.model_copy(update={"rounds": r.rounds})})
            # checkpoints (and the resume point) of this cycle under its own folder; the model goes to the registry
            settings = RunSettings.from_config(run_cfg, window, home / "artifacts", resume=True)
            settings = RunSettings.from_flat({**settings.to_flat(), "registry-dir": str(registry)})
            run = run_federated(settings)
            if not run.version:
                raise RuntimeError(f"retrain cycle {cycle}: the federated run published no anomaly model")
            result.anomaly = str(run.version)
            result.seconds["anomaly"] = round(time.perf_counter() - t0, 2)
            _save(state_path, result)
        if result.fraud is None:
            t0 = time.perf_counter()
            version, _ = train_and_publish(cfg, window, registry, bank=bank,
                                           anomaly_version=str(ModelRef.parse(result.anomaly).version))
            result.fraud = version.tag
            result.seconds["fraud"] = round(time.perf_counter() - t0, 2)
            _save(state_path, result)
        if result.merchant_risk is None and cfg.fraud.merchant_risk_features:
            t0 = time.perf_counter()
            result.merchant_risk = _publish_merchant_risk(cfg, data, end)
            result.seconds["merchant_risk"] = round(time.perf_counter() - t0, 2)
            _save(state_path, result)
        reg = ModelRegistry(registry)
        evidence = {"cycle": cycle, "trigger": trigger, "window": [result.window_start, result.window_end],
                    "rows": result.rows, "frauds": result.frauds, "labels_used": result.labels_used}
        for kind, tag in (("anomaly", result.anomaly), ("fraud", result.fraud)):
            reg.set_alias(kind, "challenger", ModelRef.parse(tag).version, actor=f"retrain:{trigger}",
                          reason=f"retrain cycle {cycle}", evidence=evidence)
        result.done = True
        _save(state_path, result)
    log.info("retrain cycle=%s done challenger anomaly=%s fraud=%s seconds=%s", cycle, result.anomaly, result.fraud,
             result.seconds)
    return result

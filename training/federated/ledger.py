"""A bank's privacy ledger: the DP runs it answered, composed per cardholder across runs.

Every DP run's card states that run's (ε, δ). A cardholder whose data two runs train on spends both, and only the
bank can keep count of that honestly (the server is not trusted with the budget). So each bank keeps this ledger:
one entry per run, holding the run's Rényi-DP curve at the accountant's orders. RDP composes by adding the curves
(Mironov 2017, Proposition 1), so the ledger's ε is that of the summed curve, converted at the smallest δ of its
runs (dp-accounting's ``compute_epsilon``).

A bank charges a run's whole plan when it answers the run's first step, before anything is released (a run stopped
early is charged in full: an upper bound). The entry then counts the steps the bank answered and the last step's
number, on disk, under the lock: so a run is never charged twice, and never answered past its plan's steps or with a
replayed step either, even when the SuperNode restarts and its in-memory state is gone. With a lifetime budget set,
the bank refuses a run whose charge would take the composed ε past it; nothing of that run leaves the bank.

δ: RDP composes without δ, and the curve converts to (ε, δ) at any δ; the ledger converts at the bank's own
``dp-ledger-delta`` when set, else at the smallest δ its runs stated (which their run configs chose).

Node config (the SuperNode's ``--node-config``): ``dp-epsilon-budget`` (the lifetime ε; 0 records without a cap),
``dp-ledger-delta`` and ``dp-ledger`` (the file, an absolute path; default ``<data-dir>/dp-ledger.json``). The file
must live on storage the bank owns, writable and persistent (not a pod's scratch space: a new file is a new budget),
on a local file system (``flock``).
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from fedfraud.core.errors import ConfigError

__all__ = ["BUDGET_KEY", "DELTA_KEY", "LEDGER_KEY", "ORDERS", "LedgerEntry", "PrivacyBudgetExceeded",
           "PrivacyLedger", "StepRefused"]

logger = logging.getLogger(__name__)

#: The Rényi orders every entry's curve is at (integer and contiguous, as Poisson amplification needs), so that the
#: curves of every flow (DP-FedSGD runs, merchant-risk releases) add up.
ORDERS: tuple[int, ...] = tuple(range(2, 257))
#: Node-config key: the bank's lifetime ε per cardholder over every DP run (0: record only, no cap).
BUDGET_KEY = "dp-epsilon-budget"
#: Node-config key: the ledger file, an absolute path (default ``<data-dir>/dp-ledger.json``).
LEDGER_KEY = "dp-ledger"
#: Node-config key: the δ the ledger states its composed ε at (default: the smallest δ of its runs).
DELTA_KEY = "dp-ledger-delta"
_FORMAT = 1


class PrivacyBudgetExceeded(RuntimeError):
    """The run would take the bank's composed ε past its lifetime budget."""


class StepRefused(RuntimeError):
    """A step the run's entry does not allow: a replayed or earlier step, or one past the plan's steps."""


@dataclass(frozen=True)
class LedgerEntry:
    """One DP run as the bank answered it: its RDP curve at ``orders`` and the δ its card states."""

    run: str
    mechanism: str
    orders: tuple[float, ...]
    rdp: tuple[float, ...]
    delta: float
    epsilon: float
    charged_at: str = ""
    steps: int = 0
    last_step: int = 0

    @classmethod
    def of(cls, run: str, mechanism: str, orders: Sequence[float], rdp: np.ndarray, delta: float) -> LedgerEntry:
        """The entry of a run whose whole plan has RDP ``rdp`` at ``orders``."""
        curve = tuple(float(v) for v in np.asarray(rdp, dtype=np.float64))
        if len(curve) != len(orders) or not all(v >= 0 for v in curve):
            raise ValueError("an RDP curve needs one non-negative value per order")
        return cls(run, mechanism, tuple(float(a) for a in orders), curve, float(delta),
                   _epsilon(orders, np.asarray(curve), delta), datetime.now(UTC).isoformat(timespec="seconds"))


def _epsilon(orders: Sequence[float], rdp: np.ndarray, delta: float) -> float:
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    eps, _ = compute_epsilon(list(orders), rdp, delta)
    return float(eps)


class PrivacyLedger:
    """The ledger file of one bank; every read and charge holds an exclusive lock on ``<file>.lock``."""

    def __init__(self, path: Path, budget_epsilon: float = 0.0, delta: float | None = None) -> None:
        if not (budget_epsilon >= 0 and math.isfinite(budget_epsilon)):
            raise ConfigError(f"{BUDGET_KEY} must be a finite ε >= 0 (0: no cap), got {budget_epsilon}")
        if delta is not None and not 0 < delta < 1:
            raise ConfigError(f"{DELTA_KEY} must be in (0, 1), got {delta}")
        self.path = Path(path)
        self.budget_epsilon = float(budget_epsilon)
        self.delta = delta

    @classmethod
    def for_node(cls, node_config: Mapping[str, Any]) -> PrivacyLedger:
        """The ledger a SuperNode's config names (its data folder's by default)."""
        named = node_config.get(LEDGER_KEY)
        if named:
            where = Path(str(named))
            if not where.is_absolute():
                raise ConfigError(f"{LEDGER_KEY} must be an absolute path, got {named!r}")
        elif node_config.get("data-dir"):
            where = Path(str(node_config["data-dir"])).absolute() / "dp-ledger.json"
        else:
            raise ConfigError(f"the privacy ledger needs node config {LEDGER_KEY} or data-dir")
        numbers = {}
        for key, default in ((BUDGET_KEY, 0.0), (DELTA_KEY, None)):
            try:
                value = node_config.get(key, default)
                numbers[key] = None if value is None else float(value)
            except (TypeError, ValueError):
                raise ConfigError(f"{key} must be a number, got {node_config.get(key)!r}") from None
        return cls(where, numbers[BUDGET_KEY] or 0.0, numbers[DELTA_KEY])

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> list[LedgerEntry]:
        if not self.path.exists():
            return []
        doc = json.loads(self.path.read_text(encoding="utf-8"))
        if doc.get("format") != _FORMAT:
            raise ValueError(f"{self.path}: unknown ledger format {doc.get('format')!r}")
        return [LedgerEntry(**{**e, "orders": tuple(e["orders"]), "rdp": tuple(e["rdp"])}) for e in doc["runs"]]

    def entries(self) -> list[LedgerEntry]:
        """Every run charged so far, oldest first."""
        with self._locked():
            return self._read()

    def composed(self, entries: Sequence[LedgerEntry]) -> tuple[float, float]:
        """(ε, δ) per cardholder over ``entries``: their RDP curves summed, at the bank's δ (else the smallest δ
        among them). Curves at other orders than the first entry's (an older ledger) add by basic composition.
        """
        if not entries:
            return 0.0, 0.0
        delta = self.delta or min(e.delta for e in entries)
        orders = entries[0].orders
        same = [e for e in entries if e.orders == orders]
        other = [e for e in entries if e.orders != orders]
        eps = _epsilon(orders, np.sum([np.asarray(e.rdp) for e in same], axis=0), delta)
        return eps + sum(e.epsilon for e in other), delta + sum(e.delta for e in other)

    def spent(self) -> tuple[float, float]:
        """The bank's composed (ε, δ) per cardholder over every run in the ledger."""
        return self.composed(self.entries())

    def answer(self, entry: LedgerEntry, step: int, max_steps: int) -> tuple[float, float]:
        """Allow step ``step`` of ``entry``'s run: charge the run's whole plan at its first step (refused past the
        budget), then refuse a replayed or earlier step and one past ``max_steps``; count it on disk.

        Returns the composed (ε, δ) with the run counted.
        """
        with self._locked():
            runs = self._read()
            at = next((i for i, e in enumerate(runs) if e.run == entry.run), None)
            if at is None:
                eps, delta = self.composed([*runs, entry])
                if self.budget_epsilon and eps > self.budget_epsilon:
                    raise PrivacyBudgetExceeded(
                        f"run {entry.run} (ε {entry.epsilon:.3g}) would take this bank's ε per cardholder to "
                        f"{eps:.3g} at δ {delta:g}, past its budget {self.budget_epsilon:g} ({len(runs)} run(s) "
                        "charged)")
                runs.append(entry)
                at = len(runs) - 1
                logger.log(logging.INFO if self.budget_epsilon else logging.WARNING,
                           "dp_ledger run %s charged: composed ε %.3g at δ %g, budget %s", entry.run, eps, delta,
                           self.budget_epsilon or f"none ({BUDGET_KEY} unset)")
            current = runs[at]
            if step <= current.last_step:
                raise StepRefused(f"run {entry.run}: step {step} replays or precedes step {current.last_step}")
            if current.steps >= max_steps:
                raise StepRefused(f"run {entry.run}: its {max_steps} step(s) are answered")
            runs[at] = replace(current, steps=current.steps + 1, last_step=step)
            self._write(runs)
            return self.composed(runs)

    def charge(self, entry: LedgerEntry) -> tuple[float, float]:
        """One release of ``entry``'s run: its one step (a second release under the same run name is refused)."""
        return self.answer(entry, 1, 1)

    def _write(self, runs: Sequence[LedgerEntry]) -> None:
        """Atomic and durable: the new file is synced before it replaces the old, then the folder."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"format": _FORMAT, "runs": [asdict(e) for e in runs]}, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        folder = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)

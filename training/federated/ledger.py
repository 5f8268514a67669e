"""A bank's privacy ledger: the DP runs it answered, composed per cardholder across runs.

Every DP run's card states that run's (ε, δ). A cardholder whose data two runs train on spends both, and only the
bank can keep count of that honestly (the server is not trusted with the budget). So each bank keeps this ledger:
one entry per run, holding the run's Rényi-DP curve at the accountant's orders. RDP composes by adding the curves
(Mironov 2017, Proposition 1), so the ledger's ε is that of the summed curve, converted at the smallest δ of its
runs (dp-accounting's ``compute_epsilon``).

A bank charges a run's whole plan when it answers the run's first round, before anything is released, and once per
run (a run stopped early is charged in full: an upper bound). With a lifetime budget set, it refuses a run whose
charge would take the composed ε past it; nothing of that run leaves the bank.

Node config (the SuperNode's ``--node-config``): ``dp-epsilon-budget`` (the lifetime ε; 0 records without a cap)
and ``dp-ledger`` (the file; default ``<data-dir>/dp-ledger.json``).
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from fedfraud.core.errors import ConfigError

__all__ = ["BUDGET_KEY", "LEDGER_KEY", "ORDERS", "LedgerEntry", "PrivacyBudgetExceeded", "PrivacyLedger"]

logger = logging.getLogger(__name__)

#: The Rényi orders every entry's curve is at (integer and contiguous, as Poisson amplification needs), so that the
#: curves of every flow (DP-FedSGD runs, merchant-risk releases) add up.
ORDERS: tuple[int, ...] = tuple(range(2, 257))
#: Node-config key: the bank's lifetime ε per cardholder over every DP run (0: record only, no cap).
BUDGET_KEY = "dp-epsilon-budget"
#: Node-config key: the ledger file (default ``<data-dir>/dp-ledger.json``).
LEDGER_KEY = "dp-ledger"
_FORMAT = 1


class PrivacyBudgetExceeded(RuntimeError):
    """The run would take the bank's composed ε past its lifetime budget."""


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

    def __init__(self, path: Path, budget_epsilon: float = 0.0) -> None:
        if not (budget_epsilon >= 0 and math.isfinite(budget_epsilon)):
            raise ConfigError(f"{BUDGET_KEY} must be a finite ε >= 0 (0: no cap), got {budget_epsilon}")
        self.path = Path(path)
        self.budget_epsilon = float(budget_epsilon)

    @classmethod
    def for_node(cls, node_config: Mapping[str, Any]) -> PrivacyLedger:
        """The ledger a SuperNode's config names (its data folder's by default)."""
        where = node_config.get(LEDGER_KEY) or Path(str(node_config.get("data-dir", "."))) / "dp-ledger.json"
        try:
            budget = float(node_config.get(BUDGET_KEY, 0.0))
        except (TypeError, ValueError):
            raise ConfigError(f"{BUDGET_KEY} must be a number, got {node_config.get(BUDGET_KEY)!r}") from None
        return cls(Path(str(where)), budget)

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

    @staticmethod
    def composed(entries: Sequence[LedgerEntry]) -> tuple[float, float]:
        """(ε, δ) per cardholder over ``entries``: their RDP curves summed, at the smallest δ among them."""
        if not entries:
            return 0.0, 0.0
        orders = entries[0].orders
        if any(e.orders != orders for e in entries):
            raise ValueError("ledger entries at different RDP orders cannot be summed")
        delta = min(e.delta for e in entries)
        return _epsilon(orders, np.sum([np.asarray(e.rdp) for e in entries], axis=0), delta), delta

    def spent(self) -> tuple[float, float]:
        """The bank's composed (ε, δ) per cardholder over every run in the ledger."""
        return self.composed(self.entries())

    def charge(self, entry: LedgerEntry) -> tuple[float, float]:
        """Record ``entry`` unless its run is there already; refuse it when the composed ε would pass the budget.

        Returns the composed (ε, δ) with the run counted.
        """
        with self._locked():
            runs = self._read()
            if any(e.run == entry.run for e in runs):
                return self.composed(runs)
            eps, delta = self.composed([*runs, entry])
            if self.budget_epsilon and eps > self.budget_epsilon:
                raise PrivacyBudgetExceeded(
                    f"run {entry.run} (ε {entry.epsilon:.3g}) would take this bank's ε per cardholder to {eps:.3g} "
                    f"at δ {delta:g}, past its budget {self.budget_epsilon:g} ({len(runs)} run(s) charged)")
            doc = {"format": _FORMAT, "runs": [asdict(e) for e in [*runs, entry]]}
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(json.dumps(doc, indent=1), encoding="utf-8")
            os.replace(tmp, self.path)
        if not self.budget_epsilon:
            logger.warning("dp_ledger no %s set: run %s charged, composed ε %.3g at δ %g, no cap", BUDGET_KEY,
                           entry.run, eps, delta)
        else:
            logger.info("dp_ledger run %s charged: composed ε %.3g of budget %g at δ %g", entry.run, eps,
                        self.budget_epsilon, delta)
        return eps, delta

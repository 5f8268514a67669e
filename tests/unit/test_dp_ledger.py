"""A bank's privacy ledger: runs compose by adding RDP curves, once per run, and a run past the budget is refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from dp_accounting import GaussianDpEvent, SelfComposedDpEvent
from dp_accounting.rdp import RdpAccountant

from fedfraud.core.errors import ConfigError
from fedfraud.training.anomaly.config import CardholderDPConfig
from fedfraud.training.anomaly.distributed_dp import ORDERS, plan_distributed
from fedfraud.training.federated.ledger import (
    BUDGET_KEY,
    DELTA_KEY,
    LEDGER_KEY,
    LedgerEntry,
    PrivacyBudgetExceeded,
    PrivacyLedger,
    StepRefused,
)

DELTA = 1e-5


def _gaussian_entry(run: str, sigma: float, steps: int, delta: float = DELTA) -> LedgerEntry:
    """A run of ``steps`` Gaussian releases of sensitivity 1: RDP α/(2σ²) per step, exact."""
    rdp = steps * np.asarray(ORDERS, dtype=float) / (2 * sigma**2)
    return LedgerEntry.of(run, "gaussian", ORDERS, rdp, delta)


def _reference(sigma: float, steps: int, delta: float = DELTA) -> float:
    """dp-accounting's own RDP accountant over the same releases, at the same orders."""
    accountant = RdpAccountant(orders=list(ORDERS))
    accountant.compose(SelfComposedDpEvent(GaussianDpEvent(sigma), steps))
    return float(accountant.get_epsilon(delta))


def test_two_runs_compose_as_one_run_of_both_and_a_run_is_charged_once(tmp_path):
    ledger = PrivacyLedger(tmp_path / "bank" / "dp-ledger.json")
    first = _gaussian_entry("flwr-run-1", 4.0, 50)
    assert first.epsilon == pytest.approx(_reference(4.0, 50), rel=1e-9)
    eps1, delta1 = ledger.charge(first)
    assert (eps1, delta1) == (pytest.approx(first.epsilon), DELTA)
    eps2, _ = ledger.charge(_gaussian_entry("flwr-run-2", 4.0, 50))
    assert eps2 == pytest.approx(_reference(4.0, 100), rel=1e-9) and eps2 < 2 * eps1  # RDP composes sub-additively
    with pytest.raises(StepRefused):  # a release is one step: the same run name again is refused, not re-released
        ledger.charge(_gaussian_entry("flwr-run-2", 4.0, 50))
    assert [e.run for e in ledger.entries()] == ["flwr-run-1", "flwr-run-2"]
    assert ledger.spent() == (pytest.approx(eps2), DELTA)
    # a fresh reader of the file sees the same ledger, at the smallest δ of its runs
    again = PrivacyLedger(ledger.path)
    again.charge(_gaussian_entry("flwr-run-3", 4.0, 50, delta=1e-6))
    assert again.spent() == (pytest.approx(_reference(4.0, 150, 1e-6), rel=1e-9), 1e-6)


def test_a_runs_steps_are_charged_once_and_counted_on_disk_across_restarts(tmp_path):
    path = tmp_path / "dp-ledger.json"
    run = _gaussian_entry("flwr-run-5", 4.0, 3)  # a plan of 3 steps, charged whole at the first
    for step in (1, 2):
        PrivacyLedger(path).answer(run, step, 3)  # a new object per step: as a SuperNode restarting between steps
    with pytest.raises(StepRefused, match="replays or precedes"):
        PrivacyLedger(path).answer(run, 2, 3)
    PrivacyLedger(path).answer(run, 7, 3)  # a later step number (a round SecAgg+ halted in between) is fine
    with pytest.raises(StepRefused, match="3 step"):
        PrivacyLedger(path).answer(run, 8, 3)
    [entry] = PrivacyLedger(path).entries()
    assert (entry.steps, entry.last_step) == (3, 7) and entry.epsilon == pytest.approx(_reference(4.0, 3), rel=1e-9)


def test_the_banks_own_delta_states_the_ledger_whatever_delta_the_runs_named(tmp_path):
    path = tmp_path / "dp-ledger.json"
    PrivacyLedger(path).charge(_gaussian_entry("flwr-run-1", 4.0, 50, delta=1e-3))  # a server's lax δ
    assert PrivacyLedger(path).spent() == (pytest.approx(_reference(4.0, 50, 1e-3), rel=1e-9), 1e-3)
    assert PrivacyLedger(path, delta=1e-8).spent() == (pytest.approx(_reference(4.0, 50, 1e-8), rel=1e-9), 1e-8)
    strict = PrivacyLedger(path, budget_epsilon=_reference(4.0, 60, 1e-3), delta=1e-8)
    with pytest.raises(PrivacyBudgetExceeded):  # within the budget at δ 1e-3, past it at the bank's δ
        strict.charge(_gaussian_entry("flwr-run-2", 4.0, 5, delta=1e-3))


def test_a_run_past_the_budget_is_refused_and_the_ledger_is_unchanged(tmp_path):
    path = tmp_path / "dp-ledger.json"
    ledger = PrivacyLedger(path, budget_epsilon=_reference(4.0, 80))
    ledger.charge(_gaussian_entry("flwr-run-1", 4.0, 50))
    before = path.read_bytes()
    with pytest.raises(PrivacyBudgetExceeded, match="past its budget"):
        ledger.charge(_gaussian_entry("flwr-run-2", 4.0, 50))
    assert path.read_bytes() == before and len(json.loads(before)["runs"]) == 1
    ledger.charge(_gaussian_entry("flwr-run-3", 4.0, 30))  # what is left of the budget still runs
    assert ledger.spent()[0] == pytest.approx(ledger.budget_epsilon, rel=1e-9)


def test_a_plans_curve_is_the_accountant_the_card_states():
    dp = CardholderDPConfig(enabled=True, noise="distributed", target_epsilon=3.0, delta=DELTA, sampling_rate=0.2)
    plan = plan_distributed(dp, 40, 3, 500, 1_000)
    entry = LedgerEntry.of("flwr-run-9", "skellam", ORDERS, plan.rdp(40), DELTA)
    assert entry.epsilon == pytest.approx(plan.epsilon(40, DELTA), rel=1e-9) and entry.epsilon <= 3.0 + 1e-6


def test_node_config_names_the_file_the_budget_and_the_delta(tmp_path):
    ledger = PrivacyLedger.for_node({"data-dir": str(tmp_path), BUDGET_KEY: "8", DELTA_KEY: 1e-7})
    assert ledger.path == tmp_path / "dp-ledger.json" and ledger.budget_epsilon == 8.0 and ledger.delta == 1e-7
    assert PrivacyLedger.for_node({LEDGER_KEY: str(tmp_path / "x.json")}).path == tmp_path / "x.json"
    with pytest.raises(ConfigError, match="absolute path"):  # relative to whichever folder the process runs in
        PrivacyLedger.for_node({LEDGER_KEY: "x.json"})
    with pytest.raises(ConfigError, match="needs node config dp-ledger or data-dir"):
        PrivacyLedger.for_node({})
    for key, bad in ((BUDGET_KEY, "many"), (BUDGET_KEY, "-1"), (BUDGET_KEY, "inf"), (DELTA_KEY, "1.5")):
        with pytest.raises(ConfigError, match=key):
            PrivacyLedger.for_node({"data-dir": str(tmp_path), key: bad})
    with pytest.raises(ValueError, match="one non-negative value per order"):
        LedgerEntry.of("r", "m", ORDERS, np.ones(3), DELTA)


def test_the_cli_prints_a_banks_ledger_and_a_missing_one_is_one_line(tmp_path, capsys):
    from fedfraud.cli.app import main

    folder = tmp_path / "bank_1"
    ledger = PrivacyLedger(folder / "dp-ledger.json")
    ledger.charge(_gaussian_entry("flwr-run-1", 4.0, 50))
    ledger.charge(_gaussian_entry("flwr-run-2", 4.0, 50))
    assert main(["federation", "ledger", "--data-dir", str(tmp_path), "--bank", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in out[:2]] == ["flwr-run-1", "flwr-run-2"]
    assert out[2] == f"composed over 2 run(s): ε {_reference(4.0, 100):.4g} at δ 1e-05 per cardholder"
    assert main(["federation", "ledger", "--data-dir", str(tmp_path), "--bank", "0"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: no privacy ledger at {tmp_path / 'bank_0' / 'dp-ledger.json'}: this bank has answered no DP run there"]


def _charge_many(path: str, prefix: str, n: int) -> None:
    ledger = PrivacyLedger(Path(path))
    for i in range(n):
        ledger.charge(_gaussian_entry(f"{prefix}-{i}", 40.0, 1))


def test_two_processes_charging_one_ledger_lose_no_entry(tmp_path):
    """Flower may run a bank's ClientApp in a process per message: the lock serializes read-modify-write."""
    import multiprocessing

    path = tmp_path / "dp-ledger.json"
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_charge_many, args=(str(path), name, 15)) for name in ("a", "b")]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    runs = [e.run for e in PrivacyLedger(path).entries()]
    assert sorted(runs) == sorted(f"{p}-{i}" for p in "ab" for i in range(15))
    assert PrivacyLedger(path).spent()[0] == pytest.approx(_reference(40.0, 30), rel=1e-9)

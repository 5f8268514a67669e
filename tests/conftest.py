"""Suite-wide set-up: the simulation secret of the test suite.

The product has no default secret (``privacy.secret_seed`` is unset and commands refuse to start without one). The
tests use this one fixed value, known to be a test's, so that a failing run can be repeated bit for bit; set
``FEDFRAUD_SIMULATION_SECRET`` to run the suite under another. Set at import time, before any fixture starts Ray,
a broker or a Flower run, so every child process and Ray worker inherits it. Tests of the "no secret" refusal
remove it with ``monkeypatch``.
"""

from __future__ import annotations

import os

import pytest

from fedfraud.feature_store.privacy import FEDERATION_KEY_ENV, SECRET_ENV, SIMULATION_SECRET_ENV
from fedfraud.training.tokenizer.noise import TEST_NOISE_SEED_ENV

for _name in (SECRET_ENV, FEDERATION_KEY_ENV):  # a bank secret in the developer's shell would change every test
    os.environ.pop(_name, None)
os.environ.setdefault(SIMULATION_SECRET_ENV, "fedfraud-test-suite-simulation-secret-not-for-use")
# the tokenizer clients' noise, seeded for the suite only (a deployment draws OS entropy), so engines can be compared
os.environ.setdefault(TEST_NOISE_SEED_ENV, "7")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """The seed of this run's order, under ``-q`` too (``make test``): pytest-randomly shuffles the modules and the
    tests in each, and its own ``Using --randomly-seed`` header line is hidden by ``-q``. Passing the seed back
    repeats the order."""
    if config.pluginmanager.hasplugin("randomly") and getattr(config.option, "randomly_reorganize", False):
        terminalreporter.write_line(f"test order: -p randomly --randomly-seed={config.option.randomly_seed}")

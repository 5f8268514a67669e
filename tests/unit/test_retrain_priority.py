"""A scheduled retrain cycle runs below the scoring path's CPU priority (`retrain.nice`)."""

import os
import subprocess
import sys

import pytest

from fedfraud.training.retrain.config import RetrainConfig
from fedfraud.training.retrain.schedule import _niced


def test_a_cycle_command_runs_at_the_configured_niceness():
    assert RetrainConfig().nice == 10
    assert _niced(0) == []
    here = os.nice(0)
    out = subprocess.run([*_niced(7), sys.executable, "-c", "import os; print(os.nice(0))"],
                         capture_output=True, text=True, check=True)
    assert int(out.stdout) == min(here + 7, 19)


def test_niceness_is_bounded():
    with pytest.raises(ValueError, match="nice"):
        RetrainConfig(nice=20)

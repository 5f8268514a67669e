"""SecAgg+ on a real Flower simulation (3 banks, 1 round): the server-side strategy receives only the aggregate.

The same round runs twice from the same initial model and seeds: once on the plain legacy path, where the strategy
sees each bank's model, and once under SecAgg+ (``secaggplus_mod`` in the banks, ``SecAggPlusWorkflow`` on the
server). Under SecAgg+ every result the strategy gets carries the same parameters, equal (within SecAgg+'s
quantization) to the mean of what the banks sent in the plain run, and equal to no single bank's model.
"""

import numpy as np
import pytest
from flwr.common import parameters_to_ndarrays

from fedfraud.training.data.config import GeneratorConfig
from fedfraud.training.data.synthetic import generate_dataset
from fedfraud.training.federated.secagg import run_secagg
from fedfraud.training.anomaly.federated.task import RunSettings
from tests.integration.tiny_run import TINY_RUN

pytestmark = [pytest.mark.integration, pytest.mark.long]

SMALL = {
    **TINY_RUN,
    "local-epochs": 1,
    "rounds": 1,
}


def _flat(arrays) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("secagg")
    data = root / "data"
    generate_dataset(
        data, GeneratorConfig(banks=3, cardholders=24, days=21, fraud_rate=0.03, seed=11), raw_csv=False, progress=False
    )
    seen: dict[bool, list] = {True: [], False: []}
    out = {}
    for secagg in (False, True):
        settings = RunSettings.from_flat({**SMALL, "data-dir": str(data), "out-dir": str(root / f"out-{secagg}")})
        out[secagg] = run_secagg(
            settings,
            secagg=secagg,
            observer=lambda rnd, results, s=secagg: seen[s].append(
                [(_flat(parameters_to_ndarrays(res.parameters)), res.num_examples) for _, res in results]
            ),
        )
    return {"runs": out, "seen": seen}


def test_the_strategy_never_receives_an_individual_bank_model(runs):
    plain, secure = runs["seen"][False], runs["seen"][True]
    assert len(plain) == len(secure) == 1
    individual = [p for p, _ in plain[0]]
    assert len(individual) == 3
    assert min(np.abs(a - b).max() for i, a in enumerate(individual) for b in individual[i + 1:]) > 1e-3
    received = [p for p, _ in secure[0]]
    assert len(received) == 3 and all(np.array_equal(received[0], r) for r in received[1:])  # one aggregate, thrice
    mean = np.mean(individual, axis=0)
    assert np.abs(received[0] - mean).max() < 1e-4  # the sum / n, within SecAgg+'s quantization (16 / 2^22 per bank)
    for bank in individual:
        assert np.abs(received[0] - bank).max() > 100 * np.abs(received[0] - mean).max()


def test_both_paths_time_every_round(runs):
    for run in runs["runs"].values():
        assert run.banks == 3 and len(run.seconds_per_round) == 1 and run.seconds_per_round[0] > 0
        assert run.final

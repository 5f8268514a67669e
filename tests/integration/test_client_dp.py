"""Client-level DP on the anomaly federation, checked on the real messages of a real Flower simulation on Ray.

One 2-bank run with DP on, 1 round then resumed for a 2nd (shared with the anomaly module's tests): every update a
bank sends is within the clipping norm of the global model it received; the global model the server
releases is the equal-weight mean of those updates plus Gaussian noise of std
noise_multiplier × clip / banks (measured on the real aggregated
parameters); the published card carries the accountant's (ε, δ) over both rounds.
"""

import math

import numpy as np
import pytest
import torch

from fedfraud.training.federated.accountant import gaussian_epsilon
from fedfraud.training.registry import ModelRegistry

pytestmark = pytest.mark.integration
pytest_plugins = ("tests.integration.federation_fixtures",)  # the run shared with test_federated_anomaly

CLIP, NOISE = 0.05, 0.8  # the shared run's clipping norm and noise multiplier, checked in run()


def _flat(state: dict[str, torch.Tensor]) -> np.ndarray:
    return torch.cat([v.reshape(-1).double() for v in state.values()]).numpy()


@pytest.fixture(scope="module")
def run(resumed_dp_run):
    """The shared run (:mod:`tests.integration.federation_fixtures`): round 1, then round 2 in a resumed run."""
    dp = resumed_dp_run["settings"].federated.dp
    assert (dp.enabled, dp.clipping_norm, dp.noise_multiplier, dp.delta) == (True, CLIP, NOISE, 1e-5)
    assert resumed_dp_run["settings"].federated.aggregation == "fedavg"  # robust rules scale the noise
    return {"out": resumed_dp_run["out"], "result": resumed_dp_run["resumed"], "seen": resumed_dp_run["trained"],
            "final": resumed_dp_run["final"]}


def test_every_update_a_bank_sends_is_clipped(run):
    assert [rnd for rnd, _, _ in run["seen"]] == [1, 2]
    for _, received, replies in run["seen"]:
        assert len(replies) == 2
        base = _flat(received)
        for reply in replies:  # the real message that crossed the bank boundary
            assert reply.content["metrics"]["equal-weight"] == 1
            sent = _flat(reply.content["arrays"].to_torch_state_dict())
            norm = float(np.linalg.norm(sent - base))
            # at the bound (clipping was active), never above it
            assert norm == pytest.approx(CLIP, rel=1e-4), norm


def test_released_model_is_the_mean_plus_noise_of_the_stated_std(run):
    sigma = NOISE * CLIP / 2  # Flower's fixed-clipping wrappers: z · C / number of sampled banks
    history = {rnd: replies for rnd, _, replies in run["seen"]}
    released = {1: run["seen"][1][1], 2: run["final"].state_dict}  # round 1's global came back in round 2
    for rnd in (1, 2):
        mean = np.mean([_flat(r.content["arrays"].to_torch_state_dict()) for r in history[rnd]], axis=0)
        residual = _flat(released[rnd]) - mean
        n = residual.size
        assert n > 10_000
        std = residual.std()
        # std of a sample std ≈ σ/√(2n): 5 standard errors
        assert abs(std - sigma) < 5 * sigma / math.sqrt(2 * n), (std, sigma)
        assert abs(residual.mean()) < 5 * sigma / math.sqrt(n)
        # Gaussian, not e.g. uniform: the fourth standardized moment is 3
        assert abs(np.mean(((residual - residual.mean()) / std) ** 4) - 3.0) < 0.15


def test_the_published_card_carries_the_accountants_epsilon(run):
    assert run["result"].version is not None
    # by its tag: the anomaly module's centralized test publishes into the same registry
    version = ModelRegistry(run["out"]).get("anomaly", run["result"].version.rsplit(":", 1)[-1])
    dp = version.privacy["client_dp"]
    assert dp["dp"] == "on" and dp["rounds"] == 2 and dp["banks"] == 2
    assert dp["noise_multiplier"] == NOISE and dp["clipping_norm"] == CLIP and dp["delta"] == 1e-5
    assert dp["epsilon"] == pytest.approx(gaussian_epsilon(NOISE, 2, 1e-5))
    assert dp["noise_std"] == [pytest.approx(NOISE * CLIP / 2)]
    assert version.privacy["formal_guarantee"].startswith(f"({dp['epsilon']:.3g}, 1e-05)-DP for one bank")
    assert "accountant: dp_accounting RDP" in version.model_card
    assert len(run["final"].dp_ledger) == 2

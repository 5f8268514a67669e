"""SecAgg+'s masks are keyed by the whole shared secret: Flower 1.41's generator folds a 32-byte secret to 32 bits
(two secrets with one fold give one mask), ours does not; banks and server use ours once fedfraud's SecAgg+ code is
imported, and SecAgg+ rounds still decode exact sums (tests/unit/test_merchant_release.py, test_distributed_dp.py).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from fedfraud.training.federated import secagg_prg
from fedfraud.training.federated.secagg_prg import flower_pseudo_rand_gen as flower_prg

SHAPES = [(3, 4), (), (1000,)]


def _same_fold(seed: bytes) -> bytes:
    """Another secret with the same 32-bit XOR fold: flip the same bits in two of its 4-byte words."""
    flip = int.from_bytes(os.urandom(4), "little") | 1
    words = [int.from_bytes(seed[i:i + 4], "little") for i in range(0, len(seed), 4)]
    words[0] ^= flip
    words[1] ^= flip
    return b"".join(w.to_bytes(4, "little") for w in words)


def test_flowers_masks_have_32_bits_of_seed_and_ours_use_the_whole_secret():
    seed = os.urandom(32)
    other = _same_fold(seed)
    assert other != seed
    # the weakness: Flower's generator cannot tell the two secrets apart
    for a, b in zip(flower_prg(seed, 1 << 32, SHAPES), flower_prg(other, 1 << 32, SHAPES), strict=True):
        np.testing.assert_array_equal(a, b)
    ours, theirs = secagg_prg.pseudo_rand_gen(seed, 1 << 32, SHAPES), secagg_prg.pseudo_rand_gen(other, 1 << 32, SHAPES)
    assert np.mean(ours[2] == theirs[2]) < 0.01
    # deterministic in the secret (bank and server expand the same mask), Flower's shapes and dtype
    again = secagg_prg.pseudo_rand_gen(seed, 1 << 32, SHAPES)
    for mask, same, shape in zip(ours, again, SHAPES, strict=True):
        np.testing.assert_array_equal(mask, same)
        assert mask.shape == shape and mask.dtype == np.int64


def test_masks_are_uniform_over_the_range():
    [mask] = secagg_prg.pseudo_rand_gen(os.urandom(32), 1 << 32, [(200_000,)])
    assert mask.min() >= 0 and mask.max() < 1 << 32
    # mean of U[0, 2**32): std of the sample mean is 2**32 / sqrt(12 n); 6 std bounds a false alarm near 2e-9
    assert abs(mask.mean() / 2**32 - 0.5) < 6 / np.sqrt(12 * mask.size)
    low = secagg_prg.pseudo_rand_gen(os.urandom(32), 1 << 8, [(50_000,)])[0]
    counts = np.bincount(low, minlength=256)
    assert low.max() < 256 and counts.min() > 0
    for bad in (0, 3, 1000, 1 << 64):
        with pytest.raises(ValueError, match="power of two"):
            secagg_prg.pseudo_rand_gen(b"\0" * 32, bad, [(2,)])


def test_every_module_that_runs_secagg_installs_it_on_both_sides():
    import importlib

    import fedfraud.training.anomaly.federated.dp_app  # noqa: F401 - the imports install it
    import fedfraud.training.federated.secagg  # noqa: F401
    import fedfraud.training.fraud.federated.dp_app  # noqa: F401
    import fedfraud.training.merchant_risk.release_app  # noqa: F401

    assert secagg_prg.installed()
    bank = importlib.import_module("flwr.client.mod.secure_aggregation.secaggplus_mod")
    server = importlib.import_module("flwr.server.workflow.secure_aggregation.secaggplus_workflow")
    assert bank.pseudo_rand_gen is server.pseudo_rand_gen is secagg_prg.pseudo_rand_gen

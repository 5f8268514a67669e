"""Where a tokenizer client's noise comes from: fresh OS entropy, never a seed from the server.

Its own module, importing nothing of the package, so that the BPE core, the histogram mode, the Flower client and
the privacy account can all use it without an import cycle.
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["TEST_NOISE_SEED_ENV", "noise_rng"]

#: Tests and the bench's simulations only: seeds every client's noise from (this value, partition, stream) so that
#: runs repeat bit for bit and engines can be compared. A deployment never sets it; then each draw comes from fresh
#: OS entropy.
TEST_NOISE_SEED_ENV = "FEDFRAUD_TOKENIZER_TEST_NOISE_SEED"


def noise_rng(partition: int, *stream: int) -> np.random.Generator:
    """A client's noise generator: fresh OS entropy, never a seed from the server's query or the run's config.

    Why: a server that knows the seed can subtract the noise and read the exact counts, and two runs with one seed
    would reuse one draw. Only the test suite seeds it (:data:`TEST_NOISE_SEED_ENV`, with the client's partition
    and the release's ``stream``), so that engines can be compared merge for merge.
    """
    seed = os.environ.get(TEST_NOISE_SEED_ENV, "")
    if not seed:
        return np.random.default_rng()
    return np.random.default_rng([int(seed), int(partition), *(int(s) for s in stream)])

"""SecAgg+'s mask generator, keyed by the whole shared secret (AES-256 in counter mode).

Flower 1.41 expands each SecAgg+ mask (a bank's self mask and every pairwise mask) with
``secaggplus_utils.pseudo_rand_gen``: numpy's ``RandomState`` seeded with a 32-bit XOR fold of the 32-byte secret.
So each mask has at most 2³² possible values whatever the key exchange gives, and ``RandomState`` (MT19937) is not a
cryptographic generator: a server that holds a bank's masked vector can search the seeds of the masks that hide it
(2³² per mask, 2⁶⁴ for a bank of three) instead of the 2¹²⁸ the protocol is meant to give.

:func:`install` replaces that function, in the two Flower modules that call it (``secaggplus_mod`` on the banks,
``SecAggPlusWorkflow`` on the server), by :func:`pseudo_rand_gen` here: a keystream of AES-256-CTR under
SHA-256 of the whole secret, read as uniform integers mod ``num_range`` (a power of two, as Flower requires). Every
module of fedfraud that runs SecAgg+ installs it at import, so banks and server expand masks alike. A party on
Flower's own generator would unmask to a wrong sum, silently; so the server names this generator in every fit
config (:func:`fit_config`, which also checks it is installed on the server) and a bank answers only a config that
names it while its own process has it installed (:func:`require`).
"""

from __future__ import annotations

import hashlib
import importlib
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

__all__ = ["CONFIG_KEY", "VERSION", "PRGMismatch", "fit_config", "flower_pseudo_rand_gen", "install", "installed",
           "pseudo_rand_gen", "require"]

_DOMAIN = b"fedfraud secagg+ mask v1"
#: Fit-config key naming the mask generator, and this generator's name.
CONFIG_KEY = "secagg-prg"
VERSION = "aes256ctr-sha256-v1"


#: Flower's own generator, as imported before :func:`install` (tests compare against it).
flower_pseudo_rand_gen = importlib.import_module("flwr.common.secure_aggregation.secaggplus_utils").pseudo_rand_gen


class PRGMismatch(RuntimeError):
    """A party would expand SecAgg+ masks with another generator than the others: the sum would be wrong."""


def pseudo_rand_gen(seed: bytes, num_range: int, dimensions_list: list[tuple[int, ...]]) -> list[np.ndarray]:
    """Masks of the given shapes, uniform in ``[0, num_range)``, from a keystream keyed by all of ``seed``.

    Same signature and output shapes (int64) as Flower's ``secaggplus_utils.pseudo_rand_gen``.
    """
    if num_range < 2 or num_range & (num_range - 1) or num_range > 1 << 63:
        raise ValueError(f"num_range must be a power of two in [2, 2**63], got {num_range}")
    sizes = [math.prod(d) for d in dimensions_list]
    key = hashlib.sha256(_DOMAIN + bytes(seed)).digest()
    stream = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor().update(bytes(8 * sum(sizes)))
    words = np.frombuffer(stream, dtype="<u8") & np.uint64(num_range - 1)
    out, at = [], 0
    for dims, size in zip(dimensions_list, sizes, strict=True):
        # masks are used mod num_range; int64 holds every value up to 2**63 - 1, as Flower's output does
        out.append(words[at:at + size].astype(np.int64).reshape(dims))
        at += size
    return out


def install() -> None:
    """Make Flower's SecAgg+ (bank mod and server workflow) expand masks with :func:`pseudo_rand_gen`."""
    for module in _flower_modules():
        module.pseudo_rand_gen = pseudo_rand_gen


def fit_config() -> dict[str, str]:
    """What the server adds to every SecAgg+ fit config; it refuses to start a round without the generator."""
    if not installed():
        raise PRGMismatch("this server's SecAgg+ does not use fedfraud's mask generator (secagg_prg.install)")
    return {CONFIG_KEY: VERSION}


def require(config: Mapping[str, Any]) -> None:
    """A bank's check before it answers a SecAgg+ round: the server names this generator, and this process uses it."""
    if config.get(CONFIG_KEY) != VERSION:
        raise PRGMismatch(f"the server's SecAgg+ mask generator is {config.get(CONFIG_KEY)!r}, this bank's {VERSION}")
    if not installed():
        raise PRGMismatch("this bank's SecAgg+ does not use fedfraud's mask generator (secagg_prg.install)")


def installed() -> bool:
    """Whether both of Flower's SecAgg+ modules use this generator."""
    return all(module.pseudo_rand_gen is pseudo_rand_gen for module in _flower_modules())


def _flower_modules() -> list[Any]:
    """The two modules that call the generator (by module path: the packages export a function of one's name)."""
    return [importlib.import_module("flwr.client.mod.secure_aggregation.secaggplus_mod"),
            importlib.import_module("flwr.server.workflow.secure_aggregation.secaggplus_workflow"),
            importlib.import_module("flwr.common.secure_aggregation.secaggplus_utils")]

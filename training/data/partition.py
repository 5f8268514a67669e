"""Which bank holds a cardholder: IID (``hash``) or non-IID (``region``) partitioning.

Both are pure functions of the cardholder (and its home state), so a
cardholder's rows land in one bank no matter how the input is chunked.

* ``hash``: ``blake2b("fedfraud-bank:" + cardholder_id) mod banks``; banks
  get statistically identical customers.
* ``region``: the 51 US states + DC, sorted by Census division (New England,
  Middle Atlantic, East/West North Central, South Atlantic, East/West South
  Central, Mountain, Pacific) then postal code, are cut into ``banks``
  contiguous blocks of (nearly) equal state count: state at position ``i``
  goes to bank ``i * banks // 51``. With 5 banks: bank 0 = New England +
  Middle Atlantic + Illinois/Indiana, ..., bank 4 = the Mountain West +
  Pacific (see docs/data.md for the full table). Cardholders whose home state
  is unknown or not a US state fall back to ``hash``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable

import numpy as np
import pandas as pd

from fedfraud.training.data.geo import geo_tables

__all__ = ["PARTITIONERS", "hash_banks", "partitioner", "region_banks", "share_banks", "stable_units", "state_bank_map"]


def _hash_bank(cardholder_id: str, banks: int) -> int:
    digest = hashlib.blake2b(f"fedfraud-bank:{cardholder_id}".encode("utf-8", "surrogateescape"), digest_size=8)
    return int.from_bytes(digest.digest(), "big") % banks


def hash_banks(cardholder_ids: pd.Series, home_states: pd.Series | None, banks: int) -> np.ndarray:
    """IID bank of each row: a stable hash of its cardholder (hashing each distinct id once)."""
    del home_states  # same signature as region_banks; hashing ignores geography
    codes, uniques = pd.factorize(cardholder_ids.astype(str), sort=False)
    per_unique = np.fromiter((_hash_bank(u, banks) for u in uniques), dtype=np.int64, count=len(uniques))
    return per_unique[codes] if len(codes) else np.zeros(0, dtype=np.int64)


def stable_units(ids: Iterable[str], salt: str) -> np.ndarray:
    """A stable number in [0, 1) per id, ``blake2b(salt + ":" + id)``: an order or a draw that does not depend on
    how the input is chunked or shuffled (a different ``salt`` per use keeps the draws independent).
    """
    ids = list(ids)
    return np.fromiter(
        (int.from_bytes(hashlib.blake2b(f"{salt}:{i}".encode("utf-8", "surrogateescape"), digest_size=8).digest(),
                        "big") / 2**64 for i in ids), dtype=np.float64, count=len(ids))


def share_banks(cardholder_ids: pd.Series, shares: tuple[float, ...]) -> np.ndarray:
    """IID bank of each row with unequal bank sizes: a stable hash of the cardholder mapped onto ``shares``.

    Lets a study include a deliberately small bank (e.g. 5 % of cardholders) without giving up the
    "one cardholder, one bank, whatever the chunking" property of :func:`hash_banks`.
    """
    edges = np.cumsum(np.asarray(shares, dtype=np.float64))
    edges[-1] = 1.0 + 1e-12
    codes, uniques = pd.factorize(cardholder_ids.astype(str), sort=False)
    units = stable_units(uniques, "fedfraud-share")
    per_unique = np.searchsorted(edges, units, side="right").astype(np.int64)
    return per_unique[codes] if len(codes) else np.zeros(0, dtype=np.int64)


def state_bank_map(banks: int) -> dict[str, int]:
    """US postal code → bank for region partitioning (documented in the module docstring)."""
    order = geo_tables().state_order()
    return {state: i * banks // len(order) for i, state in enumerate(order)}


def region_banks(cardholder_ids: pd.Series, home_states: pd.Series | None, banks: int) -> np.ndarray:
    """Non-IID bank of each row: by the cardholder's home state, hash fallback when unknown."""
    fallback = hash_banks(cardholder_ids, None, banks)
    if home_states is None:
        return fallback
    mapped = home_states.fillna("").astype(str).str.strip().str.upper().map(state_bank_map(banks))
    return np.where(mapped.notna(), mapped.fillna(-1).to_numpy(dtype=np.int64), fallback)


Partitioner = Callable[[pd.Series, "pd.Series | None", int], np.ndarray]

#: Partition mode name → function; see :func:`partitioner`.
PARTITIONERS: dict[str, Partitioner] = {"hash": hash_banks, "region": region_banks}


def partitioner(name: str) -> Partitioner:
    """Resolve a partition mode name; an unknown name lists the valid ones."""
    try:
        return PARTITIONERS[name]
    except KeyError:
        raise ValueError(f"unknown partition mode {name!r}; choose one of {sorted(PARTITIONERS)}") from None

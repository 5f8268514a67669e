"""The anomaly stage's per-replica caches: L'/T' feature rows by noise key, which stored q_t is fresh, and the
challenger's q_t while one shadows.

:class:`CachedFeatures` computes each transaction's private location/time rows
once instead of once per graph snapshot they appear in. :class:`FreshCache`
says whether the ``q_t`` in a cardholder's stored state was written by this
process with the current model at the state's current version; only then may
:class:`fedfraud.serving.anomaly_stage.AnomalyStage` reuse it as q_{t-1} (otherwise
G_{t-1} is embedded again, so a model swap or another replica's write never
mixes embeddings of two models). A second :class:`FreshCache` keeps the shadowing challenger's own q_t per
cardholder (it is never stored), so a shadow embeds G_t alone, as the champion does, instead of G_{t-1} too.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from fedfraud.feature_store.cardholder import PreparedBatch
from fedfraud.feature_store.privacy import PrivateFeaturizer

__all__ = ["CachedFeatures", "FreshCache"]


class _RowTable:
    """Feature rows by (noise key, ε) in one float32 matrix, the oldest overwritten first (a ring, FIFO).

    One fancy-indexed gather per lookup instead of stacking a Python list of
    row arrays: the lookup of a micro-batch's ~1,000 node and edge rows took ~3× longer with ``np.stack``.
    The matrix grows by doubling up to ``capacity`` rows. Storing a pair again (a redelivered transaction's
    rows, seeded anew) makes it the newest.
    """

    def __init__(self, capacity: int, dim: int) -> None:
        self.capacity = capacity
        self._rows = np.zeros((min(capacity, 4096), dim), dtype=np.float32)
        self._slot: dict[tuple[int, float], int] = {}
        self._owner: list[tuple[int, float] | None] = []  # slot → the pair stored there
        self._next = 0  # slots written so far; the ring position is this modulo capacity

    def __len__(self) -> int:
        return len(self._slot)

    def put(self, pairs: list[tuple[int, float]], rows: np.ndarray) -> None:
        """Store ``rows[i]`` under ``pairs[i]``, evicting the oldest rows once the table is full."""
        for pair, row in zip(pairs, rows, strict=True):
            slot = self._next % self.capacity
            self._next += 1
            if slot == len(self._owner):  # still filling
                if slot == len(self._rows):
                    grown = np.zeros((min(self.capacity, 2 * len(self._rows)), self._rows.shape[1]), np.float32)
                    grown[: len(self._rows)] = self._rows
                    self._rows = grown
                self._owner.append(pair)
            else:
                old = self._owner[slot]
                if old is not None and self._slot.get(old) == slot:
                    del self._slot[old]
                self._owner[slot] = pair
            self._rows[slot] = row
            self._slot[pair] = slot

    def rows(self, pairs: list[tuple[int, float]], compute: Any) -> np.ndarray:
        """The rows of ``pairs``, ``[len(pairs), dim]``; misses come from ``compute(positions)`` (the first
        position of each missing pair: one repeated in the call is computed and stored once) and are stored after
        the hits are gathered, so a miss can never evict a row this call returns.
        """
        get = self._slot.get
        slots = [get(pair) for pair in pairs]
        miss = [i for i, s in enumerate(slots) if s is None]
        if not miss:
            return self._rows[slots]
        out = np.empty((len(pairs), self._rows.shape[1]), dtype=np.float32)
        hit = [i for i, s in enumerate(slots) if s is not None]
        if hit:
            out[hit] = self._rows[[slots[i] for i in hit]]
        first: dict[tuple[int, float], int] = {}  # missing pair → its first position in this call
        for i in miss:
            first.setdefault(pairs[i], i)
        fresh = np.asarray(compute(np.asarray(list(first.values()), dtype=np.int64)), dtype=np.float32)
        row = {pair: j for j, pair in enumerate(first)}
        out[miss] = fresh[[row[pairs[i]] for i in miss]]
        self.put(list(first), fresh)
        return out


class CachedFeatures:
    """A :class:`fedfraud.feature_store.egograph.FeatureSource` that remembers L'/T' rows by noise key.

    A node carries the noise key of the transaction that created it and an edge
    the key of the transaction that arrived, and L'/T' are pure functions of
    (values, key, ε), so each row is computed once (vectorised, in
    ``prepare_batch``) instead of once per graph snapshot it appears in. Misses
    (rows from before this process started) fall back to the featurizer.
    """

    def __init__(self, featurizer: PrivateFeaturizer, capacity: int = 100_000) -> None:
        self.encoder_cfg = featurizer.encoder_cfg
        self._featurizer = featurizer
        self.capacity = capacity
        self._loc = _RowTable(capacity, self.encoder_cfg.dim)
        self._time = _RowTable(capacity, self.encoder_cfg.dim)

    def seed(self, batch: PreparedBatch) -> None:
        """Remember the rows ``prepare_batch`` already computed."""
        f = batch.features
        pairs = list(zip(list(batch.key), np.asarray(f.epsilon, dtype=np.float64).tolist(), strict=True))
        self._loc.put(pairs, f.location)
        self._time.put(pairs, f.time)

    @staticmethod
    def _pairs(keys: np.ndarray, eps: np.ndarray | float) -> list[tuple[int, float]]:
        ids = keys.tolist()  # python ints, as seed() stores them
        if np.ndim(eps):  # collate_views' case: one budget per row (each graph's, repeated over its rows)
            per_row = np.broadcast_to(np.asarray(eps, dtype=np.float64), (len(ids),)).tolist()
            return list(zip(ids, per_row, strict=True))
        e = float(eps)  # to_data's case: one budget per graph
        return [(k, e) for k in ids]

    def location(self, lat: np.ndarray, lon: np.ndarray, keys: np.ndarray, eps: np.ndarray | float) -> np.ndarray:
        def compute(idx: np.ndarray) -> np.ndarray:
            e = eps if np.ndim(eps) == 0 else np.asarray(eps)[idx]
            return self._featurizer.location(lat[idx], lon[idx], keys[idx], e)

        return self._loc.rows(self._pairs(keys, eps), compute)

    def time(self, ts: np.ndarray, keys: np.ndarray, eps: np.ndarray | float) -> np.ndarray:
        def compute(idx: np.ndarray) -> np.ndarray:
            e = eps if np.ndim(eps) == 0 else np.asarray(eps)[idx]
            return self._featurizer.time(ts[idx], keys[idx], e)

        return self._time.rows(self._pairs(keys, eps), compute)


class FreshCache:
    """cardholder → (state version, model tag) of the q_t this process wrote; bounded LRU.

    With ``q`` given to :meth:`put`, it also keeps that q_t (the challenger's, which no store holds:
    :meth:`q` returns it while the state is at that version and the challenger is the same model).
    """

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self._d: OrderedDict[str, tuple[int, str, np.ndarray | None]] = OrderedDict()

    def valid(self, holder: str, version: int, tag: str) -> bool:
        got = self._d.get(holder)
        return got is not None and got[:2] == (version, tag)

    def q(self, holder: str, version: int, tag: str) -> np.ndarray | None:
        """The q_t kept with (``version``, ``tag``), None when another (or none) is kept."""
        got = self._d.get(holder)
        return got[2] if got is not None and got[:2] == (version, tag) else None

    def put(self, holder: str, version: int, tag: str, q: np.ndarray | None = None) -> None:
        """Remember ``holder``'s q_t at (``version``, ``tag``); a given ``q`` is copied, so a row of a batch's
        matrix does not keep the whole matrix alive.
        """
        self._d[holder] = (version, tag, None if q is None else np.array(q, copy=True))
        self._d.move_to_end(holder)
        if len(self._d) > self.capacity:
            self._d.popitem(last=False)

    def clear(self) -> None:
        """Forget everything (a challenger that stops or changes leaves nothing behind)."""
        self._d.clear()

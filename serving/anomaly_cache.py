"""The anomaly stage's two per-replica caches: L'/T' feature rows by noise key, and which stored q_t is fresh.

:class:`CachedFeatures` computes each transaction's private location/time rows
once instead of once per graph snapshot they appear in. :class:`FreshCache`
says whether the ``q_t`` in a cardholder's stored state was written by this
process with the current model at the state's current version; only then may
:class:`fedfraud.serving.anomaly_stage.AnomalyStage` reuse it as q_{t-1} (otherwise
G_{t-1} is embedded again, so a model swap or another replica's write never
mixes embeddings of two models).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from fedfraud.feature_store.cardholder import PreparedBatch
from fedfraud.feature_store.privacy import PrivateFeaturizer

__all__ = ["CachedFeatures", "FreshCache"]


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
        self._loc: OrderedDict[tuple[int, float], np.ndarray] = OrderedDict()
        self._time: OrderedDict[tuple[int, float], np.ndarray] = OrderedDict()

    def seed(self, batch: PreparedBatch) -> None:
        """Remember the rows ``prepare_batch`` already computed."""
        f = batch.features
        for i, key in enumerate(batch.key):
            k = (key, float(f.epsilon[i]))
            self._loc[k] = f.location[i]
            self._time[k] = f.time[i]
        for table in (self._loc, self._time):
            while len(table) > self.capacity:
                table.popitem(last=False)

    def _rows(self, table: OrderedDict[tuple[int, float], np.ndarray], keys: np.ndarray, eps: np.ndarray | float,
              compute: Any) -> np.ndarray:
        ids = keys.tolist()  # python ints, as seed() stores them
        if np.ndim(eps):  # collate_views' case: one budget per row (each graph's, repeated over its rows)
            per_row = np.broadcast_to(np.asarray(eps, dtype=np.float64), (len(ids),)).tolist()
            pairs = list(zip(ids, per_row, strict=True))
        else:  # to_data's case: one budget per graph
            e = float(eps)
            pairs = [(k, e) for k in ids]
        get = table.get
        hits = [get(pair) for pair in pairs]
        miss = [i for i, h in enumerate(hits) if h is None]
        if miss:
            fresh = compute(np.asarray(miss, dtype=np.int64))
            for j, i in enumerate(miss):
                hits[i] = table[pairs[i]] = fresh[j]
        return np.stack(hits) if hits else np.zeros((0, self.encoder_cfg.dim), dtype=np.float32)

    def location(self, lat: np.ndarray, lon: np.ndarray, keys: np.ndarray, eps: np.ndarray | float) -> np.ndarray:
        def compute(idx: np.ndarray | None) -> np.ndarray:
            sel = slice(None) if idx is None else idx
            e = eps if np.ndim(eps) == 0 else np.asarray(eps)[sel]
            return self._featurizer.location(lat[sel], lon[sel], keys[sel], e)

        return self._rows(self._loc, keys, eps, compute)

    def time(self, ts: np.ndarray, keys: np.ndarray, eps: np.ndarray | float) -> np.ndarray:
        def compute(idx: np.ndarray | None) -> np.ndarray:
            sel = slice(None) if idx is None else idx
            e = eps if np.ndim(eps) == 0 else np.asarray(eps)[sel]
            return self._featurizer.time(ts[sel], keys[sel], e)

        return self._rows(self._time, keys, eps, compute)


class FreshCache:
    """cardholder → (state version, model tag) of the q_t this process wrote; bounded LRU."""

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self._d: OrderedDict[str, tuple[int, str]] = OrderedDict()

    def valid(self, holder: str, version: int, tag: str) -> bool:
        return self._d.get(holder) == (version, tag)

    def put(self, holder: str, version: int, tag: str) -> None:
        self._d[holder] = (version, tag)
        self._d.move_to_end(holder)
        if len(self._d) > self.capacity:
            self._d.popitem(last=False)

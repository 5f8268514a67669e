"""Fraud features from what a bank holds after the privacy mechanism, one code path offline and online.

A bank keeps, per cardholder, a small serialisable :class:`FraudFeatureState`
and calls :meth:`FraudFeatureState.update` once per transaction: it returns
the feature row of that transaction (computed from the history *before* it)
and folds the transaction into the state. Serving calls it per message;
training (:func:`build_features`) replays each cardholder's history through
the very same method, so offline and online features cannot drift.

Inputs are only what the bank has after :mod:`fedfraud.feature_store.privacy`: the
bank's own amount, MCC and timestamp, the merchant bucket, the noised
location L' and time T' embeddings, and the federated anomaly score. Raw
coordinates never enter a feature; distances are computed between noised
embeddings.

Features (``score >= threshold`` means fraud; NaN means "no history yet",
which XGBoost routes with its learned default direction):

==========================  ====================================================
amount, log_amount          the charge
mcc_code                    stable hash of the MCC / Sparkov category
hour_utc                    hour of day (UTC; the bank's clock)
n_prior                     transactions seen before this one
log_gap_s                   log1p(seconds since the previous transaction)
tx_count_<w>, amount_<w>    count and sum of amounts in the rolling window w,
                            including this transaction (1h / 24h / 7d default)
amount_log_z                z-score of log1p(amount) against the cardholder
amount_to_mean              amount / (mean past amount + 1)
loc_dist_mean               cosine distance of L' to the cardholder's mean L'
loc_dist_prev               cosine distance of L' to the previous L'
time_novelty                cosine distance of T' to the cardholder's mean T'
merchant_new                1 if the merchant bucket was not visited before
merchant_visits             earlier visits to this merchant bucket
prev_mcc_code               mcc_code of the cardholder's previous transaction
mcc_transition_surprise     −log P(category | previous category) from the bank's
                            :class:`CategoryTransitions` (fitted on its training
                            rows, shipped with the fraud model); NaN without one
amount_to_prev              amount / (previous amount + 1)
anomaly_score               federated AS = 1 − f(q_{t−1}, q_t); NaN if unknown
==========================  ====================================================

The three previous-transaction columns (``PREVIOUS_FEATURES``; time since the
previous transaction is ``log_gap_s``) are there when
``FraudConfig.previous_transaction_features`` is on; a model trained before
they existed reads the row without them (its registry config says so).

Order: the state applies transactions in arrival order. Training replays
each cardholder in (timestamp, transaction_id) order, which is what serving
sees when events arrive in order; a late event is still handled
deterministically (its gap is 0 and the clock does not go back).
"""

from __future__ import annotations

import json
import logging
import math
import struct
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from fedfraud.training.fraud.config import FraudConfig

if TYPE_CHECKING:  # fedfraud.feature_store.encoders imports torch; simulation workers only need the state
    from fedfraud.feature_store.privacy import PrivateFeatures

__all__ = [
    "ANOMALY_FEATURE",
    "PREVIOUS_FEATURES",
    "TRANSITION_FEATURE",
    "CategoryTransitions",
    "CorruptFraudStateError",
    "FraudFeatureState",
    "FraudFeatures",
    "FraudInput",
    "build_features",
    "feature_names",
    "fit_transitions",
    "fraud_inputs",
    "mcc_code",
    "with_transitions",
]

logger = logging.getLogger(__name__)

#: Name of the stacked anomaly-score column.
ANOMALY_FEATURE = "anomaly_score"
#: −log P(category | previous category) column (needs the bank's :class:`CategoryTransitions`).
TRANSITION_FEATURE = "mcc_transition_surprise"
#: The previous-transaction columns (``FraudConfig.previous_transaction_features``), just before the anomaly score.
PREVIOUS_FEATURES = ("prev_mcc_code", TRANSITION_FEATURE, "amount_to_prev")

_US_PER_S = 1_000_000
_US_PER_HOUR = 3600 * _US_PER_S
_MAGIC = b"FFFS"
_VERSION = 2
# magic, version, dim, count, last_ts_us, amount_sum, log_mean, log_m2, n_velocity, n_merchants
_HEADER_V1 = struct.Struct("<4sBHIqdddHH")
# version 2 appends the previous transaction's mcc code and amount (NaN: none, or a state written by version 1)
_HEADER = struct.Struct("<4sBHIqdddHHdd")
_MAGIC_VERSION = struct.Struct("<4sB")
_CRC = struct.Struct("<I")


class CorruptFraudStateError(ValueError):
    """A serialised :class:`FraudFeatureState` is truncated, has a bad checksum or the wrong dimension."""


def _window_name(seconds: int) -> str:
    if seconds % 86_400 == 0 and seconds >= 7 * 86_400 and (seconds // 86_400) % 7 == 0:
        return f"{seconds // 86_400}d"
    if seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    return f"{seconds}s"


def feature_names(cfg: FraudConfig) -> tuple[str, ...]:
    """Column names of a feature row, in order; the anomaly score is last."""
    velocity = []
    for w in cfg.velocity_windows_s:
        velocity += [f"tx_count_{_window_name(w)}", f"amount_{_window_name(w)}"]
    return (
        "amount", "log_amount", "mcc_code", "hour_utc", "n_prior", "log_gap_s", *velocity,
        "amount_log_z", "amount_to_mean", "loc_dist_mean", "loc_dist_prev", "time_novelty",
        "merchant_new", "merchant_visits", *(PREVIOUS_FEATURES if cfg.previous_transaction_features else ()),
        ANOMALY_FEATURE,
    )


@lru_cache(maxsize=4096)
def mcc_code(mcc: str) -> float:
    """A stable number for an MCC string (CRC-32 mod 65521), identical in every bank and process."""
    return float(zlib.crc32(str(mcc).encode("utf-8")) % 65521)


def _cosine_distance(a: np.ndarray, b: np.ndarray) -> float:
    na = float(np.sqrt(np.dot(a, a)))
    nb = float(np.sqrt(np.dot(b, b)))
    if na == 0.0 or nb == 0.0:
        return 1.0
    return 1.0 - float(np.dot(a, b)) / (na * nb)


class CategoryTransitions:
    """How often a bank's cardholders go from one category to the next: ``−log P(category | previous)``.

    A genuine cardholder tends to repeat a category while fraud breaks the run, so the surprise of a transition
    is a strong base feature. It is counted on the bank's *training* rows only (:func:`fit_transitions`) and
    ships with the fraud model, so serving reads the very table the model was trained with. Add-``alpha``
    smoothing over the categories seen plus one unseen category keeps a new transition finite.

    Args:
        counts: ``(previous mcc_code, mcc_code) → transitions``.
        alpha: additive smoothing.
    """

    __slots__ = ("alpha", "counts", "_totals", "_k")

    def __init__(self, counts: dict[tuple[int, int], int], alpha: float = 1.0) -> None:
        if alpha <= 0:
            raise ValueError("alpha must be > 0")
        self.alpha = float(alpha)
        self.counts = {(int(p), int(c)): int(n) for (p, c), n in counts.items() if n > 0}
        self._totals: dict[int, int] = {}
        for (p, _), n in self.counts.items():
            self._totals[p] = self._totals.get(p, 0) + n
        self._k = len({code for pair in self.counts for code in pair}) + 1

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(pairs={len(self.counts)}, transitions={sum(self._totals.values())})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CategoryTransitions):
            return NotImplemented
        return self.alpha == other.alpha and self.counts == other.counts

    def surprise(self, prev_code: float, code: float) -> float:
        """``−log P(code | prev_code)``; NaN without a previous category. The one implementation of the feature."""
        if math.isnan(prev_code):
            return math.nan
        p = int(prev_code)
        n = self.counts.get((p, int(code)), 0)
        return -math.log((n + self.alpha) / (self._totals.get(p, 0) + self.alpha * self._k))

    def to_json(self) -> dict[str, Any]:
        """JSON-safe form (stored in the fraud model's ``fraud_model.json``)."""
        return {"alpha": self.alpha, "counts": [[p, c, n] for (p, c), n in sorted(self.counts.items())]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CategoryTransitions:
        """Inverse of :meth:`to_json`."""
        return cls({(int(p), int(c)): int(n) for p, c, n in data["counts"]}, float(data["alpha"]))


def _surprise(transitions: CategoryTransitions | None, prev_code: float, code: float) -> float:
    return math.nan if transitions is None else transitions.surprise(prev_code, code)


@dataclass(frozen=True)
class FraudInput:
    """One transaction as the fraud features see it (private features only).

    ``location``/``time`` are the rows of L'/T' (:class:`~fedfraud.feature_store.privacy.PrivateFeatures`);
    ``anomaly_score`` is NaN when no anomaly score exists (first transaction, no model).
    """

    ts_us: int
    amount: float
    mcc: str
    merchant: int
    location: np.ndarray
    time: np.ndarray
    anomaly_score: float = math.nan

    def __post_init__(self) -> None:
        if self.location.ndim != 1 or self.location.shape != self.time.shape:
            raise ValueError("location and time must be 1-d rows of equal size")
        if not math.isfinite(self.amount):
            raise ValueError("amount must be finite")


class FraudFeatureState:
    """Everything the fraud features remember about one cardholder (a few KB, bounded).

    Args:
        cfg: window sizes and bounds.
        dim: embedding size d of L'/T'.
    """

    __slots__ = ("cfg", "dim", "count", "last_ts_us", "amount_sum", "log_mean", "log_m2", "loc_sum",
                 "time_sum", "prev_loc", "vel_ts", "vel_amount", "merchants", "prev_mcc", "prev_amount")

    def __init__(self, cfg: FraudConfig, dim: int) -> None:
        if dim < 1:
            raise ValueError("dim must be >= 1")
        self.cfg = cfg
        self.dim = dim
        self.count = 0
        self.last_ts_us = 0
        self.amount_sum = 0.0
        self.log_mean = 0.0
        self.log_m2 = 0.0
        self.loc_sum = np.zeros(dim, dtype=np.float64)
        self.time_sum = np.zeros(dim, dtype=np.float64)
        self.prev_loc = np.zeros(dim, dtype=np.float32)
        self.vel_ts: list[int] = []
        self.vel_amount: list[float] = []
        self.merchants: dict[int, int] = {}
        self.prev_mcc = math.nan  # mcc_code of the previous transaction (NaN: none known)
        self.prev_amount = math.nan

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(count={self.count}, merchants={len(self.merchants)}, dim={self.dim})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FraudFeatureState):
            return NotImplemented
        return self.to_bytes() == other.to_bytes()

    def update(self, tx: FraudInput, transitions: CategoryTransitions | None = None) -> np.ndarray:
        """Feature row of ``tx`` (float32, :func:`feature_names` order), then fold ``tx`` into the state.

        ``transitions``: the bank's category-transition table (the fraud model's), for ``mcc_transition_surprise``.
        """
        if tx.location.shape[0] != self.dim:
            raise ValueError(f"expected embeddings of size {self.dim}, got {tx.location.shape[0]}")
        ts = int(tx.ts_us)
        amount = float(tx.amount)
        log_amount = math.log1p(max(amount, 0.0))
        loc = tx.location.astype(np.float64)
        tim = tx.time.astype(np.float64)
        n = self.count
        nan = math.nan

        # velocity, including this transaction
        self._trim(max(ts, self.last_ts_us))
        velocity: list[float] = []
        for w in self.cfg.velocity_windows_s:
            lo = ts - w * _US_PER_S
            count, total = 1, amount
            for t_e, a_e in zip(self.vel_ts, self.vel_amount, strict=True):
                if t_e > lo:
                    count += 1
                    total += a_e
            velocity += [float(count), total]

        if n:
            std = math.sqrt(self.log_m2 / n) if n > 1 else 0.0
            amount_log_z = (log_amount - self.log_mean) / max(std, 0.1) if n > 1 else nan
            amount_to_mean = amount / (self.amount_sum / n + 1.0)
            gap = math.log1p(max(ts - self.last_ts_us, 0) / _US_PER_S)
            loc_dist_mean = _cosine_distance(loc, self.loc_sum / n)
            loc_dist_prev = _cosine_distance(loc, self.prev_loc.astype(np.float64))
            time_novelty = _cosine_distance(tim, self.time_sum / n)
        else:
            amount_log_z = amount_to_mean = gap = loc_dist_mean = loc_dist_prev = time_novelty = nan
        visits = self.merchants.get(int(tx.merchant), 0)
        code = mcc_code(tx.mcc)
        previous: list[float] = []
        if self.cfg.previous_transaction_features:
            to_prev = nan if math.isnan(self.prev_amount) else amount / (max(self.prev_amount, 0.0) + 1.0)
            previous = [self.prev_mcc, _surprise(transitions, self.prev_mcc, code), to_prev]
        row = np.array(
            [amount, log_amount, code, float((ts // _US_PER_HOUR) % 24), float(n), gap, *velocity,
             amount_log_z, amount_to_mean, loc_dist_mean, loc_dist_prev, time_novelty,
             1.0 if visits == 0 else 0.0, float(visits), *previous, float(tx.anomaly_score)],
            dtype=np.float32,
        )

        # fold in
        self.count = n + 1
        delta = log_amount - self.log_mean
        self.log_mean += delta / self.count
        self.log_m2 += delta * (log_amount - self.log_mean)
        self.amount_sum += amount
        self.loc_sum += loc
        self.time_sum += tim
        self.prev_loc = tx.location.astype(np.float32, copy=True)
        self.prev_mcc, self.prev_amount = code, amount
        self.last_ts_us = max(ts, self.last_ts_us) if n else ts
        self.vel_ts.append(ts)
        self.vel_amount.append(amount)
        if len(self.vel_ts) > self.cfg.max_history:
            del self.vel_ts[0], self.vel_amount[0]
        m = int(tx.merchant)
        self.merchants.pop(m, None)
        self.merchants[m] = visits + 1  # most recently visited last
        if len(self.merchants) > self.cfg.max_merchants:
            del self.merchants[next(iter(self.merchants))]
        return row

    def _trim(self, now_us: int) -> None:
        """Forget velocity entries older than the longest window."""
        lo = now_us - self.cfg.velocity_windows_s[-1] * _US_PER_S
        k = 0
        while k < len(self.vel_ts) and self.vel_ts[k] <= lo:
            k += 1
        if k:
            del self.vel_ts[:k], self.vel_amount[:k]

    # ------------------------------------------------------------------ serialisation
    def to_bytes(self) -> bytes:
        """Compact little-endian encoding with a CRC-32, for the online store."""
        header = _HEADER.pack(_MAGIC, _VERSION, self.dim, self.count, self.last_ts_us, self.amount_sum,
                              self.log_mean, self.log_m2, len(self.vel_ts), len(self.merchants), self.prev_mcc,
                              self.prev_amount)
        body = b"".join([
            self.loc_sum.astype("<f8").tobytes(), self.time_sum.astype("<f8").tobytes(),
            self.prev_loc.astype("<f4").tobytes(), np.asarray(self.vel_ts, dtype="<i8").tobytes(),
            np.asarray(self.vel_amount, dtype="<f8").tobytes(),
            np.fromiter(self.merchants.keys(), dtype="<i8", count=len(self.merchants)).tobytes(),
            np.fromiter(self.merchants.values(), dtype="<u4", count=len(self.merchants)).tobytes(),
        ])
        payload = header + body
        return payload + _CRC.pack(zlib.crc32(payload))

    @classmethod
    def from_bytes(cls, blob: bytes, cfg: FraudConfig, dim: int | None = None) -> FraudFeatureState:
        """Inverse of :meth:`to_bytes`; raises :class:`CorruptFraudStateError` on any inconsistency.

        A version-1 state (written before the previous-transaction features) still loads, its previous
        category and amount unknown (NaN), so a deploy does not empty serving's store.
        """
        if len(blob) < _HEADER_V1.size + _CRC.size:
            raise CorruptFraudStateError("fraud state is truncated")
        payload, (crc,) = blob[: -_CRC.size], _CRC.unpack(blob[-_CRC.size :])
        if zlib.crc32(payload) != crc:
            raise CorruptFraudStateError("fraud state checksum mismatch")
        magic, version = _MAGIC_VERSION.unpack_from(payload)
        if magic != _MAGIC or version not in (1, _VERSION):
            raise CorruptFraudStateError(f"not a fraud state (magic={magic!r}, version={version})")
        header = _HEADER if version == _VERSION else _HEADER_V1
        if len(payload) < header.size:
            raise CorruptFraudStateError("fraud state is truncated")
        _, _, d, count, last_ts, amount_sum, log_mean, log_m2, n_vel, n_m, *previous = header.unpack_from(payload)
        if dim is not None and d != dim:
            raise CorruptFraudStateError(f"fraud state has dim {d}, expected {dim}")
        expected = header.size + d * (8 + 8 + 4) + n_vel * 16 + n_m * 12
        if len(payload) != expected:
            raise CorruptFraudStateError(f"fraud state has {len(payload)} bytes, expected {expected}")
        state = cls(cfg, d)
        state.count, state.last_ts_us = count, last_ts
        state.amount_sum, state.log_mean, state.log_m2 = amount_sum, log_mean, log_m2
        if previous:
            state.prev_mcc, state.prev_amount = previous
        off = header.size

        def take(dtype: str, k: int) -> np.ndarray:
            nonlocal off
            arr = np.frombuffer(payload, dtype=dtype, count=k, offset=off)
            off += arr.nbytes
            return arr

        state.loc_sum = take("<f8", d).astype(np.float64)
        state.time_sum = take("<f8", d).astype(np.float64)
        state.prev_loc = take("<f4", d).astype(np.float32)
        state.vel_ts = take("<i8", n_vel).tolist()
        state.vel_amount = take("<f8", n_vel).tolist()
        keys, visits = take("<i8", n_m).tolist(), take("<u4", n_m).tolist()
        state.merchants = dict(zip(keys, visits, strict=True))
        return state


# ---------------------------------------------------------------------- batch path
@dataclass(frozen=True)
class FraudFeatures:
    """Feature rows of n transactions of one bank (or several, concatenated), in input order.

    Attributes:
        X: float32 ``[n, F]`` in ``names`` order.
        names: feature names (:func:`feature_names`).
        transaction_id: object ``[n]``.
        cardholder: object ``[n]`` keyed pseudonyms.
        label: float32 ``[n]``, 1 fraud / 0 legit / NaN unknown.
        split: object ``[n]`` in {"train", "valid", "test"} (see :mod:`fedfraud.training.fraud.dataset`).
        transitions: the bank's category-transition table ``mcc_transition_surprise`` was computed with
            (the fraud model ships it), None without one.
    """

    X: np.ndarray
    names: tuple[str, ...]
    transaction_id: np.ndarray
    cardholder: np.ndarray
    label: np.ndarray
    split: np.ndarray
    transitions: CategoryTransitions | None = None

    def __post_init__(self) -> None:
        n = self.X.shape[0]
        if self.X.ndim != 2 or self.X.dtype != np.float32 or self.X.shape[1] != len(self.names):
            raise ValueError(f"X must be float32 [n, {len(self.names)}], got {self.X.dtype} {self.X.shape}")
        for name in ("transaction_id", "cardholder", "label", "split"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"FraudFeatures.{name} must have shape ({n},)")
        bad = set(np.unique(self.split).tolist()) - {"train", "valid", "test"}
        if bad:
            raise ValueError(f"unknown split values {sorted(bad)}")

    def __len__(self) -> int:
        return int(self.X.shape[0])

    @property
    def has_labels(self) -> bool:
        """True when every row carries a fraud label (evaluation needs them)."""
        return len(self) > 0 and bool(np.all(np.isfinite(self.label)))

    def subset(self, mask: np.ndarray) -> FraudFeatures:
        """Rows where ``mask`` is true."""
        return FraudFeatures(self.X[mask], self.names, self.transaction_id[mask], self.cardholder[mask],
                             self.label[mask], self.split[mask], self.transitions)

    def of_split(self, *splits: str) -> FraudFeatures:
        return self.subset(np.isin(self.split, splits))

    @staticmethod
    def concat(parts: list[FraudFeatures]) -> FraudFeatures:
        if not parts:
            raise ValueError("nothing to concatenate")
        if len({p.names for p in parts}) != 1:
            raise ValueError("parts have different feature names")
        # banks' parts were computed with their own tables: the pooled rows keep one only if all agree
        same = all(p.transitions == parts[0].transitions for p in parts[1:])
        return FraudFeatures(
            np.concatenate([p.X for p in parts]), parts[0].names,
            np.concatenate([p.transaction_id for p in parts]), np.concatenate([p.cardholder for p in parts]),
            np.concatenate([p.label for p in parts]), np.concatenate([p.split for p in parts]),
            parts[0].transitions if same else None,
        )

    def save(self, path: str) -> None:
        """Write to one ``.npz`` (what a simulated bank's ClientApp loads)."""
        table = {} if self.transitions is None else {"transitions": np.asarray(json.dumps(self.transitions.to_json()))}
        np.savez(path, X=self.X, names=np.asarray(self.names), transaction_id=self.transaction_id.astype(str),
                 cardholder=self.cardholder.astype(str), label=self.label, split=self.split.astype(str), **table)

    @classmethod
    def load(cls, path: str) -> FraudFeatures:
        with np.load(path, allow_pickle=False) as z:
            table = (CategoryTransitions.from_json(json.loads(str(z["transitions"]))) if "transitions" in z.files
                     else None)
            return cls(z["X"], tuple(z["names"].tolist()), z["transaction_id"].astype(object),
                       z["cardholder"].astype(object), z["label"], z["split"].astype(object), table)


def fraud_inputs(frame: pd.DataFrame, private: PrivateFeatures,
                 anomaly_scores: np.ndarray | None = None) -> Iterator[FraudInput]:
    """:class:`FraudInput` of every row of a canonical frame, in order (serving uses it on a micro-batch)."""
    from fedfraud.feature_store.encoders import timestamps_us

    if len(frame) != len(private):
        raise ValueError(f"frame has {len(frame)} rows, private features {len(private)}")
    scores = np.full(len(frame), np.nan) if anomaly_scores is None else np.asarray(anomaly_scores, dtype=np.float64)
    if scores.shape != (len(frame),):
        raise ValueError(f"need one anomaly score per row, got shape {scores.shape}")
    ts = timestamps_us(frame["timestamp"]).tolist()
    amounts = frame["amount"].to_numpy(dtype=np.float64).tolist()
    mccs = frame["mcc"].astype(str).tolist()
    merchants = private.merchant.tolist()
    for i in range(len(frame)):
        yield FraudInput(ts[i], amounts[i], mccs[i], merchants[i], private.location[i], private.time[i],
                         float(scores[i]))


def _replay_order(frame: pd.DataFrame, holders: np.ndarray) -> np.ndarray:
    """Row order in which each cardholder's history is replayed: (cardholder, timestamp, transaction_id)."""
    from fedfraud.feature_store.encoders import timestamps_us

    if not len(frame):
        return np.zeros(0, dtype=np.int64)
    return np.lexsort((frame["transaction_id"].astype(str).to_numpy(), timestamps_us(frame["timestamp"]),
                       np.asarray(holders, dtype=object).astype(str)))


def fit_transitions(frame: pd.DataFrame, cardholders: np.ndarray, rows: np.ndarray,
                    alpha: float = 1.0) -> CategoryTransitions:
    """Count each (previous category → category) step of the ``rows`` (a bank's training rows) in replay order.

    The previous category of a row is that of the cardholder's row replayed just before it, as in
    :meth:`FraudFeatureState.update`; training rows only, so no validation or test cardholder shapes the table.
    """
    rows = np.asarray(rows, dtype=bool)
    if rows.shape != (len(frame),):
        raise ValueError(f"need one row flag per row ({len(frame)}), got shape {rows.shape}")
    order = _replay_order(frame, cardholders)
    codes = np.fromiter((mcc_code(m) for m in frame["mcc"].astype(str)), dtype=np.float64, count=len(frame))[order]
    holders = np.asarray(cardholders, dtype=object).astype(str)[order]
    step = (holders[1:] == holders[:-1]) & rows[order][1:]
    counts = Counter(zip(codes[:-1][step].astype(np.int64).tolist(), codes[1:][step].astype(np.int64).tolist(),
                         strict=True))
    table = CategoryTransitions(dict(counts), alpha)
    logger.debug("category_transitions fitted %s on %d rows", table, int(rows.sum()))
    return table


def with_transitions(X: np.ndarray, names: Sequence[str], transitions: CategoryTransitions | None) -> np.ndarray:
    """A copy of ``X`` with ``mcc_transition_surprise`` recomputed under another table (a challenger model's own),
    from the row's ``prev_mcc_code`` and ``mcc_code`` (a plain copy when the layout has no such column).
    """
    out = np.array(X, dtype=np.float32, copy=True)
    if TRANSITION_FEATURE not in names:
        return out
    prev, code, col = (list(names).index(n) for n in ("prev_mcc_code", "mcc_code", TRANSITION_FEATURE))
    out[:, col] = [_surprise(transitions, float(p), float(c)) for p, c in zip(out[:, prev], out[:, code],
                                                                               strict=True)]
    return out


def build_features(
    frame: pd.DataFrame,
    private: PrivateFeatures,
    cfg: FraudConfig,
    anomaly_scores: np.ndarray | None = None,
    split: np.ndarray | None = None,
    states: dict[str, FraudFeatureState] | None = None,
    progress: bool = False,
    transitions: CategoryTransitions | None = None,
) -> FraudFeatures:
    """Fold each cardholder's history through :meth:`FraudFeatureState.update`; rows come back in frame order.

    Args:
        frame: canonical rows (``timestamp``, ``amount``, ``mcc``, ``transaction_id``, optional ``is_fraud``).
        cfg: windows and bounds of the per-cardholder state.
        private: ``PrivateFeaturizer.transform(frame)`` (same row order).
        anomaly_scores: AS per row (NaN where none); ``None`` leaves the column NaN.
        split: per-row split labels; default all ``"train"``.
        states: per-pseudonym states to continue from; updated in place (this is how serving is warmed).
        progress: show a progress bar.
        transitions: the bank's category-transition table (:func:`fit_transitions` on its training rows, or
            the fraud model's when scoring); None leaves ``mcc_transition_surprise`` NaN.
    """
    n = len(frame)
    names = feature_names(cfg)
    states = {} if states is None else states
    holders = np.asarray(private.cardholder, dtype=object)
    order = _replay_order(frame, holders)
    inputs = list(fraud_inputs(frame, private, anomaly_scores))
    X = np.empty((n, len(names)), dtype=np.float32)
    dim = private.location.shape[1]
    for i in tqdm(order.tolist(), disable=not progress, desc="fraud features", mininterval=2.0):
        key = holders[i]
        state = states.get(key)
        if state is None:
            state = states[key] = FraudFeatureState(cfg, dim)
        X[i] = state.update(inputs[i], transitions)
    if "is_fraud" in frame:
        label = frame["is_fraud"].astype("float32").to_numpy(dtype=np.float32, na_value=np.nan)
    else:
        label = np.full(n, np.nan, dtype=np.float32)
    split_arr = np.full(n, "train", dtype=object) if split is None else np.asarray(split, dtype=object)
    logger.debug("fraud_features rows=%d cardholders=%d", n, len(states))
    return FraudFeatures(X, names, frame["transaction_id"].astype(str).to_numpy(dtype=object), holders, label,
                         split_arr, transitions)

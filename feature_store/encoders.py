"""Location, temporal and merchant embeddings (thesis §4.4.2, DESIGN §3 "Encoders").

All encoders are vectorised numpy functions of raw values that return
``float32`` arrays of shape ``[n, d]`` in ``[-1, 1]`` (Algorithm 3 needs
inputs in that range, hence ``σ = tanh``). Computation is in float64 and the
result is cast once, so one row encoded alone is bit-identical to the same row
encoded inside a large batch: serving (one transaction) and training (a whole
bank) see the same features.

Reading of the thesis formulas (documented choices):

* Location: the thesis writes ``k ∈ {1..d}`` but concatenates ``[sin·s, cos·s]``,
  which would give ``2d`` values. We use ``k = 1..d/2`` so the concatenation is
  exactly ``d``, the same convention as the temporal encoder. ``sin(φ)·s_φ`` is
  read literally as a scalar times the scale vector (not ``sin(φ·s_φ)``).
  Consequence worth knowing: before ``tanh`` both encoders are rank 2 — every
  output is ``tanh([A·s, B·s])`` for two scalars ``A, B`` — so fidelity comes
  from the geometric scale ladder spreading ``A, B`` through the non-linearity.
  ``fedfraud bench features`` measures what this keeps.
* Time: components are hour/24, minute/60, second/60, (day-of-month − 1)/31 and
  (month − 1)/12, in UTC. Day-of-month follows the thesis's "days"; the
  day-of-week cycle is not encoded.
* Merchant: ids are hashed (unkeyed blake2b, so every bank maps the same id to
  the same row without a shared vocabulary) into ``merchant_buckets`` rows of a
  learned table initialised ``N(0, 0.1)``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np
import torch
from torch import nn

from feature_store.config import EncoderConfig

__all__ = [
    "C_EARTH_KM",
    "MerchantEmbedding",
    "encode_location",
    "encode_time",
    "epoch_seconds",
    "timestamps_us",
    "merchant_bucket",
    "merchant_hash",
]

#: Equatorial circumference of the Earth (km) used in s_φ.
C_EARTH_KM = 40_075.0

_SECONDS_PER_DAY = 86_400


def _location_scales(cfg: EncoderConfig) -> tuple[np.ndarray, np.ndarray]:
    k = np.arange(1, cfg.dim // 2 + 1, dtype=np.float64)
    s_phi = (2.0 * np.pi * cfg.phi_max_km / C_EARTH_KM) / 2.0**k
    s_lam = (2.0 * np.pi) / 2.0**k
    return s_phi, s_lam


def _time_scales(cfg: EncoderConfig) -> np.ndarray:
    k = np.arange(1, cfg.dim // 2 + 1, dtype=np.float64)
    return np.sin(2.0 * np.pi * k / cfg.dim) / k


def encode_location(lat_deg: np.ndarray, lon_deg: np.ndarray, cfg: EncoderConfig) -> np.ndarray:
    """Multi-scale, unbounded location embedding ``tanh(l_φ + l_λ)``, shape ``[n, d]``, float32.

    Unbounded (no min/max grid) because a grid fitted to one bank's region would
    leak that region to the federation (thesis §4.4.2).
    """
    phi = np.radians(np.asarray(lat_deg, dtype=np.float64)).reshape(-1, 1)
    lam = np.radians(np.asarray(lon_deg, dtype=np.float64)).reshape(-1, 1)
    if phi.shape != lam.shape:
        raise ValueError(f"lat and lon differ in length: {phi.shape[0]} != {lam.shape[0]}")
    s_phi, s_lam = _location_scales(cfg)
    first = np.sin(phi) * s_phi + np.sin(lam) * s_lam
    second = np.cos(phi) * s_phi + np.cos(lam) * s_lam
    return np.tanh(np.concatenate([first, second], axis=1)).astype(np.float32)


def timestamps_us(values: object) -> np.ndarray:
    """UTC microseconds since the epoch (int64) of a pandas Series/Index, ``datetime64`` array or datetimes."""
    import pandas as pd

    if isinstance(values, pd.Series | pd.Index):
        idx = pd.DatetimeIndex(values)
    else:
        arr = np.asarray(values)
        if np.issubdtype(arr.dtype, np.datetime64):
            return arr.astype("datetime64[us]").astype(np.int64)
        idx = pd.DatetimeIndex(pd.to_datetime(arr, utc=True))
    if idx.tz is not None:
        idx = idx.tz_convert("UTC").tz_localize(None)
    return idx.as_unit("us").asi8.astype(np.int64)


def epoch_seconds(timestamps: object) -> np.ndarray:
    """POSIX seconds (int64, floored) of datetimes, ``datetime64`` values or numbers (already seconds)."""
    arr = np.asarray(timestamps)
    if np.issubdtype(arr.dtype, np.number):
        return np.floor(arr.astype(np.float64)).astype(np.int64)
    return np.floor_divide(timestamps_us(timestamps), 1_000_000)


def _calendar(secs: np.ndarray) -> tuple[np.ndarray, ...]:
    """UTC (hour, minute, second, day-of-month − 1, month − 1) of POSIX seconds, vectorised."""
    days = np.floor_divide(secs, _SECONDS_PER_DAY)
    rem = secs - days * _SECONDS_PER_DAY
    hour, rem = np.divmod(rem, 3600)
    minute, second = np.divmod(rem, 60)
    # civil-from-days (H. Hinnant), valid for the proleptic Gregorian calendar
    z = days + 719_468
    era = np.floor_divide(z, 146_097)
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5  # 0-based day of month
    month = np.where(mp < 10, mp + 2, mp - 10)  # 0-based month
    return hour, minute, second, day, month


#: Periods N_c of the temporal components, in the order returned by ``_calendar``.
_PERIODS = (24.0, 60.0, 60.0, 31.0, 12.0)


def encode_time(epoch_secs: np.ndarray, cfg: EncoderConfig) -> np.ndarray:
    """Cyclical temporal embedding ``tanh(Σ_c τ_c)`` of POSIX seconds (UTC), shape ``[n, d]``, float32.

    Dense and continuous instead of one-hot calendar features, which the thesis
    shows leak more in federated training.
    """
    secs = epoch_seconds(epoch_secs).reshape(-1)
    s = _time_scales(cfg)
    sin_sum = np.zeros(secs.shape[0], dtype=np.float64)
    cos_sum = np.zeros(secs.shape[0], dtype=np.float64)
    for value, period in zip(_calendar(secs), _PERIODS, strict=True):
        angle = 2.0 * np.pi * value.astype(np.float64) / period
        sin_sum += np.sin(angle)
        cos_sum += np.cos(angle)
    out = np.concatenate([sin_sum[:, None] * s, cos_sum[:, None] * s], axis=1)
    return np.tanh(out).astype(np.float32)


def merchant_hash(merchant_ids: Iterable[str]) -> np.ndarray:
    """Stable unkeyed 64-bit hash (blake2b) of merchant ids, uint64; identical at every bank."""
    return np.fromiter(
        (int.from_bytes(hashlib.blake2b(str(m).encode(), digest_size=8).digest(), "little") for m in merchant_ids),
        dtype=np.uint64,
    )


def merchant_bucket(merchant_ids: Iterable[str], cfg: EncoderConfig) -> np.ndarray:
    """Row of each merchant id in the merchant lookup table (int64), ``merchant_hash % buckets``."""
    return (merchant_hash(merchant_ids) % np.uint64(cfg.merchant_buckets)).astype(np.int64)


class MerchantEmbedding(nn.Module):
    """Learned merchant lookup table ``M ∈ R^{buckets×d}``, initialised ``N(0, 0.1)`` (thesis §4.4.2)."""

    def __init__(self, buckets: int, dim: int, std: float = 0.1) -> None:
        super().__init__()
        self.buckets = buckets
        self.dim = dim
        self.std = std
        self.weight = nn.Parameter(torch.empty(buckets, dim))
        self.reset_parameters()

    @classmethod
    def from_config(cls, cfg: EncoderConfig) -> MerchantEmbedding:
        """Table sized by ``cfg.merchant_buckets × cfg.dim``."""
        return cls(cfg.merchant_buckets, cfg.dim)

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, mean=0.0, std=self.std)

    def forward(self, bucket: torch.Tensor) -> torch.Tensor:
        """Rows of the table for bucket indices (any shape) → ``[..., d]``."""
        return nn.functional.embedding(bucket, self.weight)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.buckets}, {self.dim}, std={self.std})"

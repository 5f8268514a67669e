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
* ``variant="multiscale"`` (:class:`EncoderConfig`) is the Space2Vec-style
  reading of [Mea20] the thesis builds on, with the scales as *frequencies
  inside* sin/cos, so the embedding has full rank and its geometry tracks the
  real one. Location: the 3-D unit vector ``u`` of (φ, λ) is projected on the
  six axes of an icosahedron (a tight frame, so small displacements map to the
  embedding isotropically and direction is kept) and each projection is
  encoded as ``[sin(ω_s a·u), cos(ω_s a·u)]`` at geometric frequencies whose
  wavelengths run from the Earth's circumference down to 10 km, finer scales
  with smaller amplitudes (``_LOCATION_DECAY``). Fixed constants, not fitted
  to any bank's data, so it stays "unbounded" in the thesis's sense. Time:
  each calendar component (second of minute, minute of hour, hour of day, day
  of month, month of year) is a *continuous* phase ``f_c`` in [0, 1) encoded
  with its own harmonics ``[sin(2πh·f_c), cos(2πh·f_c)]``, concatenated rather
  than summed, covering periods from seconds to a year; harmonics faster than
  hourly are down-weighted (``_TIME_DECAY``). Values are sin/cos times
  amplitudes ≤ 1, already in [-1, 1], so no ``tanh``. Like the thesis's, the
  time embedding is periodic in the year.
* Merchant: ids are hashed (blake2b keyed with the federation's key, so every
  bank maps the same id to the same row without a shared vocabulary, and the
  server, which lacks the key, cannot map rows back to merchants) into
  ``merchant_buckets`` rows of a learned table initialised ``N(0, 0.1)``.
"""

from __future__ import annotations

import hashlib
from typing import Any
from collections.abc import Iterable

import numpy as np

from fedfraud.feature_store.geo import EARTH_RADIUS_KM
import torch
from torch import nn

from fedfraud.feature_store.config import EncoderConfig

__all__ = [
    "C_EARTH_KM",
    "MerchantEmbedding",
    "encode_location",
    "encode_location_torch",
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


#: Axes of a regular icosahedron (unit vectors, one per antipodal vertex pair): the projection directions
#: of the multiscale location encoder. Their frame operator is 2·I, so no direction on the sphere is favoured.
_GOLDEN = (1.0 + 5.0**0.5) / 2.0
_ICOSAHEDRON_AXES = np.array(
    [[0.0, 1.0, _GOLDEN], [0.0, 1.0, -_GOLDEN], [1.0, _GOLDEN, 0.0],
     [1.0, -_GOLDEN, 0.0], [_GOLDEN, 0.0, 1.0], [-_GOLDEN, 0.0, 1.0]],
    dtype=np.float64,
) / np.sqrt(1.0 + _GOLDEN**2)  # fmt: skip
#: Longest and shortest wavelength (km along the surface) of the multiscale location encoder: the
#: lowest frequency varies monotonically across the globe, the highest resolves a few km.
_LOCATION_WAVELENGTH_KM = (40_000.0, 10.0)
#: Amplitude of a multiscale location pair is ``(ω / ω_min) ** -0.5``: finer scales weigh less, so the squared
#: embedding distance grows about linearly with distance instead of saturating after a few km, and saturated fine
#: scales do not scramble direction (measured: 0 gives geodesic Pearson ≈ 0.5, 1 drowns ≤ 500 km pairs in noise).
_LOCATION_DECAY = 0.5
#: Periods (s) of the multiscale time phases, in the order of ``_calendar_phases`` (month and year on average).
_PHASE_PERIODS_S = np.array([60.0, 3600.0, 86_400.0, 30.436875 * 86_400, 365.2425 * 86_400])
#: Time harmonics faster than one per hour get amplitude ``(f · 1 h) ** -0.3``, so the many saturated
#: second/minute harmonics do not swamp the hour-to-day ones while sub-minute changes stay above the noise.
_TIME_DECAY_REF_S, _TIME_DECAY = 3600.0, 0.3


def _location_frequencies(dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(axis ``[d/2, 3]``, angular frequency per unit chord ``[d/2]``) of each multiscale sin/cos pair.

    Pair k uses axis ``k mod 6`` at scale ``k div 6``; scales are geometric between the two wavelengths.
    """
    pairs = dim // 2
    n_axes = _ICOSAHEDRON_AXES.shape[0]
    scale = np.arange(pairs) // n_axes
    top = max(int(scale[-1]), 1)
    longest, shortest = _LOCATION_WAVELENGTH_KM
    omega = 2.0 * np.pi * EARTH_RADIUS_KM / (longest * (shortest / longest) ** (scale / top))
    return _ICOSAHEDRON_AXES[np.arange(pairs) % n_axes], omega


def _location_multiscale(phi: Any, lam: Any, dim: int, xp: Any = np) -> Any:
    """The multiscale encoding of radians ``[n, 1]``; ``xp``: numpy, or torch for a differentiable copy (the
    gradient-inversion bench optimises places through it).
    """
    axes, omega = _location_frequencies(dim)
    if xp is not np:
        axes, omega = xp.as_tensor(axes, dtype=phi.dtype), xp.as_tensor(omega, dtype=phi.dtype)
    cos_phi = xp.cos(phi)
    u = (cos_phi * xp.cos(lam), cos_phi * xp.sin(lam), xp.sin(phi))
    # elementwise rather than a matmul, so a row gives the same bits alone or in a batch
    angle = (u[0] * axes[:, 0] + u[1] * axes[:, 1] + u[2] * axes[:, 2]) * omega
    amplitude = (omega / omega[0]) ** -_LOCATION_DECAY
    return xp.concatenate([xp.sin(angle) * amplitude, xp.cos(angle) * amplitude], axis=1)


def encode_location_torch(lat_deg: Any, lon_deg: Any, cfg: EncoderConfig) -> Any:
    """:func:`encode_location` of torch tensors (``[n]`` degrees), differentiable; the multiscale variant only."""
    if cfg.variant != "multiscale":
        raise ValueError("encode_location_torch implements the multiscale variant only")
    return _location_multiscale(torch.deg2rad(lat_deg).reshape(-1, 1), torch.deg2rad(lon_deg).reshape(-1, 1),
                                cfg.dim, torch)


def encode_location(lat_deg: np.ndarray, lon_deg: np.ndarray, cfg: EncoderConfig) -> np.ndarray:
    """Multi-scale, unbounded location embedding, shape ``[n, d]``, float32 in [-1, 1].

    ``tanh(l_φ + l_λ)`` (``variant="thesis"``) or the Space2Vec-style encoding
    of the module docstring (``"multiscale"``). Unbounded (no min/max grid)
    because a grid fitted to one bank's region would leak that region to the
    federation (thesis §4.4.2).
    """
    phi = np.radians(np.asarray(lat_deg, dtype=np.float64)).reshape(-1, 1)
    lam = np.radians(np.asarray(lon_deg, dtype=np.float64)).reshape(-1, 1)
    if phi.shape != lam.shape:
        raise ValueError(f"lat and lon differ in length: {phi.shape[0]} != {lam.shape[0]}")
    if cfg.variant == "multiscale":
        return _location_multiscale(phi, lam, cfg.dim).astype(np.float32)
    s_phi, s_lam = _location_scales(cfg)
    first = np.sin(phi) * s_phi + np.sin(lam) * s_lam
    second = np.cos(phi) * s_phi + np.cos(lam) * s_lam
    return np.tanh(np.concatenate([first, second], axis=1)).astype(np.float32)


def timestamps_us(values: object) -> np.ndarray:
    """UTC microseconds since the epoch (int64) of a pandas Series/Index, ``datetime64`` array or datetimes."""
    import pandas as pd

    if isinstance(values, pd.Series | pd.Index):
        if isinstance(values.dtype, pd.DatetimeTZDtype) or values.dtype.kind == "M":
            # already datetimes (what decoding and the generators give): the UTC integers themselves, without a
            # DatetimeIndex and its tz conversions (~0.2 ms per call on a micro-batch, twice per batch; issue 42)
            return values.array.as_unit("us").asi8.astype(np.int64)
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
    import pandas as pd

    if isinstance(timestamps, pd.Series | pd.Index) and not pd.api.types.is_numeric_dtype(timestamps.dtype):
        # np.asarray of a tz-aware column would build one Timestamp object per row (slow)
        return np.floor_divide(timestamps_us(timestamps), 1_000_000)
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


def _calendar_phases(secs: np.ndarray) -> tuple[np.ndarray, ...]:
    """Continuous UTC phases in [0, 1): second of minute, minute of hour, hour of day, day of month, month of year.

    Each phase includes the finer components (14:30 is half way through hour
    14), so it moves smoothly with time and wraps without a jump; the month
    phase advances by the actual length of the month.
    """
    month = secs.astype("datetime64[s]").astype("datetime64[M]")
    start = month.astype("datetime64[s]").astype(np.int64)
    length = (month + 1).astype("datetime64[s]").astype(np.int64) - start
    day_of_month = (secs - start) / length
    month_of_year = (month.astype(np.int64) % 12 + day_of_month) / 12.0
    return (secs % 60) / 60.0, (secs % 3600) / 3600.0, (secs % _SECONDS_PER_DAY) / _SECONDS_PER_DAY, \
        day_of_month, month_of_year  # fmt: skip


def _time_multiscale(secs: np.ndarray, dim: int) -> np.ndarray:
    """Pair k encodes phase ``k mod 5`` at harmonic ``k div 5 + 1``: periods from seconds to a year."""
    pairs = dim // 2
    phases = np.stack(_calendar_phases(secs), axis=1)  # [n, 5]
    component = np.arange(pairs) % phases.shape[1]
    harmonic = (np.arange(pairs) // phases.shape[1] + 1).astype(np.float64)
    angle = 2.0 * np.pi * phases[:, component] * harmonic
    amplitude = np.maximum(harmonic * _TIME_DECAY_REF_S / _PHASE_PERIODS_S[component], 1.0) ** -_TIME_DECAY
    return np.concatenate([np.sin(angle) * amplitude, np.cos(angle) * amplitude], axis=1)


def encode_time(epoch_secs: np.ndarray, cfg: EncoderConfig) -> np.ndarray:
    """Cyclical temporal embedding of POSIX seconds (UTC), shape ``[n, d]``, float32 in [-1, 1].

    ``tanh(Σ_c τ_c)`` (``variant="thesis"``) or the per-component harmonics of
    the module docstring (``"multiscale"``). Dense and continuous instead of
    one-hot calendar features, which the thesis shows leak more in federated
    training.
    """
    secs = epoch_seconds(epoch_secs).reshape(-1)
    if cfg.variant == "multiscale":
        return _time_multiscale(secs, cfg.dim).astype(np.float32)
    s = _time_scales(cfg)
    sin_sum = np.zeros(secs.shape[0], dtype=np.float64)
    cos_sum = np.zeros(secs.shape[0], dtype=np.float64)
    for value, period in zip(_calendar(secs), _PERIODS, strict=True):
        angle = 2.0 * np.pi * value.astype(np.float64) / period
        sin_sum += np.sin(angle)
        cos_sum += np.cos(angle)
    out = np.concatenate([sin_sum[:, None] * s, cos_sum[:, None] * s], axis=1)
    return np.tanh(out).astype(np.float32)


def merchant_hash(merchant_ids: Iterable[str], key: bytes | None = None) -> np.ndarray:
    """Stable 64-bit blake2b of merchant ids (uint64), identical at every bank: keyed with the federation's
    ``key`` when given (what the banks use; :func:`fedfraud.feature_store.privacy.federation_key`), else unkeyed.
    """
    if key is None:
        digests = (hashlib.blake2b(str(m).encode(), digest_size=8).digest() for m in merchant_ids)
    else:
        key = key if len(key) <= 64 else hashlib.blake2b(key, digest_size=64).digest()
        digests = (hashlib.blake2b(str(m).encode(), key=key, digest_size=8, person=b"fedfraud-merch").digest()
                   for m in merchant_ids)
    return np.fromiter((int.from_bytes(d, "little") for d in digests), dtype=np.uint64)


def merchant_bucket(merchant_ids: Iterable[str], cfg: EncoderConfig, key: bytes | None = None) -> np.ndarray:
    """Row of each merchant id in the merchant lookup table (int64): ``merchant_hash(ids, key) % buckets``."""
    return (merchant_hash(merchant_ids, key) % np.uint64(cfg.merchant_buckets)).astype(np.int64)


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

"""Feature-level local DP inside a bank: the thesis's private shuffle (Algorithm 3) and a calibrated option.

Two mechanisms (``privacy.mechanism``):

* ``thesis`` (default): Algorithm 3, Gaussian noise of variance δ/ε on the
  embeddings L' and T', then a public permutation. **Not a formal guarantee
  at these scales**: its std (0.003–0.1) is 900–28,000× below a calibrated
  Gaussian mechanism for these embeddings, the permutation seed is public,
  and its μ-GDP figure (:func:`mu_gdp`) assumes a shuffler across users and
  one report per user, neither of which exists here. Kept for comparison
  with the thesis.
* ``calibrated``: noise on the raw inputs before encoding. Each transaction's
  merchant coordinates get planar Laplace noise (geo-indistinguishability,
  Andrés et al. 2013: :func:`planar_laplace`), ε_geo per km per report: two
  places d km apart give output distributions within a factor e^(ε_geo·d).
  Its hour gets k-ary randomized response over 24 hours
  (:func:`randomized_hour`), ε_hour-LDP per report; T' then encodes only
  that hour (minute, second, day and month are not used). A cardholder with
  n transactions makes n reports; by basic composition the whole history is
  (n·ε_geo·d)-geo-indistinguishable and n·ε_hour-LDP for the hours, which for
  an active cardholder is weak. The noise of one transaction is fixed (keyed
  on its id, below), so reading it twice gives nothing more.

Features never leave a bank (only model updates do; those carry
client-level DP, ``fedfraud.training.federated.accountant``), so either mechanism
protects the features only against the bank's own staff and systems.

Reproducible noise. The Gaussian noise added to a transaction's features is a
pure function of (bank secret, transaction_id, channel, coordinate):

1. ``noise key = blake2b(transaction_id, key=bank secret)`` (64 bits);
2. ``z = splitmix64(key + (channel·2^32 + m + 1)·φ)`` — the m-th output of a
   SplitMix64 stream seeded with the key, computed for all rows and
   coordinates at once (counter-based, no Generator per row);
3. Box–Muller turns the two 32-bit halves of ``z`` into the standard normals of
   coordinates ``m`` and ``m + d/2``.

So the features written offline for training and those computed online when
the transaction is scored are bit-identical, while another bank (another
secret) or another transaction gets independent noise. Location and time use
different channels, so their noise is independent too.

Noise scale. Algorithm 3 writes ``N(0, δ/ε)``; we read the second argument as
the **variance** (the usual ``N(μ, σ²)`` notation), i.e. the standard deviation
is ``sqrt(δ/ε)``. With δ = 1e-4 and ε ∈ [0.01, 10] that is a std between 0.003
and 0.1 on features in [-1, 1].

Secrets never leave the bank: only derived values (noise keys, pseudonyms,
per-cardholder ε, noised vectors) are returned, and no output of this module
carries raw coordinates, timestamps or cardholder ids.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any
from pathlib import Path

import numpy as np
import pandas as pd

from fedfraud.core.credentials import new_token, write_secret_file
from fedfraud.core.errors import UserError
from fedfraud.feature_store.config import EncoderConfig, PrivacyConfig
from fedfraud.feature_store.schema import CARD_TOKEN_PREFIX, is_card_token
from fedfraud.feature_store.encoders import encode_location, encode_time, epoch_seconds, merchant_bucket, merchant_hash

__all__ = [
    "CHANNEL_GEO",
    "CHANNEL_HOUR",
    "CHANNEL_LOCATION",
    "CHANNEL_TIME",
    "FEDERATION_KEY_ENV",
    "SECRET_ENV",
    "SIMULATION_SECRET_ENV",
    "PrivateFeatures",
    "PrivateFeaturizer",
    "bank_secret",
    "federation_key",
    "require_secret",
    "shuffle_seed",
    "cardholder_epsilon",
    "gaussian_noise",
    "mu_gdp",
    "noise_keys",
    "per_run_secret",
    "check_feature_mechanism",
    "feature_ldp_card",
    "planar_laplace",
    "private_shuffle",
    "pseudonymize",
    "randomized_hour",
    "shuffle_permutation",
]

logger = logging.getLogger(__name__)

#: Environment variable holding this bank process's secret (production).
SECRET_ENV = "FEDFRAUD_BANK_SECRET"
#: A simulation's one secret (several banks in one process): every bank's secret and the federation key derive
#: from it. ``fedfraud demo`` and the benches draw a random one per run when none is set.
SIMULATION_SECRET_ENV = "FEDFRAUD_SIMULATION_SECRET"
#: The key the banks of one federation share, and the server never holds: it places merchants in table rows.
FEDERATION_KEY_ENV = "FEDFRAUD_FEDERATION_KEY"
#: Noise channels: different channels give independent noise for the same transaction.
CHANNEL_LOCATION = 1
CHANNEL_TIME = 2
CHANNEL_GEO = 3
CHANNEL_HOUR = 4
#: Kilometres per degree of latitude (mean Earth radius 6,371 km).
KM_PER_DEGREE = 2.0 * math.pi * 6371.0 / 360.0

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_TWO_POW_M53 = 2.0**-53
_TWO_POW_M32 = 2.0**-32


def _splitmix64(state: np.ndarray) -> np.ndarray:
    """SplitMix64 output function on a uint64 array (wrapping arithmetic)."""
    z = state.copy()
    z ^= z >> np.uint64(30)
    z *= _MIX1
    z ^= z >> np.uint64(27)
    z *= _MIX2
    z ^= z >> np.uint64(31)
    return z


def _stream(keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """Counter-th output of the SplitMix64 stream seeded by each key: ``[n, len(counters)]`` uint64."""
    with np.errstate(over="ignore"):
        state = keys.reshape(-1, 1) + (counters.astype(np.uint64) + np.uint64(1)) * _GOLDEN
        return _splitmix64(state)


def gaussian_noise(keys: np.ndarray, channel: int, d: int) -> np.ndarray:
    """Standard normal noise ``[n, d]`` (float64), a pure function of (key, channel, coordinate).

    Each SplitMix64 output gives two 32-bit uniforms, Box–Muller turns them into
    the normals of coordinates ``m`` and ``m + ceil(d/2)``.
    """
    keys = np.ascontiguousarray(keys, dtype=np.uint64).reshape(-1)
    half = (d + 1) // 2
    counters = (np.uint64(channel) << np.uint64(32)) + np.arange(half, dtype=np.uint64)
    bits = _stream(keys, counters)
    u1 = ((bits >> np.uint64(32)).astype(np.float64) + 1.0) * _TWO_POW_M32  # (0, 1]: log is finite
    u2 = (bits & np.uint64(0xFFFFFFFF)).astype(np.float64) * _TWO_POW_M32
    radius = np.sqrt(-2.0 * np.log(u1))
    theta = 2.0 * np.pi * u2
    return np.concatenate([radius * np.cos(theta), radius * np.sin(theta)], axis=1)[:, :d]


def uniform_noise(keys: np.ndarray, channel: int, k: int) -> np.ndarray:
    """Uniforms in [0, 1) ``[n, k]`` (53-bit), a pure function of (key, channel, column), as in gaussian_noise."""
    keys = np.ascontiguousarray(keys, dtype=np.uint64).reshape(-1)
    counters = (np.uint64(channel) << np.uint64(32)) + np.arange(k, dtype=np.uint64)
    return (_stream(keys, counters) >> np.uint64(11)).astype(np.float64) * _TWO_POW_M53


def planar_laplace(
    lat: np.ndarray, lon: np.ndarray, keys: np.ndarray, epsilon_per_km: float
) -> tuple[np.ndarray, np.ndarray]:
    """Geo-indistinguishable coordinates: each point moved by planar Laplace noise of ``epsilon_per_km``.

    Polar sampling (Andrés et al. 2013): the displacement's length is
    Gamma(2, 1/ε) km (density ε²·r·e^(−ε·r)) and its bearing uniform, so the
    density of the output is ∝ e^(−ε·‖out − in‖): ε·d-indistinguishable for
    inputs d km apart, per report. Kilometres are mapped to degrees locally
    (equirectangular, exact enough below a few hundred km); latitude is
    clipped to ±90 and longitude wrapped. The randomness is keyed on the
    transaction (channel :data:`CHANNEL_GEO`).
    """
    if not epsilon_per_km > 0:
        raise ValueError(f"epsilon_per_km must be > 0, got {epsilon_per_km}")
    lat = np.asarray(lat, dtype=np.float64).reshape(-1)
    lon = np.asarray(lon, dtype=np.float64).reshape(-1)
    u = uniform_noise(keys, CHANNEL_GEO, 3)
    radius = -(np.log1p(-u[:, 0]) + np.log1p(-u[:, 1])) / epsilon_per_km  # sum of two Exp(ε): Gamma(2, 1/ε)
    bearing = 2.0 * np.pi * u[:, 2]
    dlat = radius * np.cos(bearing) / KM_PER_DEGREE
    dlon = radius * np.sin(bearing) / (KM_PER_DEGREE * np.maximum(np.cos(np.radians(lat)), 1e-6))
    out_lat = np.clip(lat + dlat, -90.0, 90.0)
    out_lon = (lon + dlon + 180.0) % 360.0 - 180.0
    return out_lat, out_lon


def randomized_hour(hour: np.ndarray, keys: np.ndarray, epsilon: float) -> np.ndarray:
    """k-ary randomized response over the 24 hours: the true hour with probability e^ε / (e^ε + 23), else each
    other hour with probability 1 / (e^ε + 23): ε-LDP per report (the likelihood ratio of any output is ≤ e^ε).
    """
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    hour = np.asarray(hour, dtype=np.int64).reshape(-1)
    if ((hour < 0) | (hour > 23)).any():
        raise ValueError("hours must be in 0..23")
    u = uniform_noise(keys, CHANNEL_HOUR, 2)
    keep = u[:, 0] < math.exp(epsilon) / (math.exp(epsilon) + 23.0)
    other = (hour + 1 + np.floor(u[:, 1] * 23.0).astype(np.int64)) % 24
    return np.where(keep, hour, other)


def feature_ldp_card(cfg: PrivacyConfig) -> dict[str, object]:
    """What a model card says about the feature mechanism inside the banks."""
    if cfg.mechanism == "calibrated":
        return {
            "mechanism": "calibrated: planar Laplace (geo-indistinguishability) on the merchant coordinates before "
            "encoding, k-ary randomized response on the hour (T' encodes only that hour)",
            "epsilon_geo_per_km_per_report": cfg.geo_epsilon_per_km,
            "epsilon_hour_per_report": cfg.hour_epsilon,
            "composition": "basic over a cardholder's n reports: n x epsilon_geo x d for places d km apart, "
            "n x epsilon_hour for the hours",
            "where": "inside each bank; features never leave it",
        }
    return {
        "mechanism": "thesis: personalized Gaussian private shuffle (Algorithm 3) on L' and T'",
        "formal_guarantee": "none at these scales (noise std 0.003-0.1, public permutation); see thesis_heuristic",
        "where": "inside each bank; features never leave it",
    }


def check_feature_mechanism(tag: str, privacy: Mapping[str, Any], cfg: PrivacyConfig) -> None:
    """Refuse to score with a model whose card names another feature mechanism than ``cfg``'s.

    L′/T′ (and the fraud features computed from them) differ in distribution
    between ``thesis`` and ``calibrated``, so a model trained under one and fed
    the other scores off-distribution, silently. A card from before the
    mechanism was recorded passes with a warning (those models were trained
    under ``thesis``).
    """
    ldp = privacy.get("feature_ldp")
    named = str(ldp.get("mechanism", "")).split(":", 1)[0].strip() if isinstance(ldp, Mapping) else ""
    if not named:
        logger.warning("%s does not record its feature mechanism; serving computes `%s` features", tag, cfg.mechanism)
    elif named != cfg.mechanism:
        raise UserError(f"{tag} was trained on `{named}` features but privacy.mechanism is `{cfg.mechanism}`: its "
                        f"scores would be off-distribution; set privacy.mechanism={named} or retrain the model")


def shuffle_permutation(seed: int, d: int) -> np.ndarray:
    """The fixed permutation r = perm_s(d) shared by all clients (int64).

    Derived from SplitMix64 rather than a numpy Generator so it cannot change
    with the numpy version: every bank must agree on it forever.
    """
    scores = _stream(np.array([seed & (2**64 - 1)], dtype=np.uint64), np.arange(d, dtype=np.uint64))[0]
    return np.argsort(scores, kind="stable").astype(np.int64)


def _per_coordinate(value: np.ndarray | float, n: int, d: int, name: str) -> np.ndarray:
    """A scalar, per-row ``[n]`` or per-coordinate ``[n, d]`` parameter as ``[1, 1]``, ``[n, 1]`` or ``[n, d]``."""
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim == 0:
        return arr.reshape(1, 1)
    if arr.ndim == 1 and arr.shape[0] == n:
        return arr.reshape(n, 1)
    try:
        return np.broadcast_to(arr, (n, d))
    except ValueError:
        raise ValueError(f"{name} must be a scalar, [n] or [n, d]; got shape {arr.shape} for n={n}, d={d}") from None


def private_shuffle(
    v: np.ndarray,
    epsilon: np.ndarray | float,
    delta: np.ndarray | float,
    keys: np.ndarray,
    permutation: np.ndarray,
    channel: int = CHANNEL_LOCATION,
) -> np.ndarray:
    """Algorithm 3: ``x_j = clip(v_j + N(0, δ_r(j)/ε_r(j)), -1, 1)``, then output ``x[r]``; float32 ``[n, d]``.

    Args:
        v: features in [-1, 1], ``[n, d]``.
        epsilon: per-row ``[n]`` or per-coordinate ``[n, d]`` budgets (> 0).
        delta: scalar, per-row ``[n]`` or ``[n, d]``, in [0, 1]. ``δ/ε`` is the noise *variance*.
        keys: per-row uint64 noise keys (:func:`noise_keys`), ``[n]``.
        permutation: the shared permutation r (:func:`shuffle_permutation`), ``[d]``.
        channel: noise channel, so different features of one row get independent noise.
    """
    v = np.asarray(v, dtype=np.float64)
    if v.ndim != 2:
        raise ValueError(f"v must be [n, d], got shape {v.shape}")
    n, d = v.shape
    perm = np.asarray(permutation, dtype=np.int64)
    if perm.shape != (d,):
        raise ValueError(f"permutation must have length d={d}, got {perm.shape}")
    eps = _per_coordinate(epsilon, n, d, "epsilon")
    if not (eps > 0).all():
        raise ValueError("epsilon must be > 0")
    dlt = _per_coordinate(delta, n, d, "delta")
    if ((dlt < 0) | (dlt > 1)).any():
        raise ValueError("delta must be in [0, 1]")
    std = np.sqrt(dlt / eps)
    if std.shape[1] > 1:  # per-coordinate budgets: noise of x_j uses (ε, δ)_{r(j)}
        std = std[:, perm]
    keys = np.asarray(keys, dtype=np.uint64).reshape(-1)
    if keys.shape[0] != n:
        raise ValueError(f"need one noise key per row: {keys.shape[0]} != {n}")
    x = gaussian_noise(keys, channel, d)
    x *= std
    x += v
    np.clip(x, -1.0, 1.0, out=x)
    return x[:, perm].astype(np.float32)


def _mac_key(secret: bytes) -> bytes:
    """blake2b keys are at most 64 bytes; longer secrets are hashed down."""
    return secret if len(secret) <= 64 else hashlib.blake2b(secret, digest_size=64).digest()


def _simulation_secret(cfg: PrivacyConfig) -> str | None:
    """The simulation secret: ``$FEDFRAUD_SIMULATION_SECRET``, else ``privacy.secret_seed``; None if neither."""
    return os.environ.get(SIMULATION_SECRET_ENV, "").strip() or cfg.secret_seed or None


def require_secret(cfg: PrivacyConfig) -> None:
    """Fail with one line unless this process has a bank secret (production) or a simulation secret.

    Why: pseudonyms, noise keys and the shuffle permutation are keyed with it; a default secret anyone
    can read would let them recompute a card's pseudonym from its number.
    """
    if os.environ.get(SECRET_ENV, "").strip() or _simulation_secret(cfg):
        return
    raise UserError(f"no bank secret: set {SECRET_ENV} (one bank per process, with {FEDERATION_KEY_ENV}) or "
                    f"{SIMULATION_SECRET_ENV} (every simulated bank's secret derives from it)")


def per_run_secret(cfg: PrivacyConfig, out_dir: Path | None = None) -> Path | None:
    """Give a self-contained run (``fedfraud demo``, ``fedfraud bench``) a random simulation secret when
    none is set, and announce it (a warning).

    The secret goes into ``$FEDFRAUD_SIMULATION_SECRET``, so Ray workers and child processes started
    afterwards derive the same bank secrets, and, when ``out_dir`` is given, into a 0600 file there so the
    run's stores can be read again (``FEDFRAUD_SIMULATION_SECRET=$(cat FILE) fedfraud features show ...``).
    Returns that file, or None when a secret was already set (nothing is changed then).
    """
    if os.environ.get(SECRET_ENV, "").strip() or _simulation_secret(cfg):
        return None
    secret = new_token()
    os.environ[SIMULATION_SECRET_ENV] = secret
    path = write_secret_file(Path(out_dir) / "simulation-secret", secret) if out_dir is not None else None
    where = f", saved (0600) in {path}" if path is not None else ""
    logger.warning("no bank secret set: this run uses a random simulation secret%s; its pseudonyms match no "
                   "other run (set %s to keep them)", where, SIMULATION_SECRET_ENV)
    return path


def bank_secret(cfg: PrivacyConfig, bank_id: int) -> bytes:
    """This bank's 32-byte secret.

    ``$FEDFRAUD_BANK_SECRET`` if set (production, one bank per process); else derived from the simulation
    secret (``$FEDFRAUD_SIMULATION_SECRET`` or ``privacy.secret_seed``) and ``bank_id``, so the banks of one
    simulation have different secrets. Neither set: a one-line :class:`UserError` (there is no default).
    """
    env = os.environ.get(SECRET_ENV, "").strip()
    if env:
        return hashlib.blake2b(env.encode(), digest_size=32, person=b"fedfraud-bank").digest()
    require_secret(cfg)
    sim = _simulation_secret(cfg)
    return hashlib.blake2b(f"{sim}:{bank_id}".encode(), digest_size=32, person=b"fedfraud-sim").digest()


def federation_key(cfg: PrivacyConfig) -> bytes:
    """The key every bank of the federation shares and the server does not have:
    ``$FEDFRAUD_FEDERATION_KEY`` if set (production), else derived from the simulation secret.

    Why: the merchant table is trained with sparse updates, so a bank's update changes only the rows its
    batches touched. With the public unkeyed hash the server could map those rows back to merchant ids and
    learn which merchants each bank's customers used; with a key it sees row numbers it cannot invert. The
    shuffle permutation derives from it too (:func:`shuffle_seed`): the banks must agree on it, the server
    must not know it.
    """
    env = os.environ.get(FEDERATION_KEY_ENV, "").strip()
    if env:
        return hashlib.blake2b(env.encode(), digest_size=32, person=b"fedfraud-fedkey").digest()
    if os.environ.get(SECRET_ENV, "").strip():  # a production bank must not fall back to a simulation key
        raise UserError(f"{SECRET_ENV} is set but {FEDERATION_KEY_ENV} is not: set the key the federation's banks "
                        f"share (the server must not have it), or unset both and set {SIMULATION_SECRET_ENV}")
    require_secret(cfg)
    sim = _simulation_secret(cfg)
    return hashlib.blake2b(f"{sim}:federation".encode(), digest_size=32, person=b"fedfraud-sim").digest()


def shuffle_seed(cfg: PrivacyConfig) -> int:
    """The private shuffle's permutation seed: shared by the federation's banks, derived from its key."""
    digest = hashlib.blake2b(federation_key(cfg), digest_size=8, person=b"fedfraud-perm").digest()
    return int.from_bytes(digest, "little") >> 1


def _keyed_u64(values: Iterable[object], secret: bytes, person: bytes) -> np.ndarray:
    key = _mac_key(secret)
    return np.fromiter(
        (
            int.from_bytes(hashlib.blake2b(str(v).encode(), key=key, digest_size=8, person=person).digest(), "little")
            for v in values
        ),
        dtype=np.uint64,
    )


def noise_keys(transaction_ids: Iterable[str], secret: bytes) -> np.ndarray:
    """Per-transaction 64-bit noise keys (uint64), keyed hash of the transaction id."""
    return _keyed_u64(transaction_ids, secret, b"noise")


def cardholder_epsilon(cardholder_ids: Iterable[str], secret: bytes, cfg: PrivacyConfig) -> np.ndarray:
    """Personal budget ε_i ~ U(ε_min, ε_max), a deterministic function of the secret and the cardholder."""
    bits = _keyed_u64(cardholder_ids, secret, b"epsilon") >> np.uint64(11)
    unit = bits.astype(np.float64) * _TWO_POW_M53
    return cfg.epsilon_min + (cfg.epsilon_max - cfg.epsilon_min) * unit


def pseudonymize(cardholder_ids: Iterable[str], secret: bytes) -> list[str]:
    """The bank's card tokens (``ct_`` + keyed 128-bit hash, hex), so no card number is stored or streamed.

    A value that already is a card token passes through unchanged: the stream carries tokens (the bank's
    producer tokenizes), the bank's raw files carry card numbers, and both must give the same token.
    """
    key = _mac_key(secret)
    return [
        c if is_card_token(c) else CARD_TOKEN_PREFIX
        + hashlib.blake2b(str(c).encode(), key=key, digest_size=16, person=b"pseudonym").hexdigest()
        for c in map(str, cardholder_ids)
    ]


def mu_gdp(epsilon: np.ndarray | Iterable[float], delta: np.ndarray | float) -> float:
    """μ of the μ-GDP guarantee of shuffling n (ε_i, δ_i) reports (thesis §4.4.2, after [CCG24]).

    ``μ = sqrt(2 / (Σ q_i − max q_i))`` with ``q_i = (1 − δ_i) / (1 + e^{ε_i})``; smaller is more private.
    With one report (n = 1) shuffling hides nothing and μ is ``inf``; no reports at all is an error.
    """
    eps = np.asarray(list(epsilon) if not isinstance(epsilon, np.ndarray) else epsilon, dtype=np.float64).ravel()
    if eps.size == 0:
        raise ValueError("mu_gdp needs at least one (epsilon, delta) pair")
    if np.any(eps < 0) or not np.all(np.isfinite(eps)):
        raise ValueError("epsilon must be finite and >= 0")
    dlt = np.broadcast_to(np.asarray(delta, dtype=np.float64).ravel() if np.ndim(delta) else delta, eps.shape)
    if np.any((dlt < 0) | (dlt > 1)):
        raise ValueError("delta must be in [0, 1]")
    q = (1.0 - dlt) * np.exp(-np.logaddexp(0.0, eps))  # (1-δ)/(1+e^ε) without overflow
    denom = float(q.sum() - q.max())
    if eps.size == 1 or denom <= 0.0:
        return math.inf
    return math.sqrt(2.0 / denom)


@dataclass(frozen=True)
class PrivateFeatures:
    """Private features of n transactions, in input order; the only shape in which they leave the bank.

    Attributes:
        keys: uint64 ``[n]`` per-transaction noise keys (keyed hash of transaction_id).
        epsilon: float64 ``[n]`` the cardholder's personal budget used for the row.
        location: float32 ``[n, d]`` noised, shuffled location embedding L'.
        time: float32 ``[n, d]`` noised, shuffled temporal embedding T'.
        merchant: int64 ``[n]`` merchant bucket (row of the merchant table M).
        cardholder: object ``[n]`` keyed pseudonym of the cardholder.
    """

    keys: np.ndarray
    epsilon: np.ndarray
    location: np.ndarray
    time: np.ndarray
    merchant: np.ndarray
    cardholder: np.ndarray

    def __post_init__(self) -> None:
        n = self.keys.shape[0]
        expected = {
            "keys": (np.uint64, 1),
            "epsilon": (np.float64, 1),
            "location": (np.float32, 2),
            "time": (np.float32, 2),
            "merchant": (np.int64, 1),
            "cardholder": (np.object_, 1),
        }
        for f in fields(self):
            arr = getattr(self, f.name)
            dtype, ndim = expected[f.name]
            if not isinstance(arr, np.ndarray) or arr.dtype != dtype or arr.ndim != ndim:
                raise ValueError(f"PrivateFeatures.{f.name} must be a {ndim}-d {np.dtype(dtype)} array")
            if arr.shape[0] != n:
                raise ValueError(f"PrivateFeatures.{f.name} has {arr.shape[0]} rows, expected {n}")
        if self.location.shape != self.time.shape:
            raise ValueError(f"location {self.location.shape} and time {self.time.shape} differ in shape")

    def __len__(self) -> int:
        return int(self.keys.shape[0])


class PrivateFeaturizer:
    """One bank's private feature pipeline: encoders + Algorithm 3 with the bank's secret.

    ``transform`` serves batch (training, Feast offline); ``location``/``time``
    serve the incremental path (serving, ego-graph snapshots) and give the
    same bits for the same transaction.
    """

    def __init__(self, encoder_cfg: EncoderConfig, privacy_cfg: PrivacyConfig, secret: bytes) -> None:
        if not secret:
            raise ValueError("secret must be non-empty")
        self.encoder_cfg = encoder_cfg
        self.privacy_cfg = privacy_cfg
        self._secret = bytes(secret)
        self._merchant_key = federation_key(privacy_cfg)
        self.permutation = shuffle_permutation(shuffle_seed(privacy_cfg), encoder_cfg.dim)

    @classmethod
    def for_bank(cls, encoder_cfg: EncoderConfig, privacy_cfg: PrivacyConfig, bank_id: int) -> PrivateFeaturizer:
        """Featurizer with :func:`bank_secret` of ``bank_id``."""
        return cls(encoder_cfg, privacy_cfg, bank_secret(privacy_cfg, bank_id))

    @property
    def fingerprint(self) -> str:
        """A one-way digest of this featurizer's keys: part of a cache key, so features cached under one secret
        are never reused under another (the secret itself is in no cache key, file name or log).
        """
        return hashlib.blake2b(self._secret + self._merchant_key, digest_size=8, person=b"fedfraud-cache").hexdigest()

    def __repr__(self) -> str:  # never show the secret
        return f"{self.__class__.__name__}(dim={self.encoder_cfg.dim}, delta={self.privacy_cfg.delta})"

    @property
    def dim(self) -> int:
        return self.encoder_cfg.dim

    def noise_keys(self, transaction_ids: Iterable[str]) -> np.ndarray:
        return noise_keys(transaction_ids, self._secret)

    def epsilon(self, cardholder_ids: Iterable[str]) -> np.ndarray:
        """Each cardholder's budget, keyed on the card token (so a card number and its token get the same)."""
        return cardholder_epsilon(self.pseudonyms(cardholder_ids), self._secret, self.privacy_cfg)

    def pseudonyms(self, cardholder_ids: Iterable[str]) -> list[str]:
        return pseudonymize(cardholder_ids, self._secret)

    def merchant(self, merchant_ids: Iterable[str]) -> np.ndarray:
        """Merchant-table row of each id under the federation's key (:func:`federation_key`)."""
        return merchant_bucket(merchant_ids, self.encoder_cfg, self._merchant_key)

    def merchant_hash(self, merchant_ids: Iterable[str]) -> np.ndarray:
        """The 64-bit keyed merchant hash ego-graph nodes are identified by (its residue is :meth:`merchant`)."""
        return merchant_hash(merchant_ids, self._merchant_key)

    def _noise(self, v: np.ndarray, keys: np.ndarray, eps: np.ndarray | float, channel: int) -> np.ndarray:
        eps_row = np.broadcast_to(np.asarray(eps, dtype=np.float64), (v.shape[0],))
        return private_shuffle(v, eps_row, self.privacy_cfg.delta, keys, self.permutation, channel)

    def location(self, lat: np.ndarray, lon: np.ndarray, keys: np.ndarray, eps: np.ndarray | float) -> np.ndarray:
        """L' ``[n, d]`` float32 for degrees ``lat``/``lon``, noise keys and budgets (scalar or ``[n]``; the
        thesis mechanism's). ``calibrated``: the encoding of planar-Laplace-noised coordinates.
        """
        if self.privacy_cfg.mechanism == "calibrated":
            noisy_lat, noisy_lon = planar_laplace(lat, lon, keys, self.privacy_cfg.geo_epsilon_per_km)
            return encode_location(noisy_lat, noisy_lon, self.encoder_cfg)
        return self._noise(encode_location(lat, lon, self.encoder_cfg), keys, eps, CHANNEL_LOCATION)

    def time(self, ts: np.ndarray, keys: np.ndarray, eps: np.ndarray | float) -> np.ndarray:
        """T' ``[n, d]`` float32 for timestamps (POSIX seconds or datetime64/pandas), keys and budgets.
        ``calibrated``: the encoding of the randomized-response hour alone.
        """
        secs = epoch_seconds(ts).reshape(-1)
        if self.privacy_cfg.mechanism == "calibrated":
            hour = np.floor_divide(np.mod(secs, 86_400), 3600)
            noisy = randomized_hour(hour, keys, self.privacy_cfg.hour_epsilon)
            return encode_time(noisy * 3600, self.encoder_cfg)
        return self._noise(encode_time(secs, self.encoder_cfg), keys, eps, CHANNEL_TIME)

    def mu(self, eps: float) -> float:
        """μ-GDP of one shuffled d-vector whose coordinates all have budget ``eps``."""
        return mu_gdp(np.full(self.dim, eps), self.privacy_cfg.delta)

    def transform(self, frame: pd.DataFrame) -> PrivateFeatures:
        """Private features of every row of a canonical frame (see :mod:`fedfraud.feature_store.schema`), in order."""
        missing = [
            c for c in ("transaction_id", "cardholder_id", "merchant_id", "timestamp", "lat", "lon") if c not in frame
        ]
        if missing:
            raise ValueError(f"frame lacks columns {missing}")
        keys = self.noise_keys(frame["transaction_id"])
        holders = frame["cardholder_id"].to_numpy()
        unique, inverse = np.unique(holders.astype(str), return_inverse=True)
        tokens = self.pseudonyms(unique)
        eps = cardholder_epsilon(tokens, self._secret, self.privacy_cfg)[inverse]
        pseudo = np.asarray(tokens, dtype=object)[inverse]
        lat = frame["lat"].to_numpy(dtype=np.float64)
        lon = frame["lon"].to_numpy(dtype=np.float64)
        return PrivateFeatures(
            keys=keys,
            epsilon=eps,
            location=self.location(lat, lon, keys, eps),
            time=self.time(frame["timestamp"], keys, eps),
            merchant=self.merchant(frame["merchant_id"]),
            cardholder=pseudo.astype(object),
        )

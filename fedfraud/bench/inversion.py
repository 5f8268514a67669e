"""What a perfect inversion of a bank's anomaly-model update recovers: the LDP bound (the thesis's divergence
condition, E(g(x), g(x')) < E(g(x̃), g(x')) with x̃ = M(x; ε, δ)).

A bank trains on the noised embeddings L', T' (:class:`~fedfraud.feature_store.privacy.PrivateFeaturizer`), so any
update leaving it is a function of x̃, never of x: even an attacker who inverts an update perfectly holds L' and
T', not L and T. This module measures what that attacker then learns about where and when the bank's cardholders
paid: it decodes L' and T' by nearest neighbour among the encodings of candidate places and times, and compares
with the same decode of the clean L, T (inversion without LDP) and with a no-information guess. No iterative
gradient inversion is run: the rows are the best any inversion can do.

The attacker is given the federation's permutation of the thesis mechanism (a bank colluding with the server has
it; the thesis treats it as public), the encoder (public), and, for the strongest candidate set, every true place.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedfraud.bench.harness import rounded, table
from fedfraud.training.bootstrap import Interval, bootstrap_statistics

__all__ = [
    "INVERSION_ROWS",
    "InversionBound",
    "View",
    "attacker_views",
    "decode_locations_grid",
    "decode_times",
    "inversion_bound",
    "nearest",
    "sample_train_rows",
]

logger = logging.getLogger(__name__)

#: Train-split transactions the section samples (over all banks).
INVERSION_ROWS = 20_000
#: The location candidate grid's step (degrees) and the coarse step of its coarse-to-fine search.
GRID_DEG, COARSE_DEG = 0.05, 0.5
#: The time candidate grid's coarse and fine steps (seconds).
COARSE_S, FINE_S = 600, 60
COLUMNS = ["transaction_id", "cardholder_id", "merchant_id", "timestamp", "lat", "lon"]
LOCATION_STATS: dict[str, Callable[[np.ndarray], float]] = {
    "median km": lambda v: float(np.median(v)),
    "p90 km": lambda v: float(np.quantile(v, 0.9)),
    "≤ 1 km": lambda v: float(np.mean(v <= 1.0)),
    "≤ 10 km": lambda v: float(np.mean(v <= 10.0)),
}
TIME_STATS: dict[str, Callable[[np.ndarray], float]] = {
    "median h": lambda v: float(np.median(v)),
    "p90 h": lambda v: float(np.quantile(v, 0.9)),
}


@dataclass(frozen=True)
class View:
    """What the attacker holds for every row: a location and a time embedding, in the released coordinate order
    (``permuted``: the thesis mechanism's shuffle applied), or explicit guesses (the no-information baseline).
    """

    name: str
    location: np.ndarray | None
    time: np.ndarray | None
    permuted: bool


def sample_train_rows(data: Path, rows: int = INVERSION_ROWS, seed: int = 0) -> pd.DataFrame:
    """Up to ``rows`` train-split transactions drawn uniformly over every bank, with a ``bank`` column."""
    from fedfraud.feature_store.layout import list_banks, read_bank, split_of

    parts = []
    for bank in list_banks(data):
        frame = read_bank(data, bank, columns=COLUMNS)
        train = frame["cardholder_id"].astype(str).map(lambda c: split_of(c, val_fraction=0.15)).eq("train")
        parts.append(frame.loc[train.to_numpy()].assign(bank=bank))
    frame = pd.concat(parts, ignore_index=True)
    if len(frame) > rows:
        frame = frame.sample(n=rows, random_state=seed)
    return frame.reset_index(drop=True)


def attacker_views(frame: pd.DataFrame, encoder_cfg: Any, privacy_cfg: Any) -> tuple[list[View], np.ndarray]:
    """The clean embeddings and what a perfect inversion holds under each mechanism, made per bank exactly as its
    featurizer makes them (same secret, same keyed noise), and the federation's permutation.
    """
    from fedfraud.feature_store.encoders import encode_location, encode_time
    from fedfraud.feature_store.privacy import PrivateFeaturizer

    lat, lon = frame["lat"].to_numpy(np.float64), frame["lon"].to_numpy(np.float64)
    d = encoder_cfg.dim
    out = {k: (np.empty((len(frame), d), np.float32), np.empty((len(frame), d), np.float32))
           for k in ("personal", "floor", "calibrated")}
    thesis = privacy_cfg.model_copy(update={"mechanism": "thesis"})
    calibrated = privacy_cfg.model_copy(update={"mechanism": "calibrated"})
    perm = np.arange(d)
    for bank, idx in frame.groupby("bank").indices.items():
        part = frame.iloc[idx]
        f = PrivateFeaturizer.for_bank(encoder_cfg, thesis, int(bank))
        feats = f.transform(part)
        perm = f.permutation
        out["personal"][0][idx], out["personal"][1][idx] = feats.location, feats.time
        floor = thesis.epsilon_min
        out["floor"][0][idx] = f.location(lat[idx], lon[idx], feats.keys, floor)
        out["floor"][1][idx] = f.time(part["timestamp"], feats.keys, floor)
        c = PrivateFeaturizer.for_bank(encoder_cfg, calibrated, int(bank))
        out["calibrated"][0][idx] = c.location(lat[idx], lon[idx], feats.keys, feats.epsilon)
        out["calibrated"][1][idx] = c.time(part["timestamp"], feats.keys, feats.epsilon)
    p = privacy_cfg
    mark = {m: " (configured)" if p.mechanism == m else "" for m in ("thesis", "calibrated")}
    views = [
        View("clean L, T: inversion without LDP", encode_location(lat, lon, encoder_cfg),
             encode_time(frame["timestamp"], encoder_cfg), False),
        View(f"L', T': thesis mechanism{mark['thesis']}, personal ε_i ~ U({p.epsilon_min:g}, {p.epsilon_max:g}) per "
             f"cardholder, δ = {p.delta:g}", *out["personal"], True),
        View(f"L', T': thesis mechanism, every cardholder at ε = {p.epsilon_min:g} (its smallest budget)",
             *out["floor"], True),
        View(f"L', T': calibrated mechanism{mark['calibrated']}, planar Laplace ε = {p.geo_epsilon_per_km:g}/km, "
             f"randomized hour ε = {p.hour_epsilon:g}", *out["calibrated"], False),
    ]
    return views, perm


def nearest(queries: np.ndarray, candidates: np.ndarray, chunk: int = 512) -> np.ndarray:
    """Index of each query's nearest candidate (Euclidean), by chunked float32 matrix products."""
    c = np.ascontiguousarray(candidates, dtype=np.float32)
    norms = np.einsum("ij,ij->i", c, c)
    out = np.empty(len(queries), dtype=np.int64)
    for i in range(0, len(queries), chunk):
        q = np.asarray(queries[i:i + chunk], dtype=np.float32)
        out[i:i + chunk] = np.argmin(norms[None, :] - 2.0 * (q @ c.T), axis=1)
    return out


def _refine(queries: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Index of the nearest of each row's own candidates (``[n, k, d]``)."""
    return np.argmin(((candidates - queries[:, None, :].astype(np.float32)) ** 2).sum(axis=2), axis=1)


def decode_locations_grid(
    view: np.ndarray, encode: Callable[[np.ndarray, np.ndarray], np.ndarray], box: tuple[float, float, float, float],
    step: float = GRID_DEG, coarse: float = COARSE_DEG, chunk: int = 256,
) -> tuple[np.ndarray, np.ndarray]:
    """(lat, lon) of the nearest cell of a ``step``-degree grid over ``box`` (lat0, lat1, lon0, lon1) to each row:
    nearest on a ``coarse`` grid, then the ``step`` grid within ``coarse``/2 + ``step`` of it (the full fine grid
    over a continent is millions of cells).
    """
    lat0, lat1, lon0, lon1 = (np.floor(box[0] / step) * step, box[1], np.floor(box[2] / step) * step, box[3])
    clat, clon = np.meshgrid(np.arange(lat0, lat1 + coarse, coarse), np.arange(lon0, lon1 + coarse, coarse),
                             indexing="ij")
    best = nearest(view, encode(clat.ravel(), clon.ravel()))
    k = int(round((coarse / 2) / step)) + 1
    offsets = np.arange(-k, k + 1) * step
    dlat, dlon = (a.ravel() for a in np.meshgrid(offsets, offsets, indexing="ij"))
    out_lat, out_lon = np.empty(len(view)), np.empty(len(view))
    for i in range(0, len(view), chunk):
        b = best[i:i + chunk]
        # snap to the fine grid: coarse cells are fine-grid points
        glat = lat0 + np.round((clat.ravel()[b][:, None] + dlat - lat0) / step) * step
        glon = lon0 + np.round((clon.ravel()[b][:, None] + dlon - lon0) / step) * step
        cand = encode(glat.ravel(), glon.ravel()).reshape(len(b), len(dlat), -1)
        j = _refine(view[i:i + chunk], cand)
        out_lat[i:i + chunk], out_lon[i:i + chunk] = glat[np.arange(len(b)), j], glon[np.arange(len(b)), j]
    return out_lat, out_lon


def decode_times(
    view: np.ndarray, encode: Callable[[np.ndarray], np.ndarray], span: tuple[int, int],
    coarse: int = COARSE_S, fine: int = FINE_S, chunk: int = 2048,
) -> np.ndarray:
    """POSIX seconds of the nearest candidate time to each row: a ``coarse``-second grid over ``span``, then
    ``fine`` steps within one coarse step of it.
    """
    start = span[0] - span[0] % coarse
    grid = np.arange(start, span[1] + coarse, coarse, dtype=np.int64)
    best = grid[nearest(view, encode(grid))]
    offsets = np.arange(-coarse, coarse + 1, fine, dtype=np.int64)
    out = np.empty(len(view), dtype=np.int64)
    for i in range(0, len(view), chunk):
        cand = best[i:i + chunk, None] + offsets
        j = _refine(view[i:i + chunk], encode(cand.ravel()).reshape(cand.shape[0], len(offsets), -1))
        out[i:i + chunk] = cand[np.arange(cand.shape[0]), j]
    return out


def _time_of_day_hours(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    d = np.mod(np.asarray(a) - np.asarray(b), 86_400)
    return np.minimum(d, 86_400 - d) / 3600.0


@dataclass
class InversionBound:
    """Section 4's tables: per attacker view, location and time errors with 95% intervals over cardholders."""

    rows: int = 0
    cardholders: int = 0
    banks: int = 0
    places: int = 0
    location: dict[str, dict[str, Interval]] = field(default_factory=dict)
    time: dict[str, dict[str, Interval]] = field(default_factory=dict)
    seconds: float = 0.0
    policy: str = ""

    def to_markdown_lines(self) -> list[str]:
        """The section's tables, in the format of the bench's other tables."""
        stats = list(LOCATION_STATS)
        tstats = ["hour-of-day accuracy", "time-of-day error median h", "time-of-day error p90 h",
                  "timestamp error median h"]
        return [*table(["what the attacker decodes", "candidates", *(s + " [95% CI]" for s in stats)],
                       ([*key.split(" @ "), *(rounded(row[s]) for s in stats)] for key, row in self.location.items())),
                "", *table(["what the attacker decodes", *(s + " [95% CI]" for s in tstats)],
                           ([view, *(rounded(row[s]) for s in tstats)] for view, row in self.time.items()))]


def inversion_bound(
    frame: pd.DataFrame, encoder_cfg: Any, privacy_cfg: Any, resamples: int = 200, seed: int = 0,
) -> InversionBound:
    """Decode every attacker view of ``frame``'s rows (:func:`sample_train_rows`) against the candidate places and
    times and score the errors against the truth, with the no-information baseline; intervals over cardholders.
    """
    from fedfraud.feature_store.encoders import encode_location, encode_time, epoch_seconds
    from fedfraud.feature_store.geo import haversine_km

    t0 = time.perf_counter()
    views, perm = attacker_views(frame, encoder_cfg, privacy_cfg)
    lat, lon = frame["lat"].to_numpy(np.float64), frame["lon"].to_numpy(np.float64)
    secs = epoch_seconds(frame["timestamp"]).reshape(-1)
    box = (float(lat.min()), float(lat.max()), float(lon.min()), float(lon.max()))
    places = np.unique(np.c_[lat, lon], axis=0)
    km: dict[str, np.ndarray] = {}
    tod: dict[str, np.ndarray] = {}
    hour_hit: dict[str, np.ndarray] = {}
    abs_h: dict[str, np.ndarray] = {}
    for v in views:
        order = perm if v.permuted else slice(None)

        def enc_loc(a: np.ndarray, b: np.ndarray, order: Any = order) -> np.ndarray:
            return encode_location(a, b, encoder_cfg)[:, order]

        def enc_time(s: np.ndarray, order: Any = order) -> np.ndarray:
            return encode_time(s, encoder_cfg)[:, order]

        j = nearest(v.location, enc_loc(places[:, 0], places[:, 1]))
        km[f"{v.name} @ every true place ({len(places):,})"] = haversine_km(lat, lon, places[j, 0], places[j, 1])
        glat, glon = decode_locations_grid(v.location, enc_loc, box)
        km[f"{v.name} @ {GRID_DEG:g}° grid over the data's box"] = haversine_km(lat, lon, glat, glon)
        got = decode_times(v.time, enc_time, (int(secs.min()), int(secs.max())))
        tod[v.name], abs_h[v.name] = _time_of_day_hours(got, secs), np.abs(got - secs) / 3600.0
        hour_hit[v.name] = ((got % 86_400) // 3600 == (secs % 86_400) // 3600).astype(np.float64)
        logger.info("inversion view=%r decoded in %.1f s", v.name, time.perf_counter() - t0)
    # the no-information baseline: the population's modal 0.05° cell, modal hour (at its middle), median timestamp
    cells = np.c_[np.floor(lat / GRID_DEG), np.floor(lon / GRID_DEG)]
    uniq, counts = np.unique(cells, axis=0, return_counts=True)
    mode = (uniq[counts.argmax()] + 0.5) * GRID_DEG
    base = "no-information baseline: the population's modal cell / hour / median time"
    km[f"{base} @ —"] = haversine_km(lat, lon, mode[0], mode[1])
    hours = (secs % 86_400) // 3600
    modal_hour = int(np.bincount(hours, minlength=24).argmax())
    tod[base] = _time_of_day_hours(modal_hour * 3600 + 1800, secs % 86_400)
    hour_hit[base] = (hours == modal_hour).astype(np.float64)
    abs_h[base] = np.abs(np.median(secs) - secs) / 3600.0
    group = frame["cardholder_id"].astype(str).to_numpy()
    out = InversionBound(len(frame), int(len(np.unique(group))), int(frame["bank"].nunique()), len(places))
    out.location = bootstrap_statistics(km, group, LOCATION_STATS, resamples=resamples, seed=seed)
    mean: dict[str, Callable[[np.ndarray], float]] = {"mean": lambda v: float(np.mean(v))}
    hits = bootstrap_statistics(hour_hit, group, mean, resamples=resamples, seed=seed)
    errs = bootstrap_statistics(tod, group, TIME_STATS, resamples=resamples, seed=seed)
    full = bootstrap_statistics(abs_h, group, {"median": TIME_STATS["median h"]}, resamples=resamples, seed=seed)
    out.time = {v: {"hour-of-day accuracy": hits[v]["mean"], "time-of-day error median h": errs[v]["median h"],
                    "time-of-day error p90 h": errs[v]["p90 h"], "timestamp error median h": full[v]["median"]}
                for v in tod}
    p = privacy_cfg
    out.policy = (f"configured mechanism `{p.mechanism}`; thesis mechanism: personal ε_i ~ U({p.epsilon_min:g}, "
                  f"{p.epsilon_max:g}) keyed per cardholder, δ = {p.delta:g}, noise std √(δ/ε_i) = "
                  f"{(p.delta / p.epsilon_max) ** 0.5:.3g}–{(p.delta / p.epsilon_min) ** 0.5:.3g} per coordinate; "
                  f"calibrated: {p.geo_epsilon_per_km:g}/km and {p.hour_epsilon:g} per report")
    out.seconds = time.perf_counter() - t0
    return out

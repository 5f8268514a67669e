"""Stacking a score into the fraud model without leakage: cross-fitting over cardholder folds, plus controls.

The anomaly score (AS) is a model output. If the anomaly model trained on a
cardholder, its score on that cardholder's rows is in-sample (it has seen
their history), while on test cardholders it is out-of-sample: the fraud
model then learns how much to trust an in-sample AS and is scored on an
out-of-sample one. Cross-fitting removes the mismatch: cardholders are cut
into ``k`` folds; for each fold an anomaly model is fitted on the *other*
folds' cardholders and scores this fold's rows, so every row's AS (train,
validation and test alike) comes from a model that never saw its cardholder.

All coupling to the anomaly model (being rewritten elsewhere) goes through
ONE function type, :data:`FitAndScore`::

    fit_and_score(train_frames: {bank: frame}, score_frames: {bank: frame}) -> {bank: scores}

It fits on the canonical rows of ``train_frames`` (per bank, as a federation
would) and returns one float per row of each ``score_frames[bank]`` (NaN
where it has no score). :func:`anomaly_fit_and_score` is the default built
on today's public anomaly API; swap it for the new model's.

Controls (same pipeline, known answers):

* negative: :func:`permuted_within_bank` shuffles a score across the rows of
  each bank: the same values, no link to the rows, so the stacking gain must
  be ≈ 0;
* positive: :func:`spend_ratio_score`, a label-free score known to carry
  fraud signal on Sparkov data (a cardholder's spend over the last 24 hours
  relative to the median of their own earlier 24-hour spends, computed
  causally), run through the same cross-fitting plumbing as the AS.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from fedfraud.config import FedfraudConfig

__all__ = [
    "FitAndScore",
    "anomaly_fit_and_score",
    "cardholder_folds",
    "crossfit_anomaly_scores",
    "permuted_within_bank",
    "spend_ratio_fit_and_score",
    "spend_ratio_score",
]

logger = logging.getLogger(__name__)

#: ``(train_frames, score_frames) -> scores``: fit on the first, one score per row of each of the second.
FitAndScore = Callable[[dict[int, pd.DataFrame], dict[int, pd.DataFrame]], dict[int, np.ndarray]]


def cardholder_folds(cardholders: Mapping[int, np.ndarray] | np.ndarray, k: int, seed: int = 0) -> dict[str, int]:
    """Fold (0..k-1) of every cardholder id, by a seeded hash (stable, independent of bank and row order)."""
    if k < 2:
        raise ValueError("cross-fitting needs at least 2 folds")
    ids = np.concatenate(list(cardholders.values())) if isinstance(cardholders, Mapping) else np.asarray(cardholders)
    out: dict[str, int] = {}
    for cid in sorted({str(c) for c in ids}):
        digest = hashlib.blake2b(f"fedfraud-crossfit:{seed}:{cid}".encode(), digest_size=8).digest()
        out[cid] = int.from_bytes(digest, "big") % k
    return out


def crossfit_anomaly_scores(
    frames_by_bank: Mapping[int, pd.DataFrame],
    folds: Mapping[str, int],
    fit_and_score: FitAndScore,
) -> dict[int, np.ndarray]:
    """Out-of-fold score of every row: fold f's rows are scored by a model fitted without fold f's cardholders.

    Args:
        frames_by_bank: canonical rows per bank (must have ``cardholder_id``).
        folds: cardholder id → fold; every cardholder of the frames must have one.
        fit_and_score: the adapter to the scoring model (see module docstring).

    Returns:
        bank → float64 scores aligned with the rows of ``frames_by_bank[bank]``.
    """
    holder = {b: f["cardholder_id"].astype(str).to_numpy() for b, f in frames_by_bank.items()}
    missing = {c for h in holder.values() for c in h} - set(folds)
    if missing:
        raise ValueError(f"{len(missing)} cardholders have no fold, e.g. {sorted(missing)[:3]}")
    fold_of = {b: np.fromiter((folds[c] for c in h), dtype=np.int64, count=len(h)) for b, h in holder.items()}
    out = {b: np.full(len(f), np.nan) for b, f in frames_by_bank.items()}
    done = {b: np.zeros(len(f), dtype=bool) for b, f in frames_by_bank.items()}
    for fold in sorted(set(folds.values())):
        train = {b: f[fold_of[b] != fold].reset_index(drop=True) for b, f in frames_by_bank.items()}
        score = {b: f[fold_of[b] == fold].reset_index(drop=True) for b, f in frames_by_bank.items()}
        if not any(len(s) for s in score.values()):
            continue
        scores = fit_and_score(train, score)
        for b, s in score.items():
            got = np.asarray(scores.get(b, np.full(len(s), np.nan)), dtype=np.float64)
            if got.shape != (len(s),):
                raise ValueError(f"fit_and_score returned {got.shape} scores for {len(s)} rows of bank {b}")
            mask = fold_of[b] == fold
            out[b][mask] = got
            done[b][mask] = True
        logger.info("crossfit fold=%d train_rows=%d scored_rows=%d", fold, sum(len(t) for t in train.values()),
                    sum(len(s) for s in score.values()))
    for b, d in done.items():
        if not d.all():  # pragma: no cover - every row has a fold, so every row is scored once
            raise RuntimeError(f"bank {b}: {int((~d).sum())} rows were not scored")
    return out


def permuted_within_bank(scores_by_bank: Mapping[int, np.ndarray], seed: int) -> dict[int, np.ndarray]:
    """Negative control: each bank's scores shuffled across its rows (same values, no information)."""
    rng = np.random.default_rng(seed)
    return {b: np.asarray(s, dtype=np.float64)[rng.permutation(len(s))] for b, s in sorted(scores_by_bank.items())}


def spend_ratio_score(frame: pd.DataFrame, window_s: int = 86_400) -> np.ndarray:
    """Positive control: ``spend over the last 24 h (incl. this row) / (median of the cardholder's earlier
    24-hour spends + 1)``, per row of ``frame`` in its order. Label-free and causal (only earlier rows
    and this one); NaN on a cardholder's first transaction.
    """
    from fedfraud.feature_store.encoders import timestamps_us

    n = len(frame)
    if n == 0:
        return np.zeros(0)
    ts = pd.to_datetime(timestamps_us(frame["timestamp"]), unit="us")
    df = pd.DataFrame({"holder": frame["cardholder_id"].astype(str).to_numpy(), "ts": ts,
                       "amount": frame["amount"].to_numpy(dtype=np.float64), "pos": np.arange(n)})
    df = df.sort_values(["holder", "ts", "pos"], kind="stable")
    out = np.full(n, np.nan)
    for _, g in df.groupby("holder", sort=False):
        spend = g.set_index("ts")["amount"].rolling(f"{window_s}s").sum().to_numpy()
        past_median = pd.Series(spend).expanding().median().shift(1).to_numpy()
        out[g["pos"].to_numpy()] = spend / (past_median + 1.0)
    return out


def spend_ratio_fit_and_score(train_frames: dict[int, pd.DataFrame],
                              score_frames: dict[int, pd.DataFrame]) -> dict[int, np.ndarray]:
    """The positive control as a :data:`FitAndScore` (nothing to fit; proves the cross-fit plumbing)."""
    del train_frames
    return {b: spend_ratio_score(f) for b, f in score_frames.items()}


def anomaly_fit_and_score(cfg: FedfraudConfig, rounds: int = 1, threads: int = 1) -> FitAndScore:
    """Default adapter: fit the anomaly model centrally on the train frames, score the others.

    The budget is ``rounds`` centralized rounds of the configured anomaly
    training (``local_epochs`` × ``samples_per_epoch`` transitions per bank per
    round: 400 steps of 128 at the defaults), with validation-round selection
    as in ``fedfraud train anomaly --centralized``. Scoring replays ego graphs
    (``AnomalyScorer.score_frame``).
    """
    budget = cfg.model_copy(update={"federated": cfg.federated.model_copy(update={"rounds": rounds})})

    def fit_and_score(train_frames: dict[int, pd.DataFrame],
                      score_frames: dict[int, pd.DataFrame]) -> dict[int, np.ndarray]:
        from fedfraud.feature_store.privacy import PrivateFeaturizer
        from fedfraud.training.anomaly.scorer import AnomalyScorer
        from fedfraud.training.data.writer import DatasetWriter
        from fedfraud.training.anomaly.centralized import run_centralized
        from fedfraud.training.anomaly.federated.task import RunSettings

        with tempfile.TemporaryDirectory(prefix="fedfraud-crossfit-") as tmp:
            data, registry = Path(tmp) / "data", Path(tmp) / "artifacts"
            banks = sorted(train_frames)
            writer = DatasetWriter(data, len(banks))
            for i, b in enumerate(banks):
                frame = train_frames[b]
                if len(frame):
                    writer.add(frame, np.full(len(frame), i, dtype=np.int64))
            writer.finish({"source": "crossfit"})
            settings = RunSettings.from_config(budget, data, registry)
            run_centralized(settings, threads=threads)
            scorer = AnomalyScorer.from_registry(registry)
            return {
                b: (scorer.score_frame(f, PrivateFeaturizer.for_bank(scorer.encoder_cfg, cfg.privacy, b))
                    if len(f) else np.zeros(0))
                for b, f in score_frames.items()
            }

    return fit_and_score

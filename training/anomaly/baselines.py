"""Label-free baselines the anomaly model must beat, computed causally (each transaction sees only its past).

They read raw values inside the bank, like any bank rule engine would, so
they are an upper bound for what a rule sees, not a privacy-preserving model:

* ``spend_24h_surprise`` — the cardholder's spend over the last 24 hours
  (this transaction included) relative to the median of their earlier
  24-hour spends;
* ``amount_surprise`` — the amount relative to the running median amount;
* ``isolation_forest`` — scikit-learn's IsolationForest on log-amount, hour,
  the category one-hot (an ordinal slot number would invent an order between
  categories) and amount ratio, fitted on training cardholders only;
* ``new_node_edge`` — "new merchant" + "new merchant-to-merchant transition";
* ``amount_mean_ratio`` — the amount relative to the running *mean* of the
  cardholder's earlier amounts;
* ``category_transition`` — −log P(category | the cardholder's previous
  category), from a smoothed table fitted on training cardholders
  (:class:`PopulationModel`);
* ``amount_bin_nll`` — −log P(amount bin) of the population, bins and counts
  fitted on training cardholders;
* ``rank_combination`` — a weighted mean of the percentile ranks of
  :data:`RANK_TERMS` (ranks against the training rows' values, so a score
  never depends on the other rows being scored).

Each score of a transaction depends only on that cardholder's earlier rows
and on statistics fitted on the training split. Nothing here reads a label.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from sklearn.ensemble import IsolationForest

from fedfraud.feature_store.encoders import timestamps_us
from fedfraud.feature_store.events import category_slot

__all__ = [
    "BASELINES",
    "RANK_TERMS",
    "PopulationModel",
    "causal_baselines",
    "combination_candidates",
    "fit_population",
    "isolation_forest_design",
    "isolation_forest_scores",
    "label_free_scores",
    "percentile_ranks",
    "population_scores",
    "rank_combination",
]

#: Baseline column names, in report order.
BASELINES: tuple[str, ...] = (
    "spend_24h_surprise",
    "amount_surprise",
    "isolation_forest",
    "new_node_edge",
    "amount_mean_ratio",
    "category_transition",
    "amount_bin_nll",
    "rank_combination",
)
#: The causal terms :func:`rank_combination` mixes by percentile rank.
RANK_TERMS: tuple[str, ...] = ("category_transition", "amount_bin_nll", "spend_24h_surprise")
_DAY_US = 86_400 * 1_000_000


def causal_baselines(frame: pd.DataFrame) -> pd.DataFrame:
    """Per transaction (index aligned with ``frame``): the rule scores and the IsolationForest inputs.

    Columns: ``spend_24h_surprise``, ``amount_surprise``, ``new_node_edge``,
    ``amount_mean_ratio``, ``log_amount``, ``hour``, ``category``,
    ``prev_category`` (-1 for the first), ``amount_ratio``. A cardholder's
    first transaction gets 0 surprise and a mean ratio of 1 (nothing to
    compare with).
    """
    data = frame.assign(_ts=timestamps_us(frame["timestamp"])).sort_values(
        ["cardholder_id", "_ts", "transaction_id"], kind="stable"
    )
    holders = data["cardholder_id"].astype(str).to_numpy()
    ts = data["_ts"].to_numpy(dtype=np.int64)
    amount = data["amount"].to_numpy(dtype=np.float64)
    merchant = data["merchant_id"].astype(str).to_numpy()
    n = len(data)
    spend, amt, rule = np.zeros(n), np.zeros(n), np.zeros(n)
    ratio, mean_ratio = np.ones(n), np.ones(n)
    category = np.array([category_slot(m) for m in data["mcc"].astype(str)], dtype=np.int64)
    prev_category = np.full(n, -1, dtype=np.int64)
    start = 0
    while start < n:
        end = start
        while end < n and holders[end] == holders[start]:
            end += 1
        window_start, window_sum, past_sum = start, 0.0, 0.0
        past_spend: list[float] = []
        past_amount: list[float] = []
        seen: set[str] = set()
        edges: set[tuple[str, str]] = set()
        for i in range(start, end):
            while ts[window_start] <= ts[i] - _DAY_US:
                window_sum -= amount[window_start]
                window_start += 1
            window_sum += amount[i]
            if past_spend:
                spend[i] = window_sum / max(_median(past_spend), 1.0)
                ratio[i] = amount[i] / max(_median(past_amount), 1.0)
                amt[i] = ratio[i]
                mean_ratio[i] = amount[i] / max(past_sum / (i - start), 1.0)
                prev_category[i] = category[i - 1]
            new_node = merchant[i] not in seen
            new_edge = i > start and (merchant[i - 1], merchant[i]) not in edges
            rule[i] = float(new_node) + float(new_edge)
            bisect.insort(past_spend, window_sum)
            bisect.insort(past_amount, amount[i])
            past_sum += amount[i]
            seen.add(merchant[i])
            if i > start:
                edges.add((merchant[i - 1], merchant[i]))
        start = end
    hours = (ts // 3_600_000_000) % 24
    out = pd.DataFrame(
        {
            "spend_24h_surprise": spend,
            "amount_surprise": amt,
            "new_node_edge": rule,
            "amount_mean_ratio": mean_ratio,
            "log_amount": np.log1p(np.maximum(amount, 0.0)),
            "hour": hours.astype(np.float64),
            "category": category.astype(np.float64),
            "prev_category": prev_category.astype(np.float64),
            "amount_ratio": np.log(np.maximum(ratio, 1e-6)),
        },
        index=data.index,
    )
    return out.reindex(frame.index)


def _median(sorted_values: list[float]) -> float:
    k = len(sorted_values)
    mid = k // 2
    return sorted_values[mid] if k % 2 else 0.5 * (sorted_values[mid - 1] + sorted_values[mid])


def isolation_forest_scores(train: pd.DataFrame, score: pd.DataFrame, seed: int = 0) -> np.ndarray:
    """IsolationForest fitted on ``train``'s causal features (training cardholders), scores of ``score``'s rows.

    The category enters one-hot over the categories seen in ``train`` (an unseen one is all zeros): as a slot
    number the forest would split "slot < 7" as if categories were ordered. Higher = more anomalous (the negated
    ``score_samples``).
    """
    vocabulary = np.unique(train["category"].to_numpy(dtype=np.float64))
    forest = IsolationForest(n_estimators=200, max_samples=min(4096, len(train)), random_state=seed, n_jobs=1)
    forest.fit(isolation_forest_design(train, vocabulary))
    return -forest.score_samples(isolation_forest_design(score, vocabulary))


def isolation_forest_design(frame: pd.DataFrame, categories: np.ndarray) -> np.ndarray:
    """The forest's inputs: log-amount, hour on the circle (so 23:00 and 00:00 are neighbours), log amount ratio,
    then one column per category of ``categories`` (one-hot; all zeros for any other category).
    """
    x = frame[["log_amount", "hour", "amount_ratio"]].to_numpy(dtype=np.float64)
    hour = 2 * math.pi / 24
    one_hot = frame["category"].to_numpy(dtype=np.float64)[:, None] == np.asarray(categories)[None, :]
    return np.c_[x[:, 0], np.sin(x[:, 1] * hour), np.cos(x[:, 1] * hour), x[:, 2], one_hot.astype(np.float64)]


@dataclass(frozen=True)
class PopulationModel:
    """Population statistics of the training cardholders, the only rows the population-based baselines learn from.

    ``categories``: the category slots seen in training (index ``k`` of the tables); ``log_transition[p, c]`` =
    log P(category c | previous p), add-``alpha`` smoothed, where row ``K`` (no previous transaction, or one of a
    category unseen in training) is the marginal P(category) and column ``K`` is any unseen category;
    ``log_amount_bin`` = log P(bin) over ``[under, bins of amount_width in log1p(amount) from amount_low, over]``;
    ``reference``: each :data:`RANK_TERMS` column's sorted training values (percentile ranks are taken against them).
    """

    categories: np.ndarray
    log_transition: np.ndarray
    amount_low: float
    amount_width: float
    log_amount_bin: np.ndarray
    reference: Mapping[str, np.ndarray]

    def category_index(self, slots: np.ndarray) -> np.ndarray:
        """Table index of each category slot; ``K`` for -1 (none) and for a slot unseen in training."""
        return _category_index(self.categories, slots)

    def amount_bin(self, log_amount: np.ndarray) -> np.ndarray:
        """Bin of each log1p(amount): 0 below the training minimum, the last one above the training maximum."""
        return _amount_bin(log_amount, self.amount_low, self.amount_width, len(self.log_amount_bin) - 2)


def _category_index(categories: np.ndarray, slots: np.ndarray) -> np.ndarray:
    slots = np.asarray(slots, dtype=np.float64)
    k = len(categories)
    if not k:
        return np.zeros(len(slots), dtype=np.int64)
    pos = np.clip(np.searchsorted(categories, slots), 0, k - 1)
    return np.where(categories[pos] == slots, pos, k)


def _amount_bin(log_amount: np.ndarray, low: float, width: float, n_bins: int) -> np.ndarray:
    x = np.asarray(log_amount, dtype=np.float64)
    inner = 1 + np.clip(np.floor((x - low) / width), 0, n_bins - 1).astype(np.int64)
    return np.where(x < low, 0, np.where(x > low + n_bins * width, n_bins + 1, inner))


def fit_population(train: pd.DataFrame, alpha: float = 1.0, amount_width: float = 0.2) -> PopulationModel:
    """Fit the transition table, amount bins and rank references on training cardholders' causal features.

    ``train``: :func:`causal_baselines` rows of training cardholders only (the caller's split decides). The amount
    bins are as wide as the anomaly model's amount head (log-amount × 5) so both see the same resolution.
    """
    categories = np.unique(train["category"].to_numpy(dtype=np.float64))
    k = len(categories)
    prev = _category_index(categories, train["prev_category"].to_numpy())
    cur = _category_index(categories, train["category"].to_numpy())
    counts = np.zeros((k + 1, k + 1))
    np.add.at(counts, (prev, cur), 1.0)
    counts[k] = np.bincount(cur, minlength=k + 1)  # the back-off row: the marginal over all training rows
    counts += alpha
    log_transition = np.log(counts) - np.log(counts.sum(axis=1, keepdims=True))
    log_amount = train["log_amount"].to_numpy(dtype=np.float64)
    low, high = (float(log_amount.min()), float(log_amount.max())) if len(log_amount) else (0.0, 0.0)
    n_bins = max(1, math.ceil((high - low) / amount_width))
    bins = _amount_bin(log_amount, low, amount_width, n_bins)
    smoothed = np.bincount(bins, minlength=n_bins + 2) + alpha
    log_bin = np.log(smoothed) - math.log(smoothed.sum())
    terms = {
        "category_transition": -log_transition[prev, cur],
        "amount_bin_nll": -log_bin[bins],
        "spend_24h_surprise": train["spend_24h_surprise"].to_numpy(dtype=np.float64),
    }
    reference = {t: np.sort(terms[t]) for t in RANK_TERMS}
    return PopulationModel(categories, log_transition, low, amount_width, log_bin, reference)


def population_scores(model: PopulationModel, base: pd.DataFrame) -> pd.DataFrame:
    """``category_transition`` and ``amount_bin_nll`` of :func:`causal_baselines` rows under ``model``."""
    prev = model.category_index(base["prev_category"].to_numpy())
    cur = model.category_index(base["category"].to_numpy())
    return pd.DataFrame(
        {
            "category_transition": -model.log_transition[prev, cur],
            "amount_bin_nll": -model.log_amount_bin[model.amount_bin(base["log_amount"].to_numpy())],
        },
        index=base.index,
    )


def percentile_ranks(model: PopulationModel, terms: pd.DataFrame) -> pd.DataFrame:
    """Each :data:`RANK_TERMS` column as its mid-rank percentile among the training rows' values, in [0, 1].

    Ranking against the training rows, not the rows being scored, keeps a score causal: it cannot move when another
    transaction (or a later one of the same cardholder) is added to the scored set.
    """
    out = {}
    for term in RANK_TERMS:
        ref = model.reference[term]
        x = terms[term].to_numpy(dtype=np.float64)
        below = np.searchsorted(ref, x, side="left")
        upto = np.searchsorted(ref, x, side="right")
        out[term] = (below + upto) / (2.0 * max(len(ref), 1))
    return pd.DataFrame(out, index=terms.index)


def rank_combination(ranks: pd.DataFrame, weights: Mapping[str, float]) -> np.ndarray:
    """The ``weights``-weighted mean of the percentile ranks (equal weights = the plain mean of ranks)."""
    total = sum(weights.values())
    if total <= 0:
        raise ValueError(f"rank combination weights must have a positive sum, got {dict(weights)}")
    return sum(w * ranks[t].to_numpy(dtype=np.float64) for t, w in weights.items()) / total


def combination_candidates(levels: Sequence[int] = (0, 1, 2)) -> list[dict[str, float]]:
    """The weightings of :data:`RANK_TERMS` a bench chooses among on validation, equal weights first.

    Every mix of ``levels`` but all-zero, one per direction (1, 1, 0 and 2, 2, 0 are the same ranking): a small,
    fixed grid, so choosing on validation cannot overfit much.
    """
    seen: set[tuple[float, ...]] = set()
    out: list[dict[str, float]] = []
    equal = tuple(1.0 for _ in RANK_TERMS)
    for combo in [equal, *itertools.product(levels, repeat=len(RANK_TERMS))]:
        total = float(sum(combo))
        if total <= 0:
            continue
        key = tuple(round(c / total, 9) for c in combo)
        if key not in seen:
            seen.add(key)
            out.append({t: float(c) for t, c in zip(RANK_TERMS, combo, strict=True) if c})
    return out


def label_free_scores(
    frame: pd.DataFrame, train: np.ndarray, seed: int = 0, weights: Mapping[str, float] | None = None
) -> pd.DataFrame:
    """Every baseline of :data:`BASELINES` for ``frame``'s rows (one bank), and the ``rank:<term>`` columns.

    ``train``: a boolean mask of ``frame``'s rows whose cardholders are in the training split; the population
    statistics and the IsolationForest learn from those rows only. ``weights``: of the rank combination (default
    equal; a bench chooses them on validation with :func:`rank_combination` over the ``rank:`` columns).
    """
    base = causal_baselines(frame)
    train = np.asarray(train, dtype=bool)
    model = fit_population(base[train])
    population = population_scores(model, base)
    ranks = percentile_ranks(model, pd.concat([population, base[["spend_24h_surprise"]]], axis=1))
    out = pd.concat([base[["spend_24h_surprise", "amount_surprise", "new_node_edge", "amount_mean_ratio"]],
                     population], axis=1)
    out["isolation_forest"] = isolation_forest_scores(base[train], base, seed=seed)
    out["rank_combination"] = rank_combination(ranks, weights or dict.fromkeys(RANK_TERMS, 1.0))
    for term in RANK_TERMS:
        out[f"rank:{term}"] = ranks[term].to_numpy()
    return out[[*BASELINES, *(f"rank:{t}" for t in RANK_TERMS)]]

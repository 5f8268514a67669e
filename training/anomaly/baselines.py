"""Label-free baselines the anomaly model must beat, computed causally (each transaction sees only its past).

They read raw values inside the bank, like any bank rule engine would, so
they are an upper bound for what a rule sees, not a privacy-preserving model:

* ``spend_24h_surprise`` — the cardholder's spend over the last 24 hours
  (this transaction included) relative to the median of their earlier
  24-hour spends;
* ``amount_surprise`` — the amount relative to the running median amount;
* ``isolation_forest`` — scikit-learn's IsolationForest on log-amount, hour,
  category and amount ratio, fitted on training cardholders only;
* ``new_node_edge`` — "new merchant" + "new merchant-to-merchant transition".

Nothing here reads a label.
"""

from __future__ import annotations

import bisect
import math

import numpy as np
import pandas as pd
from sklearn.ensemble import IsolationForest

from fedfraud.feature_store.encoders import timestamps_us
from fedfraud.feature_store.events import category_slot

__all__ = ["BASELINES", "causal_baselines", "isolation_forest_scores"]

#: Baseline column names, in report order.
BASELINES: tuple[str, ...] = ("spend_24h_surprise", "amount_surprise", "isolation_forest", "new_node_edge")
_DAY_US = 86_400 * 1_000_000


def causal_baselines(frame: pd.DataFrame) -> pd.DataFrame:
    """Per transaction (index aligned with ``frame``): the rule scores and the IsolationForest inputs.

    Columns: ``spend_24h_surprise``, ``amount_surprise``, ``new_node_edge``,
    ``log_amount``, ``hour``, ``category``, ``amount_ratio``. A cardholder's
    first transaction gets 0 surprise (nothing to compare with).
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
    ratio = np.ones(n)
    start = 0
    while start < n:
        end = start
        while end < n and holders[end] == holders[start]:
            end += 1
        window_start, window_sum = start, 0.0
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
            new_node = merchant[i] not in seen
            new_edge = i > start and (merchant[i - 1], merchant[i]) not in edges
            rule[i] = float(new_node) + float(new_edge)
            bisect.insort(past_spend, window_sum)
            bisect.insort(past_amount, amount[i])
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
            "log_amount": np.log1p(np.maximum(amount, 0.0)),
            "hour": hours.astype(np.float64),
            "category": [float(category_slot(m)) for m in data["mcc"].astype(str)],
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

    Higher = more anomalous (the negated ``score_samples``).
    """
    cols = ["log_amount", "hour", "category", "amount_ratio"]
    x_train = train[cols].to_numpy(dtype=np.float64)
    hour = 2 * math.pi / 24

    def design(x: np.ndarray) -> np.ndarray:  # hour on the circle, so 23:00 and 00:00 are neighbours
        return np.c_[x[:, 0], np.sin(x[:, 1] * hour), np.cos(x[:, 1] * hour), x[:, 2], x[:, 3]]

    forest = IsolationForest(n_estimators=200, max_samples=4096, random_state=seed, n_jobs=1)
    forest.fit(design(x_train))
    return -forest.score_samples(design(score[cols].to_numpy(dtype=np.float64)))

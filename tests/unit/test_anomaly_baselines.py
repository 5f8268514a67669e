"""The label-free baselines are causal and learn their population statistics from training cardholders only."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from fedfraud.feature_store.events import category_slot
from fedfraud.training.anomaly.baselines import (
    BASELINES,
    RANK_TERMS,
    causal_baselines,
    combination_candidates,
    fit_population,
    isolation_forest_design,
    label_free_scores,
)

CATEGORIES = ("grocery_pos", "gas_transport", "shopping_net", "travel", "home")
T0 = pd.Timestamp("2022-01-01", tz="UTC")


def _frame(holders: dict[str, int], seed: int = 0) -> pd.DataFrame:
    """``n`` transactions per cardholder over a few weeks, with habits, amounts and merchants drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    rows = []
    for holder, n in holders.items():
        gaps = np.cumsum(rng.exponential(8 * 3600, size=n))
        for i in range(n):
            cat = CATEGORIES[int(rng.integers(len(CATEGORIES)))] if rng.random() < 0.3 else CATEGORIES[0]
            rows.append({
                "transaction_id": f"{holder}-{i:04d}",
                "cardholder_id": holder,
                "merchant_id": f"m{int(rng.integers(12))}",
                "timestamp": T0 + pd.Timedelta(seconds=float(gaps[i])),
                "amount": float(np.round(rng.lognormal(3.0, 0.8), 2)),
                "mcc": cat,
                "is_fraud": False,
            })
    return pd.DataFrame(rows).sample(frac=1.0, random_state=seed).reset_index(drop=True)  # order must not matter


HOLDERS = {"a": 60, "b": 50, "c": 70, "d": 40, "v": 30, "t": 30}
TRAIN = {"a", "b", "c", "d"}


def _later_changed(frame: pd.DataFrame, holder: str, keep: int) -> pd.DataFrame:
    """``frame`` with ``holder``'s rows after their first ``keep`` rewritten and three more appended after them."""
    out = frame.copy()
    mine = out[out["cardholder_id"] == holder].sort_values("timestamp")
    later = mine.index[keep:]
    out.loc[later, "amount"] = out.loc[later, "amount"] * 40 + 1000
    out.loc[later, "mcc"] = "travel"
    out.loc[later, "merchant_id"] = "m-new"
    out.loc[later, "timestamp"] = out.loc[later, "timestamp"] + pd.Timedelta(hours=1)
    last = mine["timestamp"].max() + pd.Timedelta(hours=2)
    extra = pd.DataFrame([{
        "transaction_id": f"{holder}-x{i}", "cardholder_id": holder, "merchant_id": "m-odd",
        "timestamp": last + pd.Timedelta(minutes=5 * i), "amount": 5000.0, "mcc": "misc_net", "is_fraud": True,
    } for i in range(3)])
    return pd.concat([out, extra], ignore_index=True)


@pytest.fixture(scope="module")
def perturbed() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Scores before and after the later rows of a test cardholder changed, and the original frame."""
    frame = _frame(HOLDERS)
    train = frame["cardholder_id"].isin(TRAIN).to_numpy()
    before = label_free_scores(frame, train, seed=3)
    changed = _later_changed(frame, "t", keep=12)
    after = label_free_scores(changed, changed["cardholder_id"].isin(TRAIN).to_numpy(), seed=3)
    return before, after, frame


@pytest.mark.parametrize("column", [*BASELINES, *(f"rank:{t}" for t in RANK_TERMS)])
def test_later_rows_of_a_cardholder_do_not_move_earlier_scores(perturbed, column: str) -> None:
    before, after, frame = perturbed
    first = frame[frame["cardholder_id"] == "t"].sort_values("timestamp").index[:12]
    others = frame.index[frame["cardholder_id"] != "t"]
    unchanged = first.union(others)
    np.testing.assert_array_equal(after.loc[unchanged, column].to_numpy(), before.loc[unchanged, column].to_numpy(),
                                  err_msg=column)
    later = frame[frame["cardholder_id"] == "t"].sort_values("timestamp").index[12:]
    if column not in ("new_node_edge", "category_transition", "rank:category_transition", "spend_24h_surprise",
                      "rank:spend_24h_surprise"):  # their later rows may coincide; the amount ones cannot
        assert not np.array_equal(after.loc[later, column].to_numpy(), before.loc[later, column].to_numpy())


def test_a_score_reads_only_its_own_past() -> None:
    """A cardholder's k-th score is the same whether the frame ends there or goes on."""
    frame = _frame({"a": 40, "b": 40, "t": 25}, seed=1)
    train = frame["cardholder_id"].isin({"a", "b"}).to_numpy()
    full = label_free_scores(frame, train)
    mine = frame[frame["cardholder_id"] == "t"].sort_values("timestamp").index
    for k in (1, 5, 17):
        cut = frame.drop(index=mine[k + 1:])
        part = label_free_scores(cut, cut["cardholder_id"].isin({"a", "b"}).to_numpy())
        pd.testing.assert_frame_equal(part.loc[mine[: k + 1]], full.loc[mine[: k + 1]])


def test_per_cardholder_mean_ratio_divides_by_the_earlier_mean() -> None:
    frame = _frame({"a": 5})
    base = causal_baselines(frame)
    order = frame.sort_values("timestamp").index
    amounts = frame.loc[order, "amount"].to_numpy()
    ratio = base.loc[order, "amount_mean_ratio"].to_numpy()
    assert ratio[0] == 1.0
    for i in range(1, 5):
        assert ratio[i] == pytest.approx(amounts[i] / max(amounts[:i].mean(), 1.0))


def _sequence(holder: str, cats: list[str], amounts: list[float]) -> list[dict[str, object]]:
    return [{"transaction_id": f"{holder}{i}", "cardholder_id": holder, "merchant_id": "m",
             "timestamp": T0 + pd.Timedelta(hours=i), "amount": float(amt), "mcc": c, "is_fraud": False}
            for i, (c, amt) in enumerate(zip(cats, amounts, strict=True))]


def test_transition_table_counts_training_transitions_only() -> None:
    g, s = "grocery_pos", "shopping_net"
    train_rows = _sequence("A", [g, s, g, s], [10, 20, 10, 20]) + _sequence("B", [g, g], [10, 10])
    test_rows = _sequence("T", ["travel", "travel", "travel"], [10, 10, 10_000])
    frame = pd.DataFrame(train_rows + test_rows)
    train = frame["cardholder_id"].isin({"A", "B"}).to_numpy()
    base = causal_baselines(frame)
    model = fit_population(base[train])
    gi, si = model.category_index(np.array([category_slot(g), category_slot(s)]))
    assert len(model.categories) == 2 and "travel" not in {category_slot(c) for c in (g, s)}
    # training transitions: g→s twice, s→g once, g→g once; add-one smoothing over 2 categories + "unseen"
    assert model.log_transition[gi, si] == pytest.approx(math.log(3 / 6))
    assert model.log_transition[gi, gi] == pytest.approx(math.log(2 / 6))
    assert model.log_transition[si, gi] == pytest.approx(math.log(2 / 4))
    # no (or an unseen) previous category backs off to the training marginal: g 4, s 2, unseen 0
    assert np.exp(model.log_transition[2]) == pytest.approx(np.array([5, 3, 1]) / 9)

    other = frame.copy()
    test = ~train
    other.loc[test, "mcc"] = [g, s, g]
    other.loc[test, "amount"] = [1.0, 2.0, 3.0]
    refit = fit_population(causal_baselines(other)[train])
    np.testing.assert_array_equal(refit.log_transition, model.log_transition)
    np.testing.assert_array_equal(refit.log_amount_bin, model.log_amount_bin)
    for term in RANK_TERMS:
        np.testing.assert_array_equal(refit.reference[term], model.reference[term])

    scores = label_free_scores(frame, train)
    t_rows = frame.index[test]
    assert scores.loc[t_rows, "category_transition"].to_numpy() == pytest.approx([math.log(9)] * 3)
    nll = scores.loc[t_rows, "amount_bin_nll"].to_numpy()
    assert nll[2] > nll[0]  # above every training amount: the smoothing-only "over" bin
    assert nll[2] == pytest.approx(-model.log_amount_bin[-1])


def test_isolation_forest_sees_the_category_one_hot() -> None:
    base = causal_baselines(_frame({"a": 30}))
    vocabulary = np.unique(base["category"].to_numpy())
    x = isolation_forest_design(base, vocabulary)
    one_hot = x[:, 4:]
    assert one_hot.shape == (len(base), len(vocabulary))
    assert set(np.unique(one_hot)) <= {0.0, 1.0} and (one_hot.sum(axis=1) == 1).all()
    unseen = isolation_forest_design(base.assign(category=float(category_slot("kids_pets"))), vocabulary)
    assert (unseen[:, 4:] == 0).all()


def test_combination_candidates_start_with_equal_weights_and_repeat_no_ranking() -> None:
    candidates = combination_candidates()
    assert candidates[0] == dict.fromkeys(RANK_TERMS, 1.0)
    directions = {tuple(round(c.get(t, 0.0) / sum(c.values()), 9) for t in RANK_TERMS) for c in candidates}
    assert len(directions) == len(candidates)
    assert all(set(c) <= set(RANK_TERMS) and sum(c.values()) > 0 for c in candidates)

"""Transaction events: causal history, features against it, next-event targets and event negatives."""

import numpy as np
import pytest

from fedfraud.feature_store.events import (
    CATEGORY_SLOTS,
    EVENT_FEATURES,
    EVENT_SIZE,
    HISTORY_SIZE,
    SUMMARY_SIZE,
    Ev,
    Hist,
    category_slot,
    event_features,
    history_summary,
    new_history,
    raw_event,
    update_history,
)
from fedfraud.training.anomaly.config import HEAD_SIZES, AnomalyConfig
from fedfraud.training.anomaly.event_negatives import FAMILIES, EventNegativeSampler, parse_mix
from fedfraud.training.anomaly.heads import event_targets

DAY = 86_400.0
T0 = 1_735_689_600.0  # 2025-01-01 00:00 UTC, a Wednesday


def _replay(rows):
    """rows: (amount, mcc, ts_s, lat, lon, new_merchant) → (priors, events) as the ego graph folds them."""
    h, priors, events = new_history(), [], []
    for amount, mcc, ts, lat, lon, new in rows:
        ev = raw_event(h, amount, mcc, ts, lat, lon, new)
        priors.append(h.copy())
        events.append(ev)
        update_history(h, ev)
    return np.array(priors), np.array(events), h


def _routine(days=30):
    """A cardholder who buys groceries around noon for about $40, once a day, near home."""
    rng = np.random.default_rng(0)
    return [(40 + rng.normal(0, 5), "grocery_pos", T0 + d * DAY + 12 * 3600 + rng.normal(0, 600), 40.0, -74.0, d == 0)
            for d in range(days)]


def test_history_counts_and_clock():
    priors, events, h = _replay(_routine())
    assert h[Hist.N] == 30 and h[Hist.CATEGORY + category_slot("grocery_pos")] == 30
    assert h[Hist.HOUR + 11] + h[Hist.HOUR + 12] == 30
    assert np.expm1(h[Hist.LA_MEAN]) == pytest.approx(40, rel=0.15)
    assert priors[0][Hist.N] == 0 and priors[-1][Hist.N] == 29  # causal: the prior never contains the event
    late = raw_event(h, 10.0, "home", h[Hist.LAST_TS] - 3600, 40.0, -74.0, False)
    clock = h[Hist.LAST_TS]
    update_history(h, late)
    assert h[Hist.LAST_TS] == clock and h[Hist.N] == 31  # a late event counts but does not move the clock


def test_features_flag_what_fraud_changes():
    priors, events, h = _replay(_routine())
    usual = event_features(h, raw_event(h, 42.0, "grocery_pos", T0 + 30 * DAY + 12 * 3600, 40.0, -74.0, False))[0]
    odd = event_features(h, raw_event(h, 900.0, "shopping_net", T0 + 30 * DAY + 3 * 3600, 34.0, -118.0, True))[0]
    col = {n: i for i, n in enumerate(EVENT_FEATURES)}
    assert usual.shape == (EVENT_SIZE,) and usual.dtype == np.float32 and np.isfinite(usual).all()
    for name in ("amount_z", "hour_surprise", "category_surprise", "log_km_from_home", "spend_24h_vs_usual",
                 "new_merchant"):
        assert odd[col[name]] > usual[col[name]], name
    assert odd[col["online"]] == 1 and odd[col[f"category_{category_slot('shopping_net')}"]] == 1
    first = event_features(new_history(), raw_event(new_history(), 5.0, "home", T0, 1.0, 2.0, True))[0]
    assert first[col["first_transaction"]] == 1 and first[col["amount_z"]] == 0
    summary = history_summary(h)
    assert summary.shape == (1, SUMMARY_SIZE) and np.isfinite(summary).all()


def test_unknown_category_codes_hash_into_free_slots():
    assert category_slot("grocery_pos") < 14
    slots = {category_slot(str(code)) for code in range(5000, 5100)}
    assert all(14 <= s < CATEGORY_SLOTS for s in slots) and len(slots) > 5
    assert HEAD_SIZES["category"] == CATEGORY_SLOTS


def test_next_event_targets_are_in_range():
    priors, events, _ = _replay(_routine())
    targets = event_targets(priors, events)
    assert set(targets) == set(HEAD_SIZES)
    for head, values in targets.items():
        assert values.dtype == np.int64 and values.min() >= 0 and values.max() < HEAD_SIZES[head], head
    assert (targets["hour"][1:] // 1 <= 13).all() and targets["new-merchant"][0] == 1


def test_relative_amount_bin_reads_the_cardholders_own_past_only():
    """``amount-rel`` is log-amount minus the mean of the cardholder's *earlier* log-amounts (issue 34, S3).

    The same ×5 jump lands in the same bin for a small spender and a big one, while the absolute bins differ; a
    first transaction has no past and takes the middle bin.
    """
    small, big = (_replay([(a * scale, "grocery_pos", T0 + d * DAY + 12 * 3600, 40.0, -74.0, d == 0)
                           for d, a in enumerate([10.0] * 20 + [50.0])]) for scale in (1.0, 30.0))
    t_small, t_big = event_targets(small[0], small[1]), event_targets(big[0], big[1])
    middle = HEAD_SIZES["amount-rel"] // 2
    assert t_small["amount-rel"][0] == t_big["amount-rel"][0] == middle
    assert (t_small["amount-rel"][1:20] == middle).all()
    jump_small, jump_big = t_small["amount-rel"][20], t_big["amount-rel"][20]
    assert jump_small >= middle + 6 and abs(int(jump_small) - int(jump_big)) <= 1
    assert t_big["amount"][20] - t_small["amount"][20] >= 10  # the absolute head sees the scale, not the jump


@pytest.mark.parametrize("family", FAMILIES)
def test_each_negative_family_changes_the_event(family):
    priors, events, _ = _replay(_routine())
    # donors for `swap`: another cardholder (a night-time online shopper)
    donors = _replay([(300.0, "shopping_net", T0 + d * DAY + 23 * 3600, 35.0, -90.0, True) for d in range(10)])
    sampler = EventNegativeSampler(donors[0][1:], donors[1][1:], {family: 1.0})
    h, ev, kind = sampler.perturb(priors[5:], events[5:], np.random.default_rng(1))
    assert (kind == 0).all() and h.shape == priors[5:].shape and ev.shape == events[5:].shape
    real, fake = event_features(priors[5:], events[5:]), event_features(h, ev)
    assert np.isfinite(fake).all()
    changed = np.abs(real - fake).max(axis=1) > 1e-6
    assert changed.mean() > 0.9, family
    assert np.array_equal(priors[5:], _replay(_routine())[0][5:])  # the inputs are not modified


def test_mix_parsing_and_config_validation():
    assert parse_mix("swap=2,amount") == {"swap": 2.0, "amount": 1.0}
    with pytest.raises(ValueError, match="unknown negative family 'teleport'; valid: swap"):
        parse_mix("teleport=1")
    with pytest.raises(ValueError, match="no positive weight"):
        parse_mix("swap=0")
    with pytest.raises(ValueError, match="unknown next-event head"):
        AnomalyConfig(heads="category,colour")
    assert AnomalyConfig(readout="hierarchical").readout == "thesis"  # the old name still loads old cards
    assert AnomalyConfig().uses_events and not AnomalyConfig(readout="thesis").uses_events


def test_feature_vector_is_one_per_row_and_checks_shapes():
    priors, events, _ = _replay(_routine())
    assert event_features(priors, events).shape == (len(events), EVENT_SIZE)
    with pytest.raises(ValueError, match="do not align"):
        event_features(priors[:3], events[:4])
    assert priors.shape[1] == HISTORY_SIZE and events.shape[1] == Ev.SIZE

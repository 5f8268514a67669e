"""The bootstrap's ROC-AUC / PR-AUC (``training.bootstrap._ranking``) are scikit-learn's, ties included."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import average_precision_score, roc_auc_score

from fedfraud.training.bootstrap import _ranking


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 12)), min_size=2, max_size=200), st.booleans())
def test_ranking_equals_scikit_learn_with_and_without_ties(rows, continuous):
    y = np.array([r[0] for r in rows])
    s = np.array([float(r[1]) for r in rows])
    if continuous:  # distinct scores as well as heavily tied ones
        s = s + np.random.default_rng(len(rows)).random(len(rows))
    roc, ap = _ranking(y, s)
    if y.all() or not y.any():
        assert np.isnan(roc) and np.isnan(ap)
        return
    assert roc == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert ap == pytest.approx(average_precision_score(y, s), abs=1e-12)

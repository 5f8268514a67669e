import numpy as np
import pytest
from sklearn.metrics import average_precision_score

from fedfraud.training.fraud.metrics import (
    best_f1_threshold,
    classification_metrics,
    f1_score,
    pr_auc,
    recall_at_fpr,
    score_histograms,
    threshold_from_histograms,
)

# sorted by score: + - + - - +
Y = np.array([1, 0, 1, 0, 0, 1])
S = np.array([0.9, 0.8, 0.7, 0.3, 0.2, 0.1])


def test_f1_by_hand():
    # threshold 0.5 -> predict + + + - - -: tp=2 fp=1 fn=1 -> 2*2/(2*2+1+1)
    assert f1_score(Y, S >= 0.5) == pytest.approx(2 / 3)
    assert f1_score([0, 0], [0, 0]) == 0.0
    assert f1_score([1, 0], [0, 0]) == 0.0


def test_pr_auc_by_hand():
    # recall steps at k=1,3,6 with precision 1, 2/3, 1/2 -> (1 + 2/3 + 1/2) / 3 = 13/18
    assert pr_auc(Y, S) == pytest.approx(13 / 18)
    assert pr_auc(Y, S) == pytest.approx(average_precision_score(Y, S))
    # a tie is one threshold: precision 1/2 at recall 1
    assert pr_auc([1, 0], [0.5, 0.5]) == pytest.approx(0.5)
    assert np.isnan(pr_auc([0, 0], [0.1, 0.2]))


def test_pr_auc_matches_sklearn_on_random_ties():
    rng = np.random.default_rng(0)
    y = rng.random(500) < 0.1
    s = np.round(rng.random(500) + 0.3 * y, 2)  # many ties
    assert pr_auc(y, s) == pytest.approx(average_precision_score(y, s))


def test_recall_at_fpr_by_hand():
    # 3 negatives: fpr <= 1 % allows no false positive -> only the top row -> recall 1/3
    assert recall_at_fpr(Y, S, 0.01) == pytest.approx(1 / 3)
    # fpr <= 34 % allows one false positive -> threshold 0.7 -> recall 2/3
    assert recall_at_fpr(Y, S, 0.34) == pytest.approx(2 / 3)
    assert recall_at_fpr(Y, S, 1.0) == pytest.approx(1.0)
    # a tie between a positive and a negative cannot be split
    assert recall_at_fpr([1, 0, 0], [0.5, 0.5, 0.1], 0.01) == 0.0


def test_best_threshold_by_hand_and_from_histograms():
    # F1 per threshold: .9 -> 1/2, .8 -> 2/5, .7 -> 2/3, .3 -> 4/7, .2 -> 1/2, .1 -> 2/3; ties go to the higher
    t, f1 = best_f1_threshold(Y, S)
    assert (t, f1) == (pytest.approx(0.7), pytest.approx(2 / 3))
    pos, neg = score_histograms(Y, S, bins=10)
    assert pos.tolist() == [0, 1, 0, 0, 0, 0, 0, 1, 0, 1] and neg.sum() == 3
    t_h, f1_h = threshold_from_histograms(pos, neg)
    assert (t_h, f1_h) == (pytest.approx(0.7), pytest.approx(2 / 3))
    assert best_f1_threshold([0, 0], [0.2, 0.3]) == (1.0, 0.0)


def test_classification_metrics_bundle():
    m = classification_metrics(Y, S, 0.5, 0.01)
    assert (m.f1, m.precision, m.recall) == (pytest.approx(2 / 3), pytest.approx(2 / 3), pytest.approx(2 / 3))
    assert m.pr_auc == pytest.approx(13 / 18) and m.recall_at_fpr == pytest.approx(1 / 3)
    assert (m.n, m.n_pos) == (6, 3)
    with pytest.raises(ValueError, match="differ in length"):
        classification_metrics(Y, S[:3], 0.5)

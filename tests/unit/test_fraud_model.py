import math

import numpy as np
import pytest

from fedfraud.feature_store.config import EncoderConfig, PrivacyConfig
from fedfraud.feature_store.privacy import PrivateFeaturizer
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.training.data.synthetic import generate_frame
from fedfraud.training.fraud.config import FraudConfig
from fedfraud.training.fraud.dataset import fraud_split
from fedfraud.training.fraud.features import ANOMALY_FEATURE, FraudFeatures, build_features
from fedfraud.training.fraud.model import FraudModel, used_features
from fedfraud.training.fraud.train import train_centralized, train_local
from fedfraud.training.registry import ModelRegistry

CFG = FraudConfig(num_boost_round=15, max_depth=3, validation_fraction=0.3)


@pytest.fixture(scope="module")
def banks() -> dict[int, FraudFeatures]:
    frame, _ = generate_frame(GeneratorConfig(banks=2, cardholders=60, days=14, seed=5, fraud_rate=0.03))
    out = {}
    for b in (0, 1):
        f = frame[frame["bank"] == b].drop(columns=["bank", "scenario", "holder"]).reset_index(drop=True)
        private = PrivateFeaturizer.for_bank(EncoderConfig(), PrivacyConfig(), b).transform(f)
        out[b] = build_features(f, private, CFG, None, fraud_split(f["cardholder_id"], CFG.validation_fraction))
    return out


def test_used_features():
    names = ("amount", ANOMALY_FEATURE)
    assert used_features(names, True) == names and used_features(names, False) == ("amount",)


@pytest.mark.parametrize("use_as", [False, True])
def test_local_and_centralized_models_train(banks, use_as):
    local = train_local(banks[0], use_as, CFG, bank=0)
    central = train_centralized(banks, use_as, CFG)
    for model, variant in ((local, "local"), (central, "centralized")):
        assert model.variant == variant and model.uses_anomaly_score is use_as
        assert 0.0 <= model.threshold <= 1.0
        s = model.scores(banks[0].X)
        assert s.shape == (len(banks[0]),) and np.all((s >= 0) & (s <= 1))
    assert central.meta["train_rows"] == sum(len(b.of_split("train")) for b in banks.values())
    # the training data is learnable: frauds score above legit on average
    test = banks[0]
    s = central.scores(test.X)
    assert s[test.label == 1].mean() > s[test.label == 0].mean()


def test_predict_reasons_are_shap_contributions(banks):
    model = train_local(banks[1], True, CFG, bank=1)
    rows = banks[1].X[:20]
    decisions = model.predict_batch(rows, top_k=4)
    scores = model.scores(rows)
    contribs = model.booster.predict(_dmatrix(model, rows), pred_contribs=True)
    for d, s, c in zip(decisions, scores, contribs, strict=True):
        assert d.score == pytest.approx(s) and d.decision == (s >= model.threshold)
        assert len(d.top_reasons) == 4
        assert 1 / (1 + math.exp(-c.sum())) == pytest.approx(s, rel=1e-4)  # SHAP sums to the logit
        signed = [r.contribution for r in d.top_reasons]
        assert signed == sorted(signed, reverse=d.decision)  # towards the decision first
        for r in d.top_reasons:
            assert r.feature in model.used
    one = model.predict(rows[0], top_k=2)
    assert one.score == decisions[0].score and len(one.top_reasons) == 2
    with pytest.raises(ValueError, match="feature rows"):
        model.predict(rows[0][:-1])


def _dmatrix(model: FraudModel, X: np.ndarray):
    import xgboost as xgb

    return xgb.DMatrix(np.asarray(X, dtype=np.float32)[:, model._idx], feature_names=list(model.used), missing=np.nan)


def test_scores_without_a_dmatrix_are_the_floats_predict_gives_with_one(banks):
    """Scores come from ``inplace_predict`` (no DMatrix per micro-batch); the drift monitor bins them on edges
    computed with :meth:`FraudModel.scores`, so they must equal ``predict`` on a DMatrix bit for bit, NaNs included."""
    model = train_local(banks[0], True, CFG, bank=0)
    X = banks[0].X.copy()
    X[::7, 0] = np.nan
    assert np.array_equal(model.scores(X), np.asarray(model.booster.predict(_dmatrix(model, X)), dtype=np.float64))
    assert [d.score for d in model.predict_batch(X[:30], reasons_for="fraud")] == model.scores(X[:30]).tolist()
    assert model.predict_batch(X[:0]) == [] and model.scores(X[:0]).shape == (0,)
    wide = X.astype(np.float64)
    wide[3, 0] = 1e39  # beyond float32: a DMatrix refused it, and so does the score without one
    with pytest.raises(ValueError, match="infinite"):
        model.scores(wide)
    with pytest.raises(ValueError, match="trained on"):
        FraudModel(model.booster, model.input_names, tuple(reversed(model.used)), model.threshold, model.variant)


def test_reasons_for_fraud_explains_the_declines_only(banks):
    """Serving's default: TreeSHAP only for the rows decided fraud; their reasons are those of the full path."""
    model = train_local(banks[1], True, CFG, bank=1)
    X = banks[1].X
    order = np.argsort(-model.scores(X))
    rows = X[np.concatenate([order[:5], order[-15:]])]  # the top-scored rows and some legit ones
    every = model.predict_batch(rows, top_k=3)
    declines = model.predict_batch(rows, top_k=3, reasons_for="fraud")
    assert any(d.decision for d in every) and not all(d.decision for d in every)
    for a, b in zip(every, declines, strict=True):
        assert (a.score, a.decision) == (b.score, b.decision)
        assert b.top_reasons == (a.top_reasons if a.decision else ())
    with pytest.raises(ValueError, match="reasons_for"):
        model.predict_batch(rows, reasons_for="some")


def test_registry_round_trip_gives_identical_predictions(banks, tmp_path):
    model = train_centralized(banks, True, CFG)
    registry = ModelRegistry(tmp_path / "artifacts")
    version = model.publish(registry, config={"fraud": CFG.model_dump()}, metrics={"valid_f1": 0.5})
    assert version.kind == "fraud" and "Feature importance" in version.model_card
    assert version.privacy["client_dp"]["dp"] == "off" and "differential privacy is **off**" in version.model_card
    assert ANOMALY_FEATURE in version.extra["feature_importance"]
    loaded = FraudModel.from_registry(tmp_path / "artifacts", "latest")
    X = np.concatenate([banks[0].X, banks[1].X])
    assert np.array_equal(loaded.scores(X), model.scores(X))
    assert loaded.threshold == model.threshold and loaded.used == model.used
    for a, b in zip(loaded.predict_batch(X[:50]), model.predict_batch(X[:50]), strict=True):
        assert (a.score, a.decision) == (b.score, b.decision)
        reasons = [[(r.feature, r.contribution) for r in d.top_reasons] for d in (a, b)]
        assert reasons[0] == reasons[1]
    imp = model.feature_importance()
    assert set(imp) == set(model.used) and sum(imp.values()) == pytest.approx(1.0)

"""Serving's fraud stage builds the feature rows training built (train/serve parity), with the model's own
category-transition table, and still serves a model trained before the previous-transaction features.
"""

import numpy as np
import pandas as pd
import pytest

from fedfraud.feature_store.config import EncoderConfig, PrivacyConfig
from fedfraud.feature_store.encoders import timestamps_us
from fedfraud.feature_store.privacy import PrivateFeaturizer
from fedfraud.serving.fraud_stage import FraudStage, fraud_config_for
from fedfraud.serving.kvstore import SqliteKV
from fedfraud.serving.scored import ScoredBatch
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.training.data.synthetic import generate_frame
from fedfraud.training.fraud.config import FraudConfig
from fedfraud.training.fraud.dataset import fraud_split
from fedfraud.training.fraud.features import PREVIOUS_FEATURES, build_features, feature_names, fit_transitions
from fedfraud.training.fraud.model import FraudModel
from fedfraud.training.fraud.train import train_local

CFG = FraudConfig(num_boost_round=10, max_depth=3, validation_fraction=0.3, nthread=1)
ENC, PRIV = EncoderConfig(), PrivacyConfig()


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    f, _ = generate_frame(GeneratorConfig(banks=1, cardholders=30, days=14, seed=11, fraud_rate=0.05))
    return f.drop(columns=["bank", "scenario", "holder"]).reset_index(drop=True)


def _stream(stage: FraudStage, kv: SqliteKV, frame: pd.DataFrame, anomaly: np.ndarray, rows: np.ndarray | None = None,
            batch: int = 7, risk_rows: list | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Feed ``frame`` (``rows`` of it) in arrival order, ``batch`` rows per micro-batch; ``risk_rows``: per row of
    ``frame``, the ``merchant_risk`` row the replica's online read returned.

    Returns the feature rows the champion saw and the challenger's shadow scores, in frame order (NaN elsewhere).
    """
    featurizer = PrivateFeaturizer.for_bank(ENC, PRIV, 0)
    seen: list[np.ndarray] = []
    model = stage.model
    predict = model.predict_batch

    def spy(X: np.ndarray, **kw: object) -> list:
        seen.append(np.array(X, copy=True))
        return predict(X, **kw)

    model.predict_batch = spy
    ts = timestamps_us(frame["timestamp"])
    arrival = np.lexsort((frame["transaction_id"].to_numpy(), ts))
    if rows is not None:
        arrival = arrival[np.isin(arrival, rows)]
    out = np.full((len(frame), len(model.input_names)), np.nan, dtype=np.float32)
    shadow = np.full(len(frame), np.nan)
    for start in range(0, len(arrival), batch):
        idx = arrival[start:start + batch]
        part = frame.iloc[idx]
        private = featurizer.transform(part)  # per-batch featurization, as serving does
        scored = ScoredBatch(
            "test", part["transaction_id"].tolist(), list(private.cardholder), ts[idx].tolist(),
            part["amount"].tolist(), part["mcc"].astype(str).tolist(), private.merchant, private.location,
            private.time, anomaly[idx], np.zeros(len(idx), dtype=bool), np.zeros(len(idx), dtype=np.int64),
            "anomaly:v1",
        )
        if risk_rows is not None:
            scored.merchant_risk = [risk_rows[i] for i in idx]
        decided = stage.decide(scored)
        kv.put_many("fraud", decided.writes)  # what the hot path writes between micro-batches
        out[idx] = seen.pop()
        assert all(r is not None and r["decision"] in ("fraud", "legit") for r in decided.records)
        if decided.shadow:
            shadow[idx] = [r["challenger"]["score"] for r in decided.shadow]
    del model.predict_batch
    return out, shadow


def _features(frame: pd.DataFrame, cfg: FraudConfig, anomaly: np.ndarray | None = None):
    private = PrivateFeaturizer.for_bank(ENC, PRIV, 0).transform(frame)
    split = fraud_split(frame["cardholder_id"], cfg.validation_fraction)
    table = fit_transitions(frame, private.cardholder, split == "train") if cfg.previous_transaction_features else None
    return build_features(frame, private, cfg, anomaly, split, transitions=table)


def test_serving_builds_the_training_rows_with_the_models_table(frame, tmp_path):
    rng = np.random.default_rng(1)
    anomaly = np.where(rng.random(len(frame)) < 0.9, rng.random(len(frame)), np.nan)
    feats = _features(frame, CFG, anomaly)
    trained = train_local(feats, True, CFG, 0)
    assert trained.transitions == feats.transitions and set(PREVIOUS_FEATURES) <= set(trained.used)
    trained.save(tmp_path / "model")
    model = FraudModel.load(tmp_path / "model")  # the artifact carries the table
    assert model.transitions == feats.transitions is not None

    kv = SqliteKV(tmp_path / "kv.sqlite")
    stage = FraudStage(kv, model, "fraud:v1", fraud_config_for({"fraud": CFG.model_dump()}, None), ENC.dim, ring=4)
    online, _ = _stream(stage, kv, frame, anomaly)
    assert np.array_equal(online, feats.X, equal_nan=True)


def test_a_model_trained_before_the_previous_transaction_features_still_scores(frame, tmp_path):
    """An old champion serves with its own feature list, shadows a new challenger, and is swapped for it."""
    old_cfg = FraudConfig(**{**CFG.model_dump(), "previous_transaction_features": False})
    registry_config = {"fraud": {k: v for k, v in old_cfg.model_dump().items() if k != "previous_transaction_features"}}
    old_feats, new_feats = _features(frame, old_cfg), _features(frame, CFG)
    train_local(old_feats, False, old_cfg, 0).save(tmp_path / "old")
    old = FraudModel.load(tmp_path / "old")  # saved as before: no table, the old layout
    assert old.transitions is None and not set(PREVIOUS_FEATURES) & set(old.input_names)
    new = train_local(new_feats, False, CFG, 0)

    served_cfg = fraud_config_for(registry_config, FraudConfig())
    assert served_cfg.previous_transaction_features is False
    assert feature_names(served_cfg) == old.input_names  # batch scoring builds the old row for it
    assert fraud_config_for({"fraud": CFG.model_dump()}, None).previous_transaction_features is True
    kv = SqliteKV(tmp_path / "kv.sqlite")
    stage = FraudStage(kv, old, "fraud:v1", served_cfg, ENC.dim, ring=4)
    stage.set_shadow((new, "fraud:v2"))
    ts = frame["timestamp"]
    first = np.flatnonzero((ts <= ts.quantile(0.5)).to_numpy())
    online, shadow = _stream(stage, kv, frame, np.full(len(frame), np.nan), rows=first)
    assert np.array_equal(online[first], old_feats.X[first], equal_nan=True)
    np.testing.assert_allclose(shadow[first], new.scores(new_feats.X[first]), rtol=0, atol=1e-6)

    stage.swap(new, "fraud:v2")  # promoted: the states kept in the KV carry on with the new model's columns
    stage.set_shadow(None)
    rest = np.setdiff1d(np.arange(len(frame)), first)
    online, _ = _stream(stage, kv, frame, np.full(len(frame), np.nan), rows=rest)
    assert np.array_equal(online[rest], new_feats.X[rest], equal_nan=True)


def test_merchant_risk_rows_read_online_give_the_training_columns_and_the_shadow_keeps_its_anomaly_score(frame,
                                                                                                        tmp_path):
    from fedfraud.training.merchant_risk.config import MerchantRiskConfig
    from fedfraud.training.merchant_risk.features import merchant_names, with_merchant_columns

    risk = MerchantRiskConfig(buckets=64)
    rng = np.random.default_rng(3)
    n_own, width = len(merchant_names(risk)) - 1, len(merchant_names(risk))
    cols = rng.random((len(frame), width)).astype(np.float32)
    cols[rng.random(len(frame)) < 0.3] = np.nan  # rows whose merchant has no risk row: NaN rates, zero counts
    rows = [None if np.isnan(c).all() else {"release_day": 1, "merchant_bank": c[:n_own], "merchant_fed": c[n_own:]}
            for c in cols]
    from fedfraud.training.merchant_risk.features import row_columns

    trained_cols = row_columns(rows, risk)  # what training computes for a bucket with, or without, a row
    anomaly = rng.random(len(frame))
    feats = with_merchant_columns(_features(frame, CFG, anomaly), trained_cols, risk)
    model = train_local(feats, True, CFG, 0)
    assert set(merchant_names(risk)) <= set(model.input_names)
    challenger = train_local(feats, True, CFG.model_copy(update={"seed": 8, "num_boost_round": 5}), 0)
    kv = SqliteKV(tmp_path / "kv.sqlite")
    stage = FraudStage(kv, model, "fraud:v1", fraud_config_for({"fraud": CFG.model_dump()}, None), ENC.dim, ring=4,
                       risk=risk)
    stage.set_shadow((challenger, "fraud:v2"))
    online, shadow = _stream(stage, kv, frame, anomaly, risk_rows=rows)
    assert np.array_equal(online, feats.X, equal_nan=True)
    # the challenger's anomaly score goes to its anomaly_score column, not onto the last merchant column
    np.testing.assert_allclose(shadow, challenger.scores(feats.X), rtol=0, atol=1e-6)


def test_a_hin2vec_model_keeps_its_extra_features() -> None:
    """Serving computes the hin2vec columns (tests/integration/test_hin2vec_serving.py): no refusal any more."""
    trained = {"fraud": CFG.model_copy(update={"extra_features": ("hin2vec",)}).model_dump()}
    assert fraud_config_for(trained, None).extra_features == ("hin2vec",)

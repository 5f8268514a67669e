"""`fedfraud score` and serving share one scorer: identical anomaly scores, on a real Feast (SQLite) store.

A tiny next-event model is trained and published; then bank 0 is scored twice:
by batch scoring (``fedfraud.serving.batch.score_path``) and by the serving stage
(``fedfraud.serving.anomaly_stage.AnomalyStage``) reading and writing cardholder states
through Feast in micro-batches, as the Kafka consumer does.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from fedfraud.cli.app import main
from fedfraud.config import FedfraudConfig
from fedfraud.training.anomaly.config import AnomalyConfig
from fedfraud.training.anomaly.data import load_bank_data
from fedfraud.training.anomaly.engine import evaluate_task, sources_of, train_model
from fedfraud.training.anomaly.model import AnomalyModel
from fedfraud.training.anomaly.run import RoundRecord, publish_run
from fedfraud.training.federated.accountant import dp_off_card
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.feature_store.layout import read_bank
from fedfraud.training.data.synthetic import generate_dataset
from fedfraud.training.registry import ModelRegistry

pytestmark = pytest.mark.integration

CFG = FedfraudConfig()
ANOMALY = AnomalyConfig(max_train_pairs=400, max_test_pairs=60, max_eval_normal=60, batch_size=32)


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    data = tmp_path_factory.mktemp("score-data")
    generate_dataset(data, GeneratorConfig(banks=2, cardholders=40, days=14, seed=5), raw_csv=True, progress=False)
    registry = tmp_path_factory.mktemp("score-registry")
    bank = load_bank_data(data, 0, ANOMALY, CFG.encoder, CFG.privacy, CFG.egograph)
    torch.manual_seed(0)
    model = AnomalyModel(ANOMALY, CFG.encoder, CFG.egograph.max_nodes)
    train_model(model, sources_of([bank], ANOMALY, CFG.egograph.max_nodes), epochs=3, samples_per_epoch=64,
                batch_size=32, lr=3e-3, seed=0)
    publish_run(ModelRegistry(registry), model.state_dict(), mode="centralized", anomaly_cfg=ANOMALY,
                encoder_cfg=CFG.encoder, ego_cfg=CFG.egograph, config={}, history=[
                    RoundRecord(1, 1.0, {0: evaluate_task(model, bank)}, 1.0)], privacy={0: bank.privacy},
                client_dp=dp_off_card("test model, trained in one process"))
    return data, registry


def test_batch_scores_equal_serving_scores(published: tuple[Path, Path], tmp_path: Path) -> None:
    from fedfraud.feature_store.feast_store import apply_repo, open_store
    from fedfraud.feature_store.offline import write_offline
    from fedfraud.feature_store.online import OnlineStateClient
    from fedfraud.feature_store.privacy import PrivateFeaturizer
    from fedfraud.serving.batch import score_path
    from fedfraud.serving.kvstore import open_kv
    from fedfraud.serving.anomaly_stage import AnomalyStage, load_anomaly_scorer

    data, registry = published
    out = tmp_path / "scores.parquet"
    report = score_path(data, registry, out, progress=False)
    batch = pd.read_parquet(out)
    frame0 = read_bank(data, 0)
    assert report.rows == len(batch) == len(frame0) + len(read_bank(data, 1))
    assert list(batch.columns) == ["transaction_id", "cardholder", "bank", "timestamp", "anomaly_score"]
    # a cardholder's first transaction has no G_{t-1}: no score; every other one has a score in [0, 1)
    firsts = batch.sort_values("timestamp").groupby(["bank", "cardholder"]).head(1).index
    assert batch.loc[firsts, "anomaly_score"].isna().all()
    rest = batch.drop(index=firsts)["anomaly_score"]
    assert rest.notna().all() and ((rest >= 0) & (rest < 1)).all()

    features = CFG.features.model_copy(update={"project": "fedfraud_score_test"})
    repo = tmp_path / "repo"
    write_offline(data, repo, CFG.encoder, CFG.privacy, CFG.egograph, features.location_cell_deg, banks=[1],
                  progress=False)
    store = open_store(features, repo, "sqlite")
    apply_repo(store)  # bank 0 is never materialized: serving starts from empty states, as a new bank would
    stage = AnomalyStage(
        OnlineStateClient(store, CFG.egograph, features.location_cell_deg),
        PrivateFeaturizer.for_bank(CFG.encoder, CFG.privacy, 0),
        open_kv(str(tmp_path / "kv.db")),
        load_anomaly_scorer(ModelRegistry(registry)),
        0,
        features.location_cell_deg,
        CFG.egograph.dedupe_ring,
    )
    ordered = frame0.sort_values(["timestamp", "transaction_id"], kind="stable").reset_index(drop=True)
    served: dict[tuple[str, str], float] = {}
    for start in range(0, len(ordered), 64):
        part = ordered.iloc[start : start + 64]
        work, scored = stage.score(part, np.zeros(len(part), dtype=np.int64))
        stage.write(work)
        for c, t, s in zip(scored.cardholder, scored.transaction_id, scored.anomaly_score, strict=True):
            served[(c, t)] = s
    mine = batch[batch["bank"] == 0]
    want = np.array([served[(c, t)] for c, t in zip(mine["cardholder"], mine["transaction_id"], strict=True)])
    got = mine["anomaly_score"].to_numpy()
    assert np.array_equal(np.isnan(want), np.isnan(got))
    np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], rtol=0, atol=1e-6)
    store.teardown()


def test_score_cli_on_a_csv_rejects_bad_rows(published: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    data, registry = published
    raw = data / "raw" / "transactions.csv"
    bad = tmp_path / "with-bad-rows.csv"
    lines = raw.read_text(encoding="utf-8").splitlines()
    header, rows = lines[0], lines[1:300]
    broken = rows[5].split("|")
    amount = header.split("|").index("amt")
    broken[amount] = "not-a-number"
    bad.write_text("\n".join([header, *rows, "|".join(broken)]) + "\n", encoding="utf-8")
    out = tmp_path / "scores.csv"
    assert main(["score", str(bad), "--registry", str(registry), "--out", str(out)]) == 0
    scored = pd.read_csv(out)
    assert len(scored) == len(rows)  # every valid row, and the bad one is not silently dropped:
    rejects = [json.loads(x) for x in (tmp_path / "scores.rejects.jsonl").read_text().splitlines()]
    assert [r["reason"] for r in rejects] == ["bad_amount"]
    assert "rejected 1 rows" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--out", "scores.xlsx"], "--out must end in .csv or .parquet"),
        (["--registry", "no-such-registry"], "no anomaly model in registry"),
    ],
)
def test_score_cli_errors_are_one_line(published, tmp_path, capsys, args, message) -> None:
    data, registry = published
    base = ["score", str(data), "--registry", str(registry), "--out", str(tmp_path / "s.csv")]
    code = main(base + [str(tmp_path / a) if a.startswith(("scores", "no-such")) else a for a in args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0]


def test_batch_scoring_gives_a_merchant_risk_model_the_columns_it_was_trained_on(published, tmp_path) -> None:
    """A fraud model trained with merchant-risk columns: `fedfraud score` replays the releases over the scored
    data and appends them, so its scores are the model's on the training columns (clear release: exact)."""
    import shutil

    from fedfraud.feature_store.privacy import PrivateFeaturizer
    from fedfraud.serving.batch import score_path
    from fedfraud.training.fraud.config import FraudConfig
    from fedfraud.training.fraud.features import build_features
    from fedfraud.training.fraud.train import train_local
    from fedfraud.training.merchant_risk.config import MerchantNoiseConfig
    from fedfraud.training.merchant_risk.features import dataset_columns, with_merchant_columns

    data, source = published
    registry = tmp_path / "registry"
    shutil.copytree(source, registry)
    fcfg = FraudConfig(num_boost_round=10, max_depth=3, nthread=1)
    risk = CFG.merchant_risk.model_copy(update={"buckets": 1024, "label_delay_days": 2})
    clear = MerchantNoiseConfig(noise_multiplier=0.0)
    merchant = dataset_columns(data, CFG.encoder, CFG.privacy, risk, clear)
    frame = read_bank(data, 0)
    private = PrivateFeaturizer.for_bank(CFG.encoder, CFG.privacy, 0).transform(frame)
    feats = with_merchant_columns(build_features(frame, private, fcfg), merchant[0], risk)
    model = train_local(feats, False, fcfg, 0)
    version = model.publish(ModelRegistry(registry), config={
        "fraud": fcfg.model_dump(), "merchant_risk": risk.model_dump(mode="json"),
        "merchant_noise": clear.model_dump(mode="json")}, metrics={})
    ModelRegistry(registry).promote("fraud", version.version, actor="test",
                                    reason="merchant-risk model")

    out = tmp_path / "scores.parquet"
    score_path(data, registry, out, progress=False)
    batch = pd.read_parquet(out)
    mine = batch[batch["bank"] == 0].set_index("transaction_id")
    anomaly = mine.loc[frame["transaction_id"].astype(str), "anomaly_score"].to_numpy()
    expected = model.scores(with_merchant_columns(build_features(frame, private, fcfg, anomaly), merchant[0],
                                                  risk).X)
    got = mine.loc[frame["transaction_id"].astype(str), "fraud_score"].to_numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    assert np.nanstd(merchant[0][:, 0]) > 0  # the columns carry something (the test is not vacuous)


def test_batch_scoring_with_a_gnn_fraud_model_equals_the_offline_graph(published: tuple[Path, Path],
                                                                       tmp_path: Path) -> None:
    """``fedfraud score`` with ``fraud.variant: fedrpda`` (kind ``fraud-gnn``) replays each bank whole through the
    scorer serving uses: its fraud scores equal the offline transaction graph's, row for row.
    """
    import shutil

    from fedfraud.bench.serving import COLUMNS, publish_bench_models
    from fedfraud.feature_store.privacy import PrivateFeaturizer
    from fedfraud.serving.batch import score_path
    from fedfraud.training.fraud.features import build_features
    from fedfraud.training.fraud.gnn.artifact import GnnFraudModel
    from fedfraud.training.fraud.gnn.graph import build_graph

    data, registry = published
    reg = ModelRegistry(shutil.copytree(registry, tmp_path / "registry"))  # the module's registry stays GNN-free
    frame0 = read_bank(data, 0)
    publish_bench_models(reg, frame0[COLUMNS].head(400), CFG)
    out = tmp_path / "gnn.parquet"
    report = score_path(data, reg.root, out, progress=False, fraud_kind="fraud-gnn", chunk_rows=50, workers=2)
    assert report.models["fraud"] == "fraud-gnn:v1"
    scored = pd.read_parquet(out)
    bank0 = scored[scored["bank"] == 0].set_index("transaction_id").loc[frame0["transaction_id"].astype(str)]
    model = GnnFraudModel.from_registry(reg, "latest")
    fcfg = CFG.fraud
    private = PrivateFeaturizer.for_bank(CFG.encoder, CFG.privacy, 0).transform(frame0)
    feats = build_features(frame0, private, fcfg, bank0["anomaly_score"].to_numpy(), transitions=model.transitions)
    offline = model.scores(build_graph(feats, frame0, model.cfg.neighbors, 0))
    np.testing.assert_allclose(bank0["fraud_score"].to_numpy(), offline, rtol=0, atol=1e-5)
    assert set(bank0["decision"]) <= {"fraud", "legit"}
    assert all(len(json.loads(r)) == 3 for r in bank0["top_reasons"])


def test_a_shadowing_challenger_embeds_g_t_alone_and_scores_as_batch_scoring(published: tuple[Path, Path],
                                                                              tmp_path: Path) -> None:
    """Issue 42: the challenger keeps its own q_t in memory, so a shadowed batch embeds each transaction's G_t
    once (no G_{t-1} for a cardholder this stage wrote), and its shadow scores are still the challenger's batch
    scores (``AnomalyScorer.score_frame``, which embeds both graphs), as the champion's are the champion's.
    """
    from fedfraud.feature_store.feast_store import apply_repo, open_store
    from fedfraud.feature_store.online import OnlineStateClient
    from fedfraud.feature_store.privacy import PrivateFeaturizer
    from fedfraud.serving.anomaly_stage import AnomalyStage, load_anomaly_scorer
    from fedfraud.serving.kvstore import open_kv
    from fedfraud.training.anomaly.scorer import AnomalyScorer

    data, registry = published
    features = CFG.features.model_copy(update={"project": "fedfraud_shadow_test"})
    store = open_store(features, tmp_path / "repo", "sqlite")
    apply_repo(store)
    featurizer = PrivateFeaturizer.for_bank(CFG.encoder, CFG.privacy, 0)
    champion = load_anomaly_scorer(ModelRegistry(registry))
    torch.manual_seed(1)  # other weights than the champion's: a mixed-up q_{t-1} would show in the scores
    other = AnomalyModel(ANOMALY, CFG.encoder, CFG.egograph.max_nodes)
    challenger = AnomalyScorer(other, CFG.egograph, tag="anomaly:challenger")
    stage = AnomalyStage(OnlineStateClient(store, CFG.egograph, features.location_cell_deg), featurizer,
                         open_kv(str(tmp_path / "kv.db")), champion, 0, features.location_cell_deg,
                         CFG.egograph.dedupe_ring)
    stage.shadow = challenger
    ordered = read_bank(data, 0).sort_values(["timestamp", "transaction_id"], kind="stable").reset_index(drop=True)
    served: dict[str, tuple[float, float]] = {}
    seen: set[str] = set()
    for start in range(0, len(ordered), 64):
        part = ordered.iloc[start : start + 64]
        work, scored = stage.score(part, np.zeros(len(part), dtype=np.int64))
        stage.write(work)
        assert len(work.graphs) == sum(g >= 0 for g in work.cur_graph)  # G_t only
        # each cardholder written by an earlier batch: its first row here takes both models' kept q_{t-1}
        again = {h for h in work.states if h in seen}
        assert len(work.shadow_prev_cached) == len(work.prev_cached) == len(again)
        seen |= set(work.states)
        assert scored.shadow_anomaly_model == "anomaly:challenger"
        for t, a, s in zip(scored.transaction_id, scored.anomaly_score, scored.shadow_anomaly_score, strict=True):
            served[t] = (a, s)
    ids = ordered["transaction_id"].astype(str)
    for scorer, k in ((champion, 0), (challenger, 1)):
        want = scorer.score_frame(ordered, featurizer)
        got = np.array([served[t][k] for t in ids])
        assert np.array_equal(np.isnan(want), np.isnan(got))
        np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], rtol=0, atol=1e-5)
    store.teardown()

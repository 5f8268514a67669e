"""The supervised federated GNN variants (FedAvg-GNN, FedRPDA and its ablations).

* the bank's transaction graph: past-only typed edges, built without labels, scaler from training rows only;
* FedRPDA's pieces on hand-made numbers: risk intensity, the decaying risk weights, prototypes, L_P;
* each strategy switched off changes exactly its part (server weights / local loss);
* a tiny federated run of every variant (the Flower apps over the loopback grid) scores every test transaction.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import average_precision_score, f1_score

from fedfraud.training.fraud.config import FraudConfig
from fedfraud.training.fraud.features import FraudFeatures
from fedfraud.training.fraud.gnn.artifact import GnnFraudModel
from fedfraud.training.fraud.gnn.config import GnnConfig
from fedfraud.training.fraud.gnn.graph import RELATIONS, TransactionGraph, build_graph, causal_edges
from fedfraud.training.fraud.gnn.model import FraudGNN, InputLayout, node_inputs, relation_paths
from fedfraud.training.fraud.gnn.online import OnlineGraphScorer
from fedfraud.training.fraud.gnn.rpda import (
    FraudStats,
    Prototypes,
    aggregation_weights,
    augment_frauds,
    average_prototypes,
    prototype_loss,
    risk_intensity,
)
from fedfraud.training.fraud.gnn.server_app import pr_auc_from_histograms
from fedfraud.training.fraud.gnn.study import _macro_f1_draws, macro_f1
from fedfraud.training.fraud.gnn.task import build_model, local_train, scaler_sums, state_arrays
from fedfraud.training.fraud.gnn.trainer import VARIANT_JOBS, train_gnn_jobs, variant_job

NAMES = ("amount", "mcc_code", "hour_utc", "n_prior", "anomaly_score")


def _hand_made(labels=(0, 1, 0, 1, 0, 0), split=("train", "train", "test", "train", "test", "valid")):
    """Six transactions: cardholders a/b/c, merchants m/n, timestamps out of file order."""
    frame = pd.DataFrame({
        "transaction_id": ["t0", "t1", "t2", "t3", "t4", "t5"],
        "cardholder_id": ["a", "a", "b", "a", "b", "c"],
        "merchant_id": ["m", "n", "m", "m", "n", "m"],
        "timestamp": pd.to_datetime(["2026-01-01 10:00", "2026-01-01 09:00", "2026-01-01 11:00",
                                     "2026-01-01 12:00", "2026-01-01 08:00", "2026-01-01 13:00"], utc=True),
    })
    X = np.array([[10, 5, 10, 0, np.nan], [20, 7, 9, 1, np.nan], [30, 5, 11, 0, np.nan], [40, 5, 12, 2, np.nan],
                  [50, 7, 8, np.nan, np.nan], [60, 5, 13, 0, np.nan]], dtype=np.float32)
    ids = frame["transaction_id"].to_numpy(dtype=object)
    holders = frame["cardholder_id"].to_numpy(dtype=object)
    feats = FraudFeatures(X, NAMES, ids, holders, np.asarray(labels, dtype=np.float32), np.asarray(split, dtype=object))
    return feats, frame


def test_edges_come_from_the_k_latest_earlier_transactions_of_the_same_cardholder_or_merchant():
    feats, frame = _hand_made()
    g = build_graph(feats, frame, neighbors=2)
    edges = {(RELATIONS[t], int(s), int(d)) for (s, d), t in zip(g.edge_index.T, g.edge_type, strict=True)}
    # replay order by time: t4 (08:00), t1, t0, t2, t3, t5
    card = {("card", 1, 0), ("card", 1, 3), ("card", 0, 3), ("card", 4, 2)}
    merchant = {("merchant", 0, 2), ("merchant", 0, 3), ("merchant", 2, 3), ("merchant", 2, 5), ("merchant", 3, 5),
                ("merchant", 4, 1)}
    assert edges == card | merchant
    assert np.all(g.position[g.edge_index[0]] < g.position[g.edge_index[1]])
    assert repr(g) == "TransactionGraph(bank=0, nodes=6, edges: card=4, merchant=6)"
    with pytest.raises(ValueError, match="same row order"):
        build_graph(feats, frame.iloc[::-1].reset_index(drop=True), neighbors=2)
    with pytest.raises(ValueError, match="earlier transaction"):
        TransactionGraph(feats, g.edge_index[::-1].copy(), g.edge_type, g.position)
    assert causal_edges(np.array(["x", "x", "x"], dtype=object), np.array([2, 0, 1]), 1).tolist() == [[1, 2], [2, 0]]


def test_the_graph_and_its_inputs_do_not_depend_on_labels_or_held_out_rows():
    feats, frame = _hand_made()
    cfg = GnnConfig(layers=2, category_buckets=8)
    g = build_graph(feats, frame, neighbors=2)
    relabelled = FraudFeatures(feats.X, feats.names, feats.transaction_id, feats.cardholder,
                               np.where(feats.split == "train", feats.label, 1 - feats.label).astype(np.float32),
                               feats.split)
    g2 = build_graph(relabelled, frame, neighbors=2)
    np.testing.assert_array_equal(g.edge_index, g2.edge_index)
    layout = InputLayout.of(NAMES, NAMES[:-1])
    # the scaler comes from training rows only: changing held-out rows leaves it as it was
    X = feats.X.copy()
    X[feats.split != "train", 0] *= 1000
    changed = FraudFeatures(X, feats.names, feats.transaction_id, feats.cardholder, feats.label, feats.split)
    a, b = scaler_sums(g, layout), scaler_sums(build_graph(changed, frame, 2), layout)
    np.testing.assert_array_equal(a.total, b.total)
    model = FraudGNN(layout, cfg)
    model.set_scaler(a)
    x1, x2 = node_inputs(model, g), node_inputs(model, g2)
    torch.testing.assert_close(x1, x2)  # labels are never inputs
    assert x1.shape == (6, model.input_width) and len(model.paths) == 6 and relation_paths(1) == [(0,), (1,)]
    # 'card' edges stay within a cardholder, hence within the split (split by cardholder)
    card = g.edge_index[:, g.edge_type == 0]
    assert np.all(feats.cardholder[card[0]] == feats.cardholder[card[1]])
    assert np.all(feats.split[card[0]] == feats.split[card[1]])
    # node 0's 'card' block is the mean of its one past card neighbour (node 1)'s transformed row
    w = model.shared_width
    torch.testing.assert_close(x1[0, model.self_width : model.self_width + w], x1[1, :w])
    assert "FraudGNN(numeric=2, categories=1" in repr(model)


def test_risk_intensity_is_the_mean_fraud_share_around_the_training_frauds():
    # frauds 0, 1, 4; node 3 is not a training node (its label may not be read)
    e = np.array([[0, 1, 2, 3, 0], [1, 2, 3, 4, 4]])
    y = np.array([1, 1, 0, 1, 1], dtype=float)
    labelled = np.array([1, 1, 1, 0, 1], dtype=bool)
    # r(0) = 2/2 (neighbours 1, 4), r(1) = 1/2 (0 fraud, 2 legit), r(4) = 1/1 (0; 3 unlabelled)
    assert risk_intensity(e, y, labelled) == pytest.approx((1 + 0.5 + 1) / 3)
    assert risk_intensity(e, np.zeros(5), labelled) == 0.0  # no frauds
    assert risk_intensity(np.zeros((2, 0), dtype=np.int64), y, labelled) == 0.0  # isolated frauds


def test_risk_weights_decay_to_fedavg_and_are_fedavg_when_off():
    n, h = [100.0, 50.0], [0.5, 0.1]
    np.testing.assert_allclose(aggregation_weights(n, h, 1, alpha=2.0, tau=5.0, risk_aware=True),
                               [100 * (1 + 2 * 0.5), 50 * (1 + 2 * 0.1)])
    w3 = aggregation_weights(n, h, 3, alpha=2.0, tau=5.0, risk_aware=True)
    np.testing.assert_allclose(w3, [100 * (1 + 2 * math.exp(-2 / 5) * 0.5), 50 * (1 + 2 * math.exp(-2 / 5) * 0.1)])
    late = aggregation_weights(n, h, 200, alpha=2.0, tau=5.0, risk_aware=True)
    np.testing.assert_allclose(late / late.sum(), [2 / 3, 1 / 3], atol=1e-9)
    np.testing.assert_array_equal(aggregation_weights(n, h, 1, 2.0, 5.0, risk_aware=False), n)


def test_augmentation_statistics_prototypes_and_prototype_loss():
    torch.manual_seed(0)
    stats = FraudStats()
    h1 = torch.randn(64, 3) + 2.0
    mu, var = stats.update(h1, 0.1)
    torch.testing.assert_close(mu, h1.mean(0))
    h2 = torch.randn(64, 3) - 2.0
    mu2, var2 = stats.update(h2, 0.1)
    torch.testing.assert_close(mu2, 0.9 * h1.mean(0) + 0.1 * h2.mean(0))
    torch.testing.assert_close(var2, 0.9 * h1.var(0, unbiased=False) + 0.1 * h2.var(0, unbiased=False))
    aug = augment_frauds(torch.zeros(2), torch.tensor([4.0, 0.25]), 20000, torch.Generator().manual_seed(1))
    np.testing.assert_allclose(aug.std(0).numpy(), [2.0, 0.5], rtol=0.05)
    protos = torch.tensor([[0.0, 0.0], [3.0, 3.0]])
    near = prototype_loss(torch.tensor([[0.1, 0.0], [2.9, 3.0]]), torch.tensor([0, 1]), protos)
    far = prototype_loss(torch.tensor([[2.9, 3.0], [0.1, 0.0]]), torch.tensor([0, 1]), protos)
    assert near < 0.1 < far
    avg = average_prototypes([Prototypes(np.array([[0.0], [1.0]]), np.array([10.0, 1.0])),
                              Prototypes(np.array([[2.0], [3.0]]), np.array([30.0, 3.0]))])
    assert avg is not None
    np.testing.assert_allclose(avg.vectors, [[1.5], [2.5]])
    assert average_prototypes([Prototypes(np.zeros((2, 1)), np.array([5.0, 0.0]))]) is None  # no fraud yet


def test_metrics_of_the_comparison():
    rng = np.random.default_rng(0)
    y = rng.random(300) < 0.1
    d = rng.random(300) < 0.15
    assert macro_f1(y, d) == pytest.approx(f1_score(y, d, average="macro"))
    codes = rng.integers(0, 40, 300)
    ones = np.ones((1, 40))
    assert _macro_f1_draws(y, d, codes, ones)[0] == pytest.approx(macro_f1(y, d))
    twice = np.where(np.arange(40) == 3, 2.0, 1.0)[None, :]
    assert _macro_f1_draws(y, d, codes, twice)[0] == pytest.approx(macro_f1(y, d, twice[0, codes]))
    s = rng.random(300)
    pos, neg = np.histogram(s[y], 50, (0, 1))[0], np.histogram(s[~y], 50, (0, 1))[0]
    binned = np.floor(s * 50) / 50
    assert pr_auc_from_histograms(pos, neg) == pytest.approx(average_precision_score(y, binned))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Two banks of a small generated dataset: features as the XGBoost path builds them, and their graphs."""
    from fedfraud.config import load_config
    from fedfraud.feature_store.layout import list_banks, read_bank
    from fedfraud.training.data.config import GeneratorConfig
    from fedfraud.training.data.synthetic import generate_dataset
    from fedfraud.training.fraud.dataset import bank_features

    root = tmp_path_factory.mktemp("gnn")
    generate_dataset(root, GeneratorConfig(banks=2, cardholders=70, days=21, fraud_rate=0.05, seed=5), raw_csv=False,
                     progress=False)
    cfg = load_config(None, ["fraud.gnn.rounds=2", "fraud.gnn.engine=loopback", "fraud.gnn.hidden=16",
                             "fraud.threshold_bins=100"])
    graphs, frames = {}, {}
    for b in list_banks(root):
        feats = bank_features(root, b, cfg.fraud, cfg.encoder, cfg.privacy, None)
        frames[b] = read_bank(root, b)
        graphs[b] = build_graph(feats, frames[b], cfg.fraud.gnn.neighbors, b)
    return cfg.fraud, graphs, frames


@pytest.fixture(scope="module")
def trained(tiny):
    """Every variant trained over the tiny banks in one session (the Flower apps over the loopback grid)."""
    cfg, graphs, _ = tiny
    jobs = [variant_job(v, 0) for v in VARIANT_JOBS]
    return jobs, train_gnn_jobs(graphs, cfg, jobs, use_anomaly_score=False)


def test_switching_diversified_risk_augmentation_off_changes_only_the_local_loss(tiny):
    cfg, graphs, _ = tiny
    g = graphs[0]
    used = tuple(n for n in g.features.names if n != "anomaly_score")

    def run(gcfg: GnnConfig, protos: np.ndarray | None):
        model = build_model(g.features.names, used, gcfg, 0)
        model.set_scaler(scaler_sums(g, model.layout))
        result = local_train(model, g, gcfg, 2, protos, FraudStats(), seed=3)
        return result, state_arrays(model)

    protos = np.random.default_rng(0).normal(size=(2, cfg.gnn.hidden))
    off = cfg.gnn.model_copy(update={"diversified_risk_augmentation": False})
    on = cfg.gnn.model_copy(update={"diversified_risk_augmentation": True, "prototype_weight": 1.0})
    a, wa = run(off, None)
    b, wb = run(off, protos)  # off: the global prototypes are ignored
    c, wc = run(on, protos)
    assert a.loss_p == b.loss_p == 0.0 and c.loss_p > 0
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)
    assert any(not np.array_equal(wa[k], wc[k]) for k in wa)
    assert a.risk == c.risk > 0  # the risk intensity is structural: no strategy changes it
    assert a.prototypes.counts.sum() == int(g.mask("train").sum())
    # the risk-aware switch is server-side only: a bank's local round is the same with it on or off
    d, wd = run(off.model_copy(update={"risk_aware_aggregation": not off.risk_aware_aggregation}), None)
    assert all(np.array_equal(wa[k], wd[k]) for k in wa) and d.loss_ce == a.loss_ce


def test_tiny_federated_run_of_every_variant_scores_every_test_transaction(tiny, trained, tmp_path):
    cfg, graphs, _ = tiny
    jobs, models = trained
    tests = {b: g.mask("test") for b, g in graphs.items()}
    n_test = sum(int(m.sum()) for m in tests.values())
    assert n_test > 50
    for job in jobs:
        model = models[job.name]
        assert model.variant == job.name.split("#")[0] and 0.0 <= model.threshold <= 1.0
        assert "anomaly_score" not in model.used and model.meta["engine"] == "loopback"
        scores = np.concatenate([model.scores(graphs[b], tests[b]) for b in sorted(graphs)])
        assert scores.shape == (n_test,) and np.all((scores >= 0) & (scores <= 1))
        assert len(model.meta["round_weights"]) == cfg.gnn.rounds
    weights = {v: np.asarray(models[f"{v}#0"].meta["round_weights"]) for v in VARIANT_JOBS}
    risks = models["fedrpda#0"].meta["risk_intensity"]
    examples = np.asarray([int(graphs[b].mask("train").sum()) for b in sorted(graphs)], dtype=float)
    # risk-aware aggregation off: FedAvg's weights (training-node counts) in every round
    for v in ("fedavg-gnn", "fedrpda-no-ra"):
        np.testing.assert_allclose(weights[v], np.tile(examples / examples.sum(), (cfg.gnn.rounds, 1)))
    # on: the paper's mapping of the banks' risk intensities, round by round
    for v in ("fedrpda", "fedrpda-no-dra"):
        for t in range(cfg.gnn.rounds):
            w = aggregation_weights(examples, risks, t + 1, cfg.gnn.risk_alpha, cfg.gnn.risk_tau, True)
            np.testing.assert_allclose(weights[v][t], w / w.sum())
    # the prototype loss appears from round 2, only with the diversified-risk strategy on
    for v, (_, dra) in VARIANT_JOBS.items():
        losses = models[f"{v}#0"].meta["round_loss_p"]
        assert losses[0] == 0.0 and (losses[1] > 0) == dra
    # the registry form scores the same
    models["fedrpda#0"].save(tmp_path / "m")
    again = GnnFraudModel.load(tmp_path / "m")
    np.testing.assert_allclose(again.scores(graphs[0]), models["fedrpda#0"].scores(graphs[0]), rtol=0, atol=1e-6)
    assert again.cfg == models["fedrpda#0"].cfg and again.threshold == models["fedrpda#0"].threshold


def test_unknown_variant_and_config_are_refused():
    with pytest.raises(ValueError, match="choose from fedavg-gnn, fedrpda"):
        variant_job("fedmagic")
    assert FraudConfig(variant="fedrpda").gnn.risk_aware_aggregation
    with pytest.raises(ValueError):
        GnnConfig(neighbours=3)  # type: ignore[call-arg]


def test_one_transaction_at_a_time_scores_as_the_offline_graph(tiny, trained):
    cfg, graphs, frames = tiny
    model = trained[1]["fedrpda#0"]
    g, frame = graphs[1], frames[1]
    order = np.argsort(g.position)  # arrival order: timestamp, then transaction id
    scorer = OnlineGraphScorer(model)
    online = scorer.score_batch(g.features.X[order], frame["cardholder_id"].astype(str).to_numpy()[order],
                                frame["merchant_id"].astype(str).to_numpy()[order])
    np.testing.assert_allclose(online, model.scores(g)[order], rtol=0, atol=1e-5)
    assert "OnlineGraphScorer(k=5, layers=2" in repr(scorer)
    assert all(len(q) <= cfg.gnn.neighbors for q in scorer.recent[0].values())
    one = scorer.score(g.features.X[order[0]], "someone-new", "somewhere-new")
    assert 0.0 <= one <= 1.0


@pytest.mark.parametrize("variant", ["fedrpda", "fedavg-gnn"])
def test_serving_decides_with_the_gnn_as_the_offline_graph_scores(tiny, trained, tmp_path, variant):
    """The fraud stage of a replica deployed with ``fraud.variant: <variant>``: micro-batches of a bank, the
    neighbourhoods written to and read back from the KV store between them, give the offline graph's scores, and
    each decision record has XGBoost's shape (score, decision, top reasons, the model tags).
    """
    from fedfraud.feature_store.encoders import timestamps_us
    from fedfraud.feature_store.privacy import PrivateFeaturizer
    from fedfraud.serving.fraud_stage import FraudStage, fraud_config_for, load_fraud_model
    from fedfraud.serving.graph_fraud import GNN_TABLES, fraud_kind
    from fedfraud.serving.kvstore import SqliteKV
    from fedfraud.serving.scored import ScoredBatch
    from fedfraud.training.registry import ModelRegistry

    cfg, graphs, frames = tiny
    bank = 1
    g, frame = graphs[bank], frames[bank]
    trained_model = trained[1][f"{variant}#0"]
    trained_model.transitions = g.features.transitions  # what publishing does with the serving bank's table
    version = trained_model.publish(ModelRegistry(tmp_path / "reg"), config={"fraud": cfg.model_dump()}, metrics={})
    assert fraud_kind(variant) == version.kind == "fraud-gnn" and fraud_kind("federated") == "fraud"
    model, tag = load_fraud_model(ModelRegistry(tmp_path / "reg"), "latest", fraud_kind(variant))
    assert tag == "fraud-gnn:v1" and model.transitions == g.features.transitions

    from fedfraud.config import load_config

    full = load_config(None, [])
    featurizer = PrivateFeaturizer.for_bank(full.encoder, full.privacy, bank)
    kv = SqliteKV(tmp_path / "kv.sqlite")
    stage = FraudStage(kv, model, tag, fraud_config_for({"fraud": cfg.model_dump()}, None), full.encoder.dim, ring=4,
                       reasons_for="all")
    ts = timestamps_us(frame["timestamp"])
    arrival = np.lexsort((frame["transaction_id"].to_numpy(), ts))
    scores = np.full(len(frame), np.nan)
    for start in range(0, len(arrival), 9):
        idx = arrival[start:start + 9]
        part = frame.iloc[idx]
        private = featurizer.transform(part)
        scored = ScoredBatch("test", part["transaction_id"].tolist(), list(private.cardholder), ts[idx].tolist(),
                             part["amount"].tolist(), part["mcc"].astype(str).tolist(), private.merchant,
                             private.location, private.time, np.full(len(idx), np.nan), np.zeros(len(idx), bool),
                             np.zeros(len(idx), dtype=np.int64), "anomaly:v1",
                             merchant_hash=featurizer.merchant_hash(part["merchant_id"]))
        decided = stage.decide(scored)
        kv.put_tables(decided.kv_writes())  # what the hot path writes between micro-batches
        scores[idx] = [r["score"] for r in decided.records]
    np.testing.assert_allclose(scores, model.scores(g), rtol=0, atol=1e-5)
    assert {t for t, rows in decided.kv_writes() if rows} == {"fraud", *GNN_TABLES}
    record = decided.records[-1]
    assert record["models"] == {"anomaly": "anomaly:v1", "fraud": "fraud-gnn:v1"}
    assert record["decision"] == ("fraud" if record["score"] >= model.threshold else "legit")
    reasons = record["top_reasons"]
    assert len(reasons) == 3 and all(set(r) == {"feature", "value", "contribution"} for r in reasons)
    assert {r["feature"] for r in reasons} <= {*model.used, "hour_utc", "card_neighbours", "merchant_neighbours"}
    # a redelivered transaction is re-emitted from the ring, its neighbourhoods untouched
    again = stage.decide(scored)
    assert again.records[-1] == {**record, "redelivered": True} and not again.tables


def test_a_damaged_neighbourhood_costs_its_key_its_neighbours_never_the_batch(tiny, trained, tmp_path, caplog):
    """Garbage, a truncated row, or another model's row in ``gnn_card``: the stage logs it, decides every
    transaction from an empty neighbourhood for that key, and writes a good row back.
    """
    from fedfraud.serving.graph_fraud import GNN_TABLES, GraphDecisions
    from fedfraud.serving.kvstore import SqliteKV

    _, graphs, _ = tiny
    model = trained[1]["fedrpda#0"]
    g = graphs[0]
    rows = g.features.X[:3]
    holders = ["card-a", "card-b", "card-c"]
    merchants = ["m1", "m2", "m3"]
    def rows_of(tag: str, name: str) -> dict[str, bytes]:
        writes = GraphDecisions(SqliteKV(tmp_path / name)).decide(model, tag, rows, holders, merchants, 3, "all")[1]
        return dict(writes[0][1])

    v0, v1 = rows_of("fraud-gnn:v0", "kv0.sqlite"), rows_of("fraud-gnn:v1", "kv1.sqlite")
    kv = SqliteKV(tmp_path / "kv.sqlite")
    kv.put_many(GNN_TABLES[0], [("card-a", b"\x00garbage"), ("card-b", v1["card-b"][:-5]), ("card-c", v0["card-c"])])
    fresh = GraphDecisions(SqliteKV(tmp_path / "kv2.sqlite")).decide(model, "fraud-gnn:v1", rows, holders, merchants,
                                                                     3, "all")[0]
    with caplog.at_level("WARNING"):
        decisions, writes = GraphDecisions(kv).decide(model, "fraud-gnn:v1", rows, holders, merchants, 3, "all")
    assert [d.score for d in decisions] == pytest.approx([d.score for d in fresh], abs=1e-6)
    # garbage and a truncated row are logged; another model's row is not damage: it starts empty, silently
    assert sum("corrupt_gnn_state" in r.message for r in caplog.records) == 2
    written = dict(writes[0][1])
    assert set(written) == set(holders) and all(b.count(b"fraud-gnn:v1") == 1 for b in written.values())


# ---------------------------------------------------------------------------------------- aggregation: dsfl

#: Laplace scales 1e-6 on the selected tenth of the coordinates and 2.0 on the others (tests/unit/dsfl_wire.py).
DSFL = {"l1_clip": 1e-2, "epsilon_top": 1e4, "epsilon_rest": 5e-3, "epsilon_select": 0.1, "top_fraction": 0.1,
        "seed": 17}


@pytest.fixture(scope="module")
def dsfl_run(tiny):
    """FedRPDA under ``aggregation: dsfl`` over the tiny banks, every train message and reply recorded."""
    from tests.unit.dsfl_wire import recorded_train_messages

    cfg, graphs, _ = tiny
    gnn = GnnConfig.model_validate({**cfg.gnn.model_dump(), "aggregation": "dsfl", "dsfl": DSFL})
    fc = cfg.model_copy(update={"gnn": gnn})
    with recorded_train_messages() as pairs:
        models = train_gnn_jobs(graphs, fc, [variant_job("fedrpda", 0)], use_anomaly_score=False)
    return fc, models["fedrpda#0"], sorted(pairs, key=lambda p: (int(p[0].content["config"]["server-round"]),
                                                                 p[0].metadata.dst_node_id))


def test_dsfl_gnn_banks_send_clipped_noised_updates_the_server_weighs_them_and_the_card_states_epsilon(
        tiny, dsfl_run, tmp_path):
    from fedfraud.training.federated.config import DSFLConfig
    from fedfraud.training.federated.dsfl_mod import DSFL_KEY
    from fedfraud.training.fraud.gnn.task import SCALER_ARRAYS
    from fedfraud.training.registry import ModelRegistry
    from tests.unit.dsfl_wire import assert_dp_off, assert_dsfl_card, assert_laplace_reports, assert_released

    fc, model, pairs = dsfl_run
    cfg, banks, rounds = fc.gnn.dsfl, len(tiny[1]), fc.gnn.rounds
    assert len(pairs) == banks * rounds
    assert all(DSFLConfig.model_validate_json(str(m.content["config"][DSFL_KEY])) == cfg for m, _ in pairs)
    n = assert_laplace_reports(pairs, cfg, SCALER_ARRAYS)
    weights = assert_released(pairs[:banks], pairs[banks][0])
    np.testing.assert_allclose(model.meta["round_weights"][0], weights)
    assert "prototypes" in pairs[banks][0].content  # FedRPDA's side channel flows as before
    version = model.publish(ModelRegistry(tmp_path / "reg"), config={}, metrics={})
    assert_dsfl_card(version, cfg, rounds, banks, n, "prototypes", "mean, std")
    # without DSFL the card says DP is off; a DSFL model without its accountant's entry is refused
    plain = GnnFraudModel(model.arrays, model.names, model.used, GnnConfig(), model.threshold, model.variant)
    assert_dp_off(plain.publish(ModelRegistry(tmp_path / "off"), config={}, metrics={}))
    with pytest.raises(ValueError, match="client_dp"):
        GnnFraudModel(model.arrays, model.names, model.used, fc.gnn, model.threshold, model.variant).publish(
            ModelRegistry(tmp_path / "bad"), config={}, metrics={})

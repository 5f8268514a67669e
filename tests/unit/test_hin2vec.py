"""G-HIN2Vec (thesis ch. 3): the loss, the hetero ego graph, one embedding path for batch and incremental use,
the fraud columns, the registry round trip and (long) a federated run that publishes a ``hin2vec`` model."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from fedfraud.config import FedfraudConfig
from fedfraud.feature_store.cardholder import prepare_batch
from fedfraud.feature_store.privacy import PrivateFeaturizer
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.training.data.synthetic import generate_frame
from fedfraud.training.embeddings.config import Hin2VecConfig
from fedfraud.training.embeddings.embed import causal_embeddings, embed_cardholders, embedding_names, sample_graphs
from fedfraud.training.embeddings.graph import EDGE_TYPES, HinGraph, HinState, collate
from fedfraud.training.embeddings.model import Hin2Vec, double_triplet_loss, sample_triplets
from fedfraud.training.registry import ModelRegistry

CFG = FedfraudConfig()
H = Hin2VecConfig(hidden=16, dim=8, context=8)


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    got, _ = generate_frame(GeneratorConfig(banks=1, cardholders=12, days=20, seed=5))
    return got.reset_index(drop=True)


@pytest.fixture(scope="module")
def featurizer() -> PrivateFeaturizer:
    return PrivateFeaturizer.for_bank(CFG.encoder, CFG.privacy, 0)


def _model(seed: int = 0) -> Hin2Vec:
    torch.manual_seed(seed)
    return Hin2Vec(H, CFG.encoder.dim).eval()


def test_double_triplet_loss_by_hand() -> None:
    # instance 1: node [0.2² − 0.9² + 1]₊ = 0.23, path [0.5² − 0.1² + 0.6]₊ = 0.84
    # instance 2: node [0.1² − 1.0² + 1]₊ = 0.01, path [0.0² − 1.0² + 0.6]₊ = 0 (clipped)
    got = double_triplet_loss(torch.tensor([0.2, 0.1]), torch.tensor([0.9, 1.0]), torch.tensor([0.5, 0.0]),
                              torch.tensor([0.1, 1.0]), alpha_node=1.0, alpha_graph=0.6)
    assert float(got) == pytest.approx((0.23 + 0.84 + 0.01 + 0.0) / 2)


def test_hetero_graph_types_and_edges(frame: pd.DataFrame, featurizer: PrivateFeaturizer) -> None:
    holder = frame["cardholder_id"].iloc[0]
    rows = frame[frame["cardholder_id"] == holder]
    batch = prepare_batch(rows, featurizer)
    state = HinState(CFG.egograph)
    assert state.graph(H.merchant_buckets, H.cell_deg) is None  # no merchant yet
    for i in range(len(batch)):
        state.apply(batch, i)
    g = state.graph(H.merchant_buckets, H.cell_deg)
    assert isinstance(g, HinGraph)
    assert g.num_merchants == state.ego.num_nodes
    assert len(g.next_src) == state.ego.num_edges
    assert set(g.category.tolist()) <= set(range(32)) and len(g.category) == len(set(g.category.tolist()))
    b = collate([g, g])
    assert set(b.edge_index) == set(EDGE_TYPES)
    assert b.edge_index[("cardholder", "visits", "merchant")].shape[1] == 2 * g.num_merchants
    # redelivery changes nothing
    assert not state.apply(batch, len(batch) - 1)


def test_no_cardholder_identifier_in_the_model(frame: pd.DataFrame, featurizer: PrivateFeaturizer) -> None:
    """The thesis's W_G (one row per cardholder) is replaced by an inductive encoder: no parameter is sized by the
    number of cardholders, and a graph carries numbers only (no pseudonym, no raw id)."""
    graphs, ids = sample_graphs(frame, featurizer, CFG.egograph, H.merchant_buckets, H.cell_deg, True, 2,
                                np.random.default_rng(0))
    for g in graphs:
        for f in dataclasses.fields(g):
            assert getattr(g, f.name).dtype.kind in "fi", f.name
    shapes = {k: tuple(v.shape) for k, v in _model().state_dict().items()}
    again = {k: tuple(v.shape) for k, v in Hin2Vec(H, CFG.encoder.dim).state_dict().items()}
    assert shapes == again
    assert all(len(set(ids)) not in s for s in shapes.values())
    # a graph's embedding depends on that graph only: the same graph among other graphs embeds the same
    model = _model()
    alone = embed_cardholders(model, [graphs[0]])
    among = embed_cardholders(model, [graphs[3], graphs[0], graphs[1]])[1:2]
    np.testing.assert_allclose(alone, among, rtol=1e-5, atol=1e-6)


def test_batch_equals_incremental_and_is_deterministic(frame: pd.DataFrame, featurizer: PrivateFeaturizer) -> None:
    model = _model()
    frame = frame[frame["cardholder_id"].isin(frame["cardholder_id"].unique()[:3])].reset_index(drop=True)
    batch_rows = causal_embeddings(frame, featurizer, model, CFG.egograph, chunk=64)
    assert np.array_equal(batch_rows, causal_embeddings(frame, featurizer, model, CFG.egograph, chunk=500),
                          equal_nan=True)
    # the incremental path: micro-batches in event order, one state per cardholder, embed before each transaction
    ordered = frame.sort_values(["timestamp", "transaction_id"], kind="stable")
    states: dict[str, HinState] = {}
    incremental = np.full_like(batch_rows, np.nan)
    for a in range(0, len(ordered), 7):
        micro = ordered.iloc[a:a + 7]
        prepared = prepare_batch(micro, featurizer)
        for i, pos in enumerate(micro.index.to_numpy()):
            state = states.setdefault(prepared.cardholder[i], HinState(CFG.egograph))
            incremental[pos] = embed_cardholders(model, [state])[0]
            state.apply(prepared, i)
    np.testing.assert_allclose(incremental, batch_rows, rtol=1e-5, atol=1e-6)
    first = ~frame.duplicated("cardholder_id")
    assert np.isnan(batch_rows[first.to_numpy()]).all()  # a first transaction has no graph before it
    assert np.isfinite(batch_rows[~first.to_numpy()]).all()


def test_training_lowers_the_loss(frame: pd.DataFrame, featurizer: PrivateFeaturizer) -> None:
    from fedfraud.training.embeddings.federated.task import evaluate_graphs, train_graphs

    graphs, _ = sample_graphs(frame, featurizer, CFG.egograph, H.merchant_buckets, H.cell_deg, True, 4,
                              np.random.default_rng(1))
    model = _model()
    before = evaluate_graphs(model, graphs, H, seed=3)["loss"]
    train_graphs(model, graphs, H.model_copy(update={"local_epochs": 4}), seed=0)
    after = evaluate_graphs(model, graphs, H, seed=3)["loss"]
    assert after < before
    s = sample_triplets(collate(graphs[:4]), H, np.random.default_rng(0))
    assert s.src.shape == (2 * 4 * H.negatives, H.walk_length)


def test_publish_load_round_trip_and_fraud_columns(tmp_path: Path, frame: pd.DataFrame,
                                                   featurizer: PrivateFeaturizer) -> None:
    from fedfraud.training.embeddings.features import with_embeddings
    from fedfraud.training.embeddings.publish import load_hin2vec, publish_hin2vec
    from fedfraud.training.fraud.features import build_features

    model = _model(3)
    version = publish_hin2vec(ModelRegistry(tmp_path), model.state_dict(), H, CFG.encoder.dim, {}, {}, {})
    assert version.tag == "hin2vec:v1"
    loaded = load_hin2vec(tmp_path)
    cols = causal_embeddings(frame, featurizer, loaded.model, CFG.egograph)
    np.testing.assert_array_equal(cols, causal_embeddings(frame, featurizer, model, CFG.egograph))
    base = build_features(frame, featurizer.transform(frame), CFG.fraud)
    feats = with_embeddings(base, cols)
    assert feats.names[-H.dim:] == embedding_names(H.dim) and feats.X.shape == (len(frame), len(base.names) + H.dim)


@pytest.mark.long
def test_federated_run_publishes_a_hin2vec_model(tmp_path: Path) -> None:
    from fedfraud.training.data.synthetic import generate_dataset
    from fedfraud.training.embeddings.trainer import train_embeddings

    data = tmp_path / "data"
    generate_dataset(data, GeneratorConfig(banks=2, cardholders=40, days=20, seed=3), raw_csv=False, progress=False)
    result = train_embeddings(data, tmp_path / "registry", H.model_copy(update={"rounds": 2}), CFG.encoder,
                              CFG.privacy, CFG.egograph)
    assert result["version"] == "hin2vec:v1" and result["banks"] == 2
    published = ModelRegistry(tmp_path / "registry").get("hin2vec")
    assert published.metrics["rounds"] == 2 and 0.0 <= published.metrics["test_node_triplet_acc"] <= 1.0


def test_bench_metrics_by_hand() -> None:
    from fedfraud.bench.hin2vec import f1_macro
    from fedfraud.bench.hin2vec_attacks import linkage_top1

    y = np.array([1, 1, 0, 0, 0], dtype=bool)
    d = np.array([1, 0, 1, 0, 0], dtype=bool)
    # fraud F1: tp 1, fp 1, fn 1 -> 0.5; legit F1: tn 2, fn 1, fp 1 -> 4/6; a doubled row counts twice
    assert f1_macro(y, d, np.ones(5)) == pytest.approx((0.5 + 4 / 6) / 2)
    assert f1_macro(y, d, np.array([2.0, 1, 1, 1, 1])) == pytest.approx((4 / 6 + 4 / 6) / 2)
    first = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    second = np.array([[0.9, 0.1], [1.0, 0.2], [0.5, 0.6]])  # row 1's nearest first-period row is row 0: a miss
    np.testing.assert_array_equal(linkage_top1(first, second), [1.0, 0.0, 1.0])

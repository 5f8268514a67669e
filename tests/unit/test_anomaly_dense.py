"""The encoder's dense inference path gives the sparse PyG path's embeddings; training still runs the sparse path."""

import pytest
import torch
from torch_geometric.data import Data

from fedfraud.feature_store.config import EncoderConfig
from fedfraud.feature_store.events import SUMMARY_SIZE
from fedfraud.training.anomaly.config import AnomalyConfig
from fedfraud.training.anomaly.dense import pad_graphs
from fedfraud.training.anomaly.model import AnomalyModel, GraphEncoder, collate_graphs, embed_graphs

ENC = EncoderConfig(dim=16, merchant_buckets=256)
MAX_NODES = 32


def _graph(gen: torch.Generator, n: int, edges: int, repeat: int = 0) -> Data:
    """A random ego-graph snapshot: ``repeat`` of its edges duplicated, self-loops drawn like any edge."""
    edge_index = torch.randint(0, n, (2, edges), generator=gen)
    if repeat:
        edge_index = torch.cat([edge_index, edge_index[:, :repeat]], dim=1)
    e = edge_index.shape[1]
    return Data(
        x=torch.randn(n, ENC.dim, generator=gen),
        edge_index=edge_index,
        edge_attr=torch.randn(e, ENC.dim, generator=gen),
        merchant=torch.randint(0, ENC.merchant_buckets, (n,), generator=gen),
        history=torch.randn(1, SUMMARY_SIZE, generator=gen),
        num_nodes=n,
    )


def _graphs(seed: int, sizes: list[int]) -> list[Data]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for n in sizes:
        edges = int(torch.randint(0, 2 * n + 1, (1,), generator=gen)) if n > 1 else int(seed % 2)
        out.append(_graph(gen, n, edges, repeat=min(edges, 3)))
    return out


def _model(cfg: AnomalyConfig, seed: int = 0) -> AnomalyModel:
    """Xavier init plus noise on every parameter: non-zero biases and pooling vectors, as after training."""
    torch.manual_seed(seed)
    model = AnomalyModel(cfg, ENC, MAX_NODES)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model.eval()


def _both(model: AnomalyModel, graphs: list[Data], monkeypatch: pytest.MonkeyPatch) -> tuple[torch.Tensor, ...]:
    """(dense, sparse) embeddings of one batch; fails unless each comes from the path it claims."""
    batch = collate_graphs(graphs)
    with torch.no_grad():
        model.encoder.allow_dense = False  # the switch a benchmark flips to time the sparse path
        try:
            assert not model.encoder.dense_applies()
            sparse = model.embed(batch).q
        finally:
            model.encoder.allow_dense = True
    with monkeypatch.context() as m:
        m.setattr(GraphEncoder, "_sparse_levels", lambda *a: pytest.fail("dense path expected"))
        with torch.no_grad():
            assert model.encoder.dense_applies()
            dense = model.embed(batch).q
    return dense, sparse


SIZES = {
    "one node": [1],
    "two nodes": [2],
    "full": [32],
    "mixed": [1, 2, 3, 5, 8, 13, 21, 32, 32, 7, 1, 16, 31],
    "many": [int(s) for s in torch.randint(1, 33, (64,), generator=torch.Generator().manual_seed(3))],
}
CONFIGS = {
    "default": AnomalyConfig(),
    "three layers": AnomalyConfig(layers=3, hidden=32),
    "thesis-newest": AnomalyConfig(readout="thesis-newest", layers=3, hidden=16),
    "ratio 0.3": AnomalyConfig(ratio=0.3, hidden=24),
    "ratio 1 (PyG keeps int(1) node)": AnomalyConfig(ratio=1.0, hidden=16),
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("sizes", sorted(SIZES))
def test_dense_matches_sparse(config, sizes, monkeypatch):
    model = _model(CONFIGS[config], seed=len(sizes))
    for seed in range(3):
        dense, sparse = _both(model, _graphs(seed, SIZES[sizes]), monkeypatch)
        assert dense.shape == sparse.shape == (len(SIZES[sizes]), model.encoder.out_dim)
        torch.testing.assert_close(dense, sparse, atol=1e-5, rtol=1e-5)


def test_embed_graphs_uses_dense_path_and_splits_batches(monkeypatch):
    """The scorer's entry point (``AnomalyScorer.embed`` calls it) gets the dense path, batch after batch."""
    model = _model(AnomalyConfig())
    graphs = _graphs(5, SIZES["many"])
    _, sparse = _both(model, graphs, monkeypatch)
    with monkeypatch.context() as m:
        m.setattr(GraphEncoder, "_sparse_levels", lambda *a: pytest.fail("dense path expected"))
        q = embed_graphs(model, graphs, batch_size=10)
    torch.testing.assert_close(q, sparse, atol=1e-5, rtol=1e-5)


def test_adjacency_adds_duplicate_and_reverse_edges_and_the_remaining_self_loops():
    """``to_undirected`` with unit weights (duplicates and a reverse pair add up, a self-loop counts twice), then
    ``add_remaining_self_loops``: weight 1 where a real node has no loop, none on padding."""
    x = torch.zeros(4, 2)
    edge_index = torch.tensor([[0, 0, 1, 2], [1, 1, 0, 2]])  # graph 0: nodes 0-2; graph 1: node 3, no edges
    g = pad_graphs(x, edge_index, torch.tensor([0, 0, 0, 1]), 2)
    assert g.adj.shape == (2, 3, 3) and g.mask.tolist() == [[True, True, True], [True, False, False]]
    assert g.adj[0].tolist() == [[1, 3, 0], [3, 1, 0], [0, 0, 2]]
    assert g.adj[1].tolist() == [[1, 0, 0], [0, 0, 0], [0, 0, 0]]


def test_training_mode_takes_the_sparse_path_and_gradients_flow(monkeypatch):
    model = _model(AnomalyConfig()).train()
    calls = []
    sparse_levels = GraphEncoder._sparse_levels
    monkeypatch.setattr(GraphEncoder, "_sparse_levels", lambda *a: calls.append(1) or sparse_levels(*a))
    monkeypatch.setattr(GraphEncoder, "_dense_levels", lambda *a: pytest.fail("sparse path expected"))
    assert not model.encoder.dense_applies()
    with torch.no_grad():  # eval + no_grad are both needed
        assert not model.encoder.dense_applies()
    model.encoder.convs[0].lin.weight.grad = None
    model.embed(collate_graphs(_graphs(1, [5, 9, 32]))).q.sum().backward()
    assert calls == [1]
    grad = model.encoder.convs[0].lin.weight.grad
    assert grad is not None and grad.abs().sum() > 0
    assert model.encoder.pools[0].op.select.weight.grad is not None


def test_batches_above_the_dense_limit_take_the_sparse_path(monkeypatch):
    model = _model(AnomalyConfig())
    graphs = _graphs(9, [4] * (GraphEncoder.DENSE_MAX_GRAPHS + 1))
    monkeypatch.setattr(GraphEncoder, "_dense_levels", lambda *a: pytest.fail("sparse path expected"))
    with torch.no_grad():
        assert model.embed(collate_graphs(graphs)).q.shape[0] == len(graphs)


@pytest.mark.parametrize("pooling", ["sag", "asap", "diffpool", "kmeans-max"])
def test_poolings_without_a_dense_form_keep_the_sparse_path(pooling):
    model = _model(AnomalyConfig(pooling=pooling, hidden=16))
    with torch.no_grad():
        assert not model.encoder.dense_applies()


def test_dense_op_count_does_not_grow_with_the_batch():
    """The point of the dense path: a constant number of torch ops per call, fewer than the sparse path's."""
    from fedfraud.bench.encoder import count_torch_ops

    model = _model(AnomalyConfig())
    small, large = _graphs(7, [3, 30]), _graphs(8, SIZES["many"])
    dense = [count_torch_ops(lambda g=g: embed_graphs(model, g)) for g in (small, large)]
    model.encoder.allow_dense = False
    sparse = count_torch_ops(lambda: embed_graphs(model, small))
    assert dense[0] == dense[1] < sparse

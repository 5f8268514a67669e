"""Negative sampling gives valid, reproducible graphs and respects each configuration's contract."""

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from fedfraud.training.anomaly.negatives import CONFIGURATIONS, FeaturePool, NegativeSampler, check_graph


def _graph(n: int, e: int, seed: int) -> Data:
    g = torch.Generator().manual_seed(seed)
    return Data(
        x=torch.rand(n, 8, generator=g) * 2 - 1,
        merchant=torch.randint(0, 50, (n,), generator=g),
        edge_index=torch.randint(0, n, (2, e), generator=g),
        edge_attr=torch.rand(e, 8, generator=g) * 2 - 1,
        num_nodes=n,
    )


GRAPHS = [_graph(1, 0, 1), _graph(1, 2, 2), _graph(2, 1, 3), _graph(6, 0, 4), _graph(8, 12, 5), _graph(32, 60, 6)]


def _sampler() -> NegativeSampler:
    pool = FeaturePool(torch.rand(40, 8) * 2 - 1 + 5.0, torch.randint(100, 200, (40,)), torch.rand(40, 8))
    return NegativeSampler(pool, 0.1, 0.5, max_nodes=32)


def _degree(g: Data) -> np.ndarray:
    deg = np.zeros(g.num_nodes, dtype=int)
    np.add.at(deg, g.edge_index[0].numpy(), 1)
    np.add.at(deg, g.edge_index[1].numpy(), 1)
    return deg


@pytest.mark.parametrize("conf", CONFIGURATIONS)
@pytest.mark.parametrize("gi", range(len(GRAPHS)))
def test_negatives_are_valid_and_changed(conf, gi):
    g, sampler = GRAPHS[gi], _sampler()
    for seed in range(15):
        neg = sampler.perturb(g, np.random.default_rng(seed), conf)
        h = neg.graph
        check_graph(h, 32)
        assert neg.configuration == conf
        changed = (
            h.num_nodes != g.num_nodes
            or not torch.equal(h.edge_index, g.edge_index)
            or not torch.equal(h.x, g.x)
            or not torch.equal(h.merchant, g.merchant)
        )
        assert changed or g.num_nodes == 1 and conf == "C2"  # swapping a lone node's features with itself is a no-op
        if conf == "C1":  # features stay
            assert torch.equal(h.x, g.x) and torch.equal(h.merchant, g.merchant)
        if conf == "C2" and h.num_nodes == g.num_nodes:  # topology and times stay
            assert torch.equal(h.edge_index, g.edge_index) and torch.equal(h.edge_attr, g.edge_attr)
        if h.num_nodes == g.num_nodes:  # no node that had a transition is left without one
            before, after = _degree(g), _degree(h)
            assert not np.any((before > 0) & (after == 0))
    assert torch.equal(g.x, GRAPHS[gi].x)  # input untouched


def test_negatives_are_seeded_and_uniform_over_configurations():
    sampler = _sampler()
    a = sampler.sample(GRAPHS * 50, np.random.default_rng(3))
    b = sampler.sample(GRAPHS * 50, np.random.default_rng(3))
    assert [n.configuration for n in a] == [n.configuration for n in b]
    assert all(
        torch.equal(x.graph.x, y.graph.x) and torch.equal(x.graph.edge_index, y.graph.edge_index)
        for x, y in zip(a, b, strict=True)
    )
    counts = {c: sum(n.configuration == c for n in a) for c in CONFIGURATIONS}
    assert all(70 <= v <= 130 for v in counts.values()), counts


def test_injected_features_come_from_the_pool():
    sampler = _sampler()
    g = GRAPHS[4]
    foreign = 0
    for seed in range(30):
        h = sampler.perturb(g, np.random.default_rng(seed), "C2").graph
        foreign += int((h.x > 3.0).all(dim=1).sum()) + int((h.merchant >= 100).sum())
    assert foreign > 0


def test_check_graph_rejects_bad_graphs():
    g = _graph(3, 2, 0)
    bad = Data(x=g.x, merchant=g.merchant, edge_index=torch.tensor([[0], [7]]), edge_attr=g.edge_attr[:1], num_nodes=3)
    with pytest.raises(ValueError):
        check_graph(bad)
    nan = Data(
        x=g.x.clone().fill_(float("nan")),
        merchant=g.merchant,
        edge_index=g.edge_index,
        edge_attr=g.edge_attr,
        num_nodes=3,
    )
    with pytest.raises(ValueError):
        check_graph(nan)


@pytest.mark.parametrize("conf", CONFIGURATIONS)
@pytest.mark.parametrize("gi", range(len(GRAPHS)))
def test_newest_negatives_change_one_transaction(conf, gi):
    """newest_share=1: valid graphs that differ from G_t by at most one node and one edge, at the newest ones."""
    g, base = GRAPHS[gi], _sampler()
    sampler = NegativeSampler(base.pool, 0.1, 0.5, max_nodes=32, newest_share=1.0)
    for seed in range(10):
        h = sampler.perturb(g, np.random.default_rng(seed), conf).graph
        check_graph(h, 32)
        assert h.num_nodes - g.num_nodes in (0, 1)
        assert h.edge_index.shape[1] - g.edge_index.shape[1] in (0, 1)
        n, e = g.num_nodes, g.edge_index.shape[1]
        assert torch.equal(h.x[: n - 1], g.x[: n - 1]) and torch.equal(h.merchant[: n - 1], g.merchant[: n - 1])
        kept = max(e - 1, 0)
        assert torch.equal(h.edge_index[:, :e], g.edge_index) and torch.equal(h.edge_attr[:kept], g.edge_attr[:kept])


def test_newest_share_zero_keeps_thesis_stream():
    """newest_share=0 draws exactly the thesis negatives (no extra random draws)."""
    base = _sampler()
    zero = NegativeSampler(base.pool, 0.1, 0.5, max_nodes=32, newest_share=0.0)
    for seed in range(5):
        a = base.perturb(GRAPHS[4], np.random.default_rng(seed)).graph
        b = zero.perturb(GRAPHS[4], np.random.default_rng(seed)).graph
        assert torch.equal(a.x, b.x) and torch.equal(a.edge_index, b.edge_index)

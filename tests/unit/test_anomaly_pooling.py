"""Every pooling operator builds, runs forward/backward on a tiny batch and meets the PoolResult contract."""

import pytest
import torch
from torch_geometric.data import Batch, Data

from fedfraud.feature_store.config import EncoderConfig
from fedfraud.core.errors import ConfigError
from fedfraud.training.anomaly.config import AnomalyConfig
from fedfraud.training.anomaly.model import AnomalyModel
from fedfraud.training.anomaly.pool import GraphPooling, PoolResult, base, pooling_names, resolve_pooling
from fedfraud.training.anomaly.pool.cluster import ClusterPool
from fedfraud.training.anomaly.pool.topk import TopKPool
from fedfraud.training.anomaly.federated.task import RunSettings
from fedfraud.training.anomaly.temporal import TemporalMessage

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _graphs(dim: int = 16) -> Batch:
    g = torch.Generator().manual_seed(0)
    out = []
    for n, e in ((1, 0), (2, 1), (5, 7), (9, 0), (12, 20)):
        out.append(
            Data(
                x=torch.rand(n, dim, generator=g) * 2 - 1,
                merchant=torch.randint(0, 64, (n,), generator=g),
                edge_index=torch.randint(0, n, (2, e), generator=g),
                edge_attr=torch.rand(e, dim, generator=g) * 2 - 1,
                num_nodes=n,
            )
        )
    return Batch.from_data_list(out)


#: The names configs, benches and docs already use (thesis Table 4.1's operators and clustering baselines).
PUBLIC_NAMES = {
    "topk", "sag", "asap", "diffpool",
    *(f"{a}-{r}" for a in ("kmeans", "agglo", "spectral") for r in ("max", "avg")),
}


def test_registry_holds_the_public_names():
    assert set(pooling_names()) == PUBLIC_NAMES
    assert isinstance(resolve_pooling("TopK", 8), TopKPool)  # names are matched case-insensitively
    pool = resolve_pooling("spectral-avg", 8)
    assert isinstance(pool, ClusterPool) and (pool.algorithm, pool.reduce) == ("spectral", "mean")


def test_a_new_operator_is_one_class(monkeypatch):
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))

    class Keep(GraphPooling, name="keep-all"):
        def forward(self, x, edge_index, edge_weight=None, batch=None):
            edge_weight, batch = self._defaults(x, edge_index, edge_weight, batch)
            return PoolResult(x, edge_index, edge_weight, batch, self._zero(x))

    assert "keep-all" in pooling_names()
    b = _graphs()
    out = resolve_pooling("keep-all", 16)(b.x, b.edge_index, None, b.batch)
    assert torch.equal(out.x, b.x)
    with pytest.raises(ValueError, match="taken by"):
        type("Clash", (GraphPooling,), {"forward": Keep.forward}, name="topk")
    assert isinstance(resolve_pooling("topk", 8), TopKPool)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", pooling_names())
def test_pooling_forward_contract(name, device):
    b = _graphs().to(device)
    pool = resolve_pooling(name, 16, ratio=0.5, max_nodes=12).to(device)
    pool.reset_parameters()
    out = pool(b.x, b.edge_index, None, b.batch)
    assert isinstance(out, PoolResult)
    assert out.x.shape[1] == 16 and torch.isfinite(out.x).all()
    assert set(out.batch.tolist()) == set(range(b.num_graphs))  # no graph vanishes
    counts = torch.bincount(out.batch, minlength=b.num_graphs)
    if name != "diffpool":  # DiffPool has a fixed cluster count per graph
        assert counts.tolist() == [max(1, -(-n // 2)) for n in (1, 2, 5, 9, 12)]
    assert repr(pool).startswith(type(pool).__name__)


@pytest.mark.parametrize("name", pooling_names())
def test_model_with_each_pooling_trains(name):
    cfg = AnomalyConfig(pooling=name, hidden=16, disc_hidden=8, readout="thesis")
    enc = EncoderConfig(dim=16, merchant_buckets=64)
    model = AnomalyModel(cfg, enc, max_nodes=12)
    out = model.embed(_graphs())
    assert out.q.shape == (5, 32)
    logits = model.logits(out.q[:2], out.q[2:4])
    (logits.sum() + out.aux_loss).backward()
    grads = [p.grad for p in model.encoder.convs[0].parameters() if p.grad is not None]
    assert grads and any(float(g.abs().sum()) > 0 for g in grads)


def test_unknown_pooling_lists_valid_names():
    with pytest.raises(ValueError, match="unknown pooling 'maxpool'; valid: .*kmeans-max.*topk"):
        resolve_pooling("maxpool", 16)
    with pytest.raises(ConfigError, match="unknown pooling 'maxpool'; valid: .*asap"):
        RunSettings.from_flat({"pooling": "maxpool"})


def test_pool_result_checks_shapes():
    with pytest.raises(ValueError):
        PoolResult(
            torch.zeros(3, 4),
            torch.tensor([[0], [5]]),
            torch.ones(1),
            torch.zeros(3, dtype=torch.long),
            torch.zeros(()),
        )


def test_temporal_message_matches_formula():
    x = torch.tensor([[0.1, 0.2], [0.3, -0.4], [0.0, 0.5]])
    edge_index = torch.tensor([[0, 1, 0], [1, 2, 2]])
    t = torch.tensor([[0.5, 0.5], [-0.1, 0.2], [0.3, 0.0]])
    h = TemporalMessage()(x, edge_index, t)
    expected = x.clone()
    expected[1] += torch.tanh(x[0] + t[0])
    expected[2] += torch.tanh(x[1] + t[1]) + torch.tanh(x[0] + t[2])
    assert torch.allclose(h, expected)

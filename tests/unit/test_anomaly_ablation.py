"""``anomaly.ablate``: each switch removes exactly the part it names, and the default is the full model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from torch_geometric.data import Data

from fedfraud.bench.ablation import ABLATION_GROUPS, FULL_MODEL, GRAPH_VARIANTS, run_ablation
from fedfraud.core.errors import UserError
from fedfraud.feature_store.config import EncoderConfig
from fedfraud.feature_store.events import HISTORY_SIZE, RAW_EVENT_SIZE, SUMMARY_SIZE, Ev
from fedfraud.training.anomaly.config import AnomalyConfig
from fedfraud.training.anomaly.data import PairSet
from fedfraud.training.anomaly.engine import TrainSource, train_model
from fedfraud.training.anomaly.model import AnomalyModel, collate_graphs, embed_graphs
from fedfraud.training.anomaly.negatives import FeaturePool, NegativeSampler

ENC = EncoderConfig(dim=16, merchant_buckets=64)
MAX_NODES = 32
CFG = AnomalyConfig(hidden=16, disc_hidden=16, dropout=0.0)


def _graph(rng: np.random.Generator, nodes: int, summary: np.ndarray | None = None) -> Data:
    """An ego graph with random L' (x), a chain of transitions with random T' (edge_attr) and merchant buckets."""
    src = np.arange(nodes - 1)
    edge_index = torch.as_tensor(np.stack([src, src + 1]), dtype=torch.long)
    history = summary if summary is not None else rng.random(SUMMARY_SIZE)
    return Data(
        x=torch.as_tensor(rng.normal(size=(nodes, ENC.dim)), dtype=torch.float32),
        edge_index=edge_index,
        edge_attr=torch.as_tensor(rng.normal(size=(nodes - 1, ENC.dim)), dtype=torch.float32),
        merchant=torch.as_tensor(rng.integers(ENC.merchant_buckets, size=nodes), dtype=torch.long),
        history=torch.as_tensor(history, dtype=torch.float32).reshape(1, -1),
        num_nodes=nodes,
    )


def _model(ablate: str = "none", seed: int = 0, cfg: AnomalyConfig = CFG) -> AnomalyModel:
    torch.manual_seed(seed)
    return AnomalyModel(cfg.model_copy(update={"ablate": ablate}), ENC, MAX_NODES).eval()


def _q(model: AnomalyModel, graphs: list[Data], dense: bool = True) -> torch.Tensor:
    model.encoder.allow_dense = dense
    return embed_graphs(model, collate_graphs(graphs))


def _graphs(seed: int = 0, count: int = 6) -> list[Data]:
    rng = np.random.default_rng(seed)
    return [_graph(rng, int(n)) for n in rng.integers(2, 12, size=count)]


def _with(g: Data, **changes: torch.Tensor) -> Data:
    out = g.clone()
    for key, value in changes.items():
        setattr(out, key, value)
    return out


def test_the_default_is_the_full_model_and_it_is_both_parts_side_by_side() -> None:
    assert AnomalyConfig().ablate == "none" and GRAPH_VARIANTS[FULL_MODEL] == {}
    full = _model(seed=3)
    explicit = AnomalyModel(CFG, ENC, MAX_NODES)  # no ablate given
    assert set(explicit.state_dict()) == set(full.state_dict())
    assert full.encoder.out_dim == 3 * CFG.hidden and len(full.encoder.convs) == CFG.layers
    graphs = _graphs()
    q = _q(full, graphs)
    # the ablated encoders, loaded with the full model's weights, give exactly its two blocks
    for ablate, block in (("no-history", slice(0, 2 * CFG.hidden)), ("no-graph", slice(2 * CFG.hidden, None))):
        part = _model(ablate)
        missing, unexpected = part.load_state_dict(
            {k: v for k, v in full.state_dict().items() if k in part.state_dict() and not k.startswith("head.")},
            strict=False,
        )
        assert not unexpected and all(k.startswith("head.") for k in missing)
        assert torch.allclose(_q(part, graphs), q[:, block], atol=1e-6)


def test_no_graph_reads_only_the_history_summary() -> None:
    model = _model("no-graph")
    assert model.encoder.out_dim == CFG.hidden and len(model.encoder.convs) == 0
    rng = np.random.default_rng(1)
    graphs = _graphs(1)
    # other nodes, edges, L', T' and merchants, same history summary: the same q
    rewired = [_graph(rng, 3 + i, g.history.numpy().ravel()) for i, g in enumerate(graphs)]
    assert torch.equal(_q(model, graphs), _q(model, rewired))
    assert torch.equal(_q(model, graphs, dense=False), _q(model, rewired, dense=False))
    moved = [_with(g, history=g.history + 0.5) for g in graphs]
    assert not torch.allclose(_q(model, graphs), _q(model, moved))


def test_no_history_ignores_the_history_summary_and_reads_the_graph() -> None:
    model = _model("no-history")
    assert model.encoder.history is None and model.encoder.out_dim == 2 * CFG.hidden
    graphs = _graphs(2)
    moved = [_with(g, history=torch.rand_like(g.history)) for g in graphs]
    assert torch.equal(_q(model, graphs), _q(model, moved))
    fewer = [_with(g, edge_index=g.edge_index[:, :1], edge_attr=g.edge_attr[:1]) for g in graphs]
    assert not torch.allclose(_q(model, graphs), _q(model, fewer))


def test_no_location_time_ignores_l_prime_and_t_prime_but_reads_the_merchants() -> None:
    model = _model("no-location-time")
    full = _model()
    graphs = _graphs(3)
    noised = [_with(g, x=torch.randn_like(g.x), edge_attr=torch.randn_like(g.edge_attr)) for g in graphs]
    for dense in (True, False):
        assert torch.allclose(_q(model, graphs, dense), _q(model, noised, dense), atol=1e-6)
    assert not torch.allclose(_q(full, graphs), _q(full, noised))  # the full model does read them
    other = [_with(g, merchant=(g.merchant + 1) % ENC.merchant_buckets) for g in graphs]
    assert not torch.allclose(_q(model, graphs), _q(model, other))


@pytest.mark.parametrize("ablate", ["none", "no-graph", "no-history", "freeze-merchants", "no-location-time"])
def test_every_switch_gives_the_same_embeddings_on_the_dense_and_the_sparse_path(ablate: str) -> None:
    model = _model(ablate)
    graphs = _graphs(4)
    assert torch.allclose(_q(model, graphs, dense=True), _q(model, graphs, dense=False), atol=1e-5)


def _source(rng: np.random.Generator, n: int = 48) -> TrainSource:
    previous = [_graph(rng, int(k)) for k in rng.integers(2, 10, size=n)]
    current = [_graph(rng, g.num_nodes + 1) for g in previous]
    events = np.zeros((n, RAW_EVENT_SIZE))
    events[:, Ev.AMOUNT] = rng.lognormal(3.0, 1.0, size=n)
    events[:, Ev.CATEGORY] = rng.integers(14, size=n)
    events[:, Ev.TS] = 1.6e9 + rng.integers(0, 86_400 * 30, size=n)
    pairs = PairSet(previous, current, events, np.zeros((n, HISTORY_SIZE)))
    return TrainSource(pairs, NegativeSampler.from_config(FeaturePool.from_graphs(current, seed=0), CFG, MAX_NODES))


@pytest.mark.parametrize("ablate", ["freeze-merchants", "none"])
def test_the_frozen_merchant_table_gets_no_gradient_and_stays_equal(ablate: str) -> None:
    model = _model(ablate).train()
    table = model.encoder.merchant.weight
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    source = _source(np.random.default_rng(5))
    train_model(model, [source], epochs=2, samples_per_epoch=32, batch_size=16, lr=1e-2, seed=0)
    after = model.state_dict()
    others_moved = any(not torch.equal(before[k], after[k]) for k in after if k != "encoder.merchant.weight")
    assert others_moved
    if ablate == "freeze-merchants":
        assert not table.requires_grad and table.grad is None
        assert torch.equal(before["encoder.merchant.weight"], after["encoder.merchant.weight"])
    else:  # the control: the same training moves the full model's table
        assert not torch.equal(before["encoder.merchant.weight"], after["encoder.merchant.weight"])


@pytest.mark.parametrize("ablate", ["no-graph", "no-history"])
def test_the_history_switches_need_an_event_readout(ablate: str) -> None:
    with pytest.raises(ValidationError, match="needs an event readout"):
        AnomalyConfig(readout="thesis", ablate=ablate)
    AnomalyConfig(readout="thesis", ablate="freeze-merchants")  # the graph-side switches apply to any readout


def test_every_bench_variant_is_a_valid_config() -> None:
    for variants in ABLATION_GROUPS.values():
        for update in variants.values():
            cfg = AnomalyConfig.model_validate({**CFG.model_dump(), **update})
            assert AnomalyModel(cfg, ENC, MAX_NODES).encoder.out_dim > 0


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fedfraud.training.data.config import GeneratorConfig
    from fedfraud.training.data.synthetic import generate_dataset

    data = tmp_path_factory.mktemp("ablation") / "data"
    generate_dataset(data, GeneratorConfig(banks=2, cardholders=80, days=30, fraud_rate=0.05, seed=3), raw_csv=False,
                     progress=False)
    return data


def test_the_bench_scores_validation_rows_pairs_each_variant_with_the_full_model(generated: Path) -> None:
    bench = run_ablation(None, generated.parent, steps=8, variants=GRAPH_VARIANTS, resamples=50, data=generated)
    assert set(bench.seconds) == set(GRAPH_VARIANTS) and bench.frauds > 0
    assert bench.baseline.startswith("baseline:")
    for name in [*GRAPH_VARIANTS, bench.baseline]:
        assert 0.0 <= bench.rows[name]["roc_auc"].value <= 1.0
        if name != FULL_MODEL:
            diff = bench.rows[f"{name} − {FULL_MODEL}"]["roc_auc"].value
            assert diff == pytest.approx(bench.rows[name]["roc_auc"].value - bench.rows[FULL_MODEL]["roc_auc"].value)
    assert bench.scenarios  # a generated dataset brings its scenario labels
    text = bench.to_markdown()
    assert "history summary only (no graph)" in text and "Δ ROC-AUC vs full" in text


def test_the_bench_refuses_two_sources_or_none(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="exactly one"):
        run_ablation(None, tmp_path)


def test_the_command_names_an_unknown_group_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedfraud.cli.app import main

    assert main(["bench", "anomaly-ablation", "--data", str(tmp_path), "--group", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--group nope" in err and "graph" in err and "\n" not in err


def test_the_product_recipe_keeps_the_round_with_the_lowest_validation_loss(
    generated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fedfraud.training.anomaly.engine as engine
    import fedfraud.training.anomaly.model as model_module
    from fedfraud.bench.ablation import _train_and_score
    from fedfraud.config import FedfraudConfig
    from fedfraud.feature_store.layout import list_banks
    from fedfraud.training.anomaly.data import load_bank_data

    cfg = FedfraudConfig()
    base = cfg.anomaly.model_copy(update={"max_train_pairs": 300, "max_test_pairs": 100, "max_eval_normal": 20})
    banks = [load_bank_data(generated, b, base, cfg.encoder, cfg.privacy, cfg.egograph) for b in list_banks(generated)]
    round_loss = [2.0, 1.0, 3.0]  # round 2 is the best: its weights must be the ones scored
    seen: list[dict[str, torch.Tensor]] = []  # the weights after each round
    scored: list[dict[str, torch.Tensor]] = []
    real_score_pairs = model_module.score_pairs

    def selection(model: AnomalyModel, bank: object) -> dict[str, float]:
        if bank is banks[0]:
            seen.append({k: v.clone() for k, v in model.state_dict().items()})
        return {"val_loss": round_loss[len(seen) - 1]}

    def score_pairs(model: AnomalyModel, *args: object) -> np.ndarray:
        scored.append({k: v.clone() for k, v in model.state_dict().items()})
        return real_score_pairs(model, *args)

    monkeypatch.setattr(engine, "evaluate_selection", selection)
    monkeypatch.setattr(model_module, "score_pairs", score_pairs)
    _train_and_score({}, base, cfg, banks, steps=24, seed=0, rounds=3)
    assert len(seen) == 3 and scored
    assert all(torch.equal(seen[1][k], v) for k, v in scored[0].items())
    assert not all(torch.equal(seen[2][k], v) for k, v in scored[0].items())  # training went on past it

"""What a bank does in the federated GNN: load its graph, send its scaler sums, train, send prototypes, histograms.

Each simulated bank (SuperNode ``partition-id`` k) reads ``bank_<b>.graph.npz`` (:meth:`TransactionGraph.save`)
from the folder named in the message config; a deployed SuperNode reads ``<data-dir>/fraud-graph.npz`` (its node
config). What leaves a bank: per-column sums of its transformed training rows (once), model weights, its risk
intensity ``H_k``, its two class prototypes with their counts (FedRPDA), and validation score histograms.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedfraud.training.fraud.gnn.config import GnnConfig
from fedfraud.training.fraud.gnn.graph import TransactionGraph
from fedfraud.training.fraud.gnn.model import FraudGNN, InputLayout, ScalerSums, node_inputs
from fedfraud.training.fraud.gnn.rpda import (
    FraudStats,
    Prototypes,
    augment_frauds,
    local_prototypes,
    prototype_loss,
    risk_intensity,
)
from fedfraud.training.fraud.metrics import score_histograms

__all__ = [
    "INDEX_FILE",
    "NODE_GRAPH_FILE",
    "SCALER_ARRAYS",
    "GnnJob",
    "LocalResult",
    "bank_graph_file",
    "build_model",
    "graph_risk",
    "load_node_graph",
    "load_partition",
    "local_train",
    "model_inputs",
    "scaler_sums",
    "score_nodes",
    "set_state",
    "state_arrays",
    "validation_histograms",
    "write_index",
]

logger = logging.getLogger(__name__)

INDEX_FILE = "index.json"
#: A deployed SuperNode's graph in its own data folder.
NODE_GRAPH_FILE = "fraud-graph.npz"


@dataclass(frozen=True)
class GnnJob:
    """One federated GNN training: its name, which FedRPDA strategies are on, its seed and setting overrides.

    ``overrides``: ``GnnConfig`` fields for this job (e.g. ``prototype_weight``), applied over the run's config.
    """

    name: str
    risk_aware: bool
    diversified: bool
    seed: int = 0
    overrides: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"bad job name {self.name!r}")
        unknown = [k for k, _ in self.overrides if k not in GnnConfig.model_fields]
        if unknown:
            raise ValueError(f"unknown gnn settings {unknown}")

    def config(self, base: GnnConfig) -> GnnConfig:
        """``base`` with this job's strategies and overrides."""
        return base.model_copy(update={"risk_aware_aggregation": self.risk_aware,
                                       "diversified_risk_augmentation": self.diversified, **dict(self.overrides)})

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> GnnJob:
        raw = json.loads(text)
        return cls(raw["name"], bool(raw["risk_aware"]), bool(raw["diversified"]), int(raw["seed"]),
                   tuple((str(k), float(v)) for k, v in raw["overrides"]))


def bank_graph_file(folder: Path, bank: int) -> Path:
    return Path(folder) / f"bank_{bank}.graph.npz"


def write_index(folder: Path, banks: list[int]) -> None:
    """Record which bank each partition id is (partition k → ``banks[k]``)."""
    (Path(folder) / INDEX_FILE).write_text(json.dumps({"banks": banks}), encoding="utf-8")


@lru_cache(maxsize=8)
def load_partition(folder: str, partition_id: int) -> TransactionGraph:
    """This SuperNode's bank graph, cached for the life of the worker."""
    banks = json.loads((Path(folder) / INDEX_FILE).read_text(encoding="utf-8"))["banks"]
    return TransactionGraph.load(bank_graph_file(Path(folder), banks[partition_id]))


@lru_cache(maxsize=2)
def load_node_graph(data_dir: str) -> TransactionGraph:
    """A deployed SuperNode's bank graph: ``<data-dir>/fraud-graph.npz``, its own folder only."""
    path = Path(data_dir) / NODE_GRAPH_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: save this bank's TransactionGraph there")
    return TransactionGraph.load(path)


def build_model(names: tuple[str, ...], used: tuple[str, ...], cfg: GnnConfig, seed: int) -> FraudGNN:
    """A freshly initialized model (the same weights for the same seed in every process)."""
    torch.manual_seed(seed)
    return FraudGNN(InputLayout.of(names, used), cfg)


#: The scaler buffers: set by the server from the banks' sums, never trained by a bank (DSFL returns them as received).
SCALER_ARRAYS = ("mean", "std")


def state_arrays(model: FraudGNN) -> dict[str, np.ndarray]:
    """The model's weights and scaler as numpy arrays (what crosses the wire)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def set_state(model: FraudGNN, arrays: dict[str, np.ndarray]) -> None:
    model.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in arrays.items()})


def scaler_sums(graph: TransactionGraph, layout: InputLayout) -> ScalerSums:
    """Sums of the bank's transformed *training* rows (validation and test cardholders never shape the scaler)."""
    return ScalerSums.of(layout.numeric_values(graph.features.X[graph.mask("train")]))


#: Per-process caches keyed by the graph's id; each entry keeps its graph, so an id is never reused while cached.
_INPUTS: dict[tuple[int, bytes], tuple[TransactionGraph, torch.Tensor]] = {}
_RISK: dict[int, tuple[TransactionGraph, float]] = {}
_CACHED = 8


def model_inputs(model: FraudGNN, graph: TransactionGraph) -> torch.Tensor:
    """:func:`node_inputs` of the graph under the model's scaler, cached per (graph, scaler) in this process."""
    key = (id(graph), model.mean.numpy().tobytes() + model.std.numpy().tobytes()
           + json.dumps(model.layout.used).encode() + str(model.paths).encode())
    if key not in _INPUTS:
        if len(_INPUTS) >= _CACHED:
            _INPUTS.pop(next(iter(_INPUTS)))
        _INPUTS[key] = (graph, node_inputs(model, graph))
    return _INPUTS[key][1]


def graph_risk(graph: TransactionGraph) -> float:
    """The bank's risk intensity ``H_k`` on its training labels (the graph does not change: computed once)."""
    if id(graph) not in _RISK:
        if len(_RISK) >= _CACHED:
            _RISK.pop(next(iter(_RISK)))
        _RISK[id(graph)] = (graph, risk_intensity(graph.edge_index, graph.features.label, graph.mask("train")))
    return _RISK[id(graph)][1]


@dataclass(frozen=True)
class LocalResult:
    """What one bank's local round produced (beside its weights)."""

    examples: int
    risk: float
    prototypes: Prototypes
    loss_ce: float
    loss_p: float


def _labels(graph: TransactionGraph) -> torch.Tensor:
    return torch.as_tensor(np.nan_to_num(graph.features.label).astype(np.int64))


def local_train(model: FraudGNN, graph: TransactionGraph, cfg: GnnConfig, server_round: int,
                global_prototypes: np.ndarray | None, stats: FraudStats, seed: int) -> LocalResult:
    """Algorithm 1 on one bank: ``local_epochs`` passes of minibatch Adam on ``L_CE + λ·L_P``, then eq. (7).

    ``L_P`` (and the augmentation) only when ``cfg.diversified_risk_augmentation`` is on and global prototypes
    exist (round > 1); ``stats`` carries the running fraud mean/variance across rounds.
    """
    x = model_inputs(model, graph)
    y = _labels(graph)
    train = np.flatnonzero(graph.mask("train"))
    pos = float(y[train].sum())
    neg = float(len(train)) - pos
    weight = torch.tensor([1.0, min(neg / pos, cfg.max_pos_weight) if pos else 1.0])
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    protos = (torch.as_tensor(global_prototypes, dtype=torch.float32)
              if cfg.diversified_risk_augmentation and global_prototypes is not None else None)
    model.train()
    ce_sum = p_sum = 0.0
    steps = 0
    for _ in range(cfg.local_epochs):
        order = rng.permutation(train)
        for start in range(0, len(order), cfg.batch_size):
            idx = torch.as_tensor(order[start : start + cfg.batch_size])
            logits, h = model(x[idx])
            yb = y[idx]
            loss = torch.nn.functional.cross_entropy(logits, yb, weight=weight)
            ce_sum += loss.item()
            if protos is not None and cfg.prototype_weight > 0 and bool((yb == 1).any()):
                mu, var = stats.update(h[yb == 1], cfg.stats_momentum)
                count = max(1, int(round(cfg.augment_ratio * int((yb == 1).sum()))))
                aug = augment_frauds(mu, var, count, gen)
                lp = prototype_loss(torch.cat([h, aug]), torch.cat([yb, torch.ones(count, dtype=yb.dtype)]),
                                    protos)
                p_sum += lp.item()
                loss = loss + cfg.prototype_weight * lp
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
    model.eval()
    with torch.no_grad():
        _, h_train = model(x[torch.as_tensor(train)])
    prototypes = local_prototypes(h_train, y[torch.as_tensor(train)])
    return LocalResult(len(train), graph_risk(graph), prototypes, ce_sum / max(steps, 1), p_sum / max(steps, 1))



def score_nodes(model: FraudGNN, graph: TransactionGraph, mask: np.ndarray | None = None) -> np.ndarray:
    """Fraud probability (float64) of every node, or of the ``mask`` nodes."""
    x = model_inputs(model, graph)
    if mask is not None:
        x = x[torch.as_tensor(np.flatnonzero(mask))]
    model.eval()
    out = []
    with torch.no_grad():
        for start in range(0, len(x), 65536):
            logits, _ = model(x[start : start + 65536])
            out.append(torch.softmax(logits, dim=1)[:, 1].double().numpy())
    return np.concatenate(out) if out else np.zeros(0)


def validation_histograms(model: FraudGNN, graph: TransactionGraph, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Positive and negative score histograms of the bank's validation nodes (only counts leave the bank)."""
    valid = graph.mask("valid")
    return score_histograms(graph.features.label[valid], score_nodes(model, graph, valid), bins)


def config_of(record: Any) -> GnnConfig:
    """The run's :class:`GnnConfig`, sent by the server as JSON in the message config."""
    return GnnConfig.model_validate_json(str(record["gnn-config"]))

"""Domain-specific negative sampling (thesis §4.4.3): perturb a cardholder's own G_t into G̃_t.

A configuration is drawn uniformly per graph:

* **C1, topology only** — rewire (move one endpoint of some transitions to
  another of the cardholder's merchants), add transitions (with times T'
  drawn from other transactions of the bank) or drop transitions. Node
  features are untouched.
* **C2, node features only** — inject foreign merchants and/or locations
  (rows of other transactions of the same bank) into some nodes, or swap the
  features of pairs of nodes. Edges and their times are untouched.
* **C3, both** — a C2 change (or new foreign nodes attached by new
  transitions, the shape of a purchase at an unfamiliar merchant), then a C1
  change.

Each change alters between ``min_fraction`` and ``max_fraction`` of the
nodes or edges (at least one).

A real fraud changes G_{t-1} by one transaction, so a share ``newest_share``
of the negatives are instead **single-transaction** changes aimed at the
newest elements of G_t (nodes and edges are appended in event order, so the
newest node and edge are the last ones): C1 gives the newest transition a
foreign time or adds one transition with a foreign time from the newest node;
C2 injects a foreign merchant and/or location into the newest node; C3 adds
one foreign node reached from the newest node by a transition with a foreign
time (a purchase at an unfamiliar merchant, elsewhere, at another hour).
Without them the discriminator only learns to spot large perturbations, and
its score ranks real frauds little better than chance (docs/anomaly.md). The result is always a valid graph: finite
features, consistent shapes, indices in range, at most ``max_nodes`` nodes,
and no node loses all of its transitions (a node that had none before may stay
alone; merchants visited once outside the 2-hour window are isolated in real
graphs too). Everything is driven by a ``numpy.random.Generator``, so a seed
reproduces the negatives.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data

from fedfraud.training.anomaly.config import AnomalyConfig

__all__ = ["CONFIGURATIONS", "FeaturePool", "NegativeSample", "NegativeSampler", "check_graph"]

logger = logging.getLogger(__name__)

Configuration = Literal["C1", "C2", "C3"]
CONFIGURATIONS: tuple[Configuration, ...] = ("C1", "C2", "C3")


def check_graph(g: Data, max_nodes: int | None = None) -> None:
    """Raise ``ValueError`` unless ``g`` is a consistent, finite, non-empty ego graph."""
    n = int(g.num_nodes)
    if n < 1 or g.x.shape[0] != n or g.merchant.shape != (n,):
        raise ValueError(f"inconsistent node tensors: n={n}, x={tuple(g.x.shape)}, merchant={tuple(g.merchant.shape)}")
    if (
        g.edge_index.dim() != 2
        or g.edge_index.shape[0] != 2
        or g.edge_attr.shape != (g.edge_index.shape[1], g.x.shape[1])
    ):
        raise ValueError(
            f"inconsistent edges: edge_index={tuple(g.edge_index.shape)}, edge_attr={tuple(g.edge_attr.shape)}"
        )
    if g.edge_index.numel() and (int(g.edge_index.min()) < 0 or int(g.edge_index.max()) >= n):
        raise ValueError("edge_index out of range")
    if not (torch.isfinite(g.x).all() and torch.isfinite(g.edge_attr).all()):
        raise ValueError("non-finite features")
    if max_nodes is not None and n > max_nodes:
        raise ValueError(f"{n} nodes exceed max_nodes={max_nodes}")


@dataclass(frozen=True)
class FeaturePool:
    """Private features of other transactions of the same bank: the source of "foreign" elements.

    Attributes:
        location: ``[m, d]`` L' rows (node features).
        merchant: ``[m]`` merchant buckets, aligned with ``location``.
        time: ``[k, d]`` T' rows (edge features).
    """

    location: Tensor
    merchant: Tensor
    time: Tensor

    def __post_init__(self) -> None:
        if self.location.dim() != 2 or self.location.shape[0] < 1:
            raise ValueError("FeaturePool.location must be a non-empty [m, d] tensor")
        if self.merchant.shape != (self.location.shape[0],):
            raise ValueError("FeaturePool.merchant must have one bucket per location row")
        if self.time.dim() != 2 or self.time.shape[1] != self.location.shape[1] or self.time.shape[0] < 1:
            raise ValueError("FeaturePool.time must be a non-empty [k, d] tensor with the same d")

    @classmethod
    def from_graphs(cls, graphs: Sequence[Data], max_rows: int = 4096, seed: int = 0) -> FeaturePool:
        """Pool the nodes and edges of ``graphs`` (e.g. one bank's training graphs), subsampled to ``max_rows``."""
        if not graphs:
            raise ValueError("FeaturePool.from_graphs needs at least one graph")
        rng = np.random.default_rng(seed)
        x = torch.cat([g.x for g in graphs])
        merchant = torch.cat([g.merchant for g in graphs])
        time = torch.cat([g.edge_attr for g in graphs])
        if time.shape[0] == 0:  # no transitions anywhere: fall back to time-free (zero) transitions
            time = torch.zeros(1, x.shape[1], dtype=x.dtype)
        keep = torch.from_numpy(rng.permutation(x.shape[0])[:max_rows])
        keep_t = torch.from_numpy(rng.permutation(time.shape[0])[:max_rows])
        return cls(x[keep].clone(), merchant[keep].clone(), time[keep_t].clone())


@dataclass(frozen=True)
class NegativeSample:
    """A perturbed graph G̃_t and the configuration that produced it."""

    graph: Data
    configuration: Configuration

    def __post_init__(self) -> None:
        if self.configuration not in CONFIGURATIONS:
            raise ValueError(f"configuration must be one of {CONFIGURATIONS}")


class NegativeSampler:
    """Draws G̃_t from G_t with configuration C ~ U{C1, C2, C3}."""

    def __init__(
        self,
        pool: FeaturePool,
        min_fraction: float = 0.1,
        max_fraction: float = 0.5,
        max_nodes: int = 32,
        newest_share: float = 0.0,
    ):
        if not 0.0 < min_fraction <= max_fraction <= 1.0:
            raise ValueError("need 0 < min_fraction <= max_fraction <= 1")
        if not 0.0 <= newest_share <= 1.0:
            raise ValueError("need 0 <= newest_share <= 1")
        self.pool = pool
        self.newest_share = newest_share
        self.min_fraction = min_fraction
        self.max_fraction = max_fraction
        self.max_nodes = max_nodes

    @classmethod
    def from_config(cls, pool: FeaturePool, cfg: AnomalyConfig, max_nodes: int) -> NegativeSampler:
        """The sampler an :class:`AnomalyConfig` describes (training and the test task use the same one)."""
        return cls(pool, cfg.perturb_min, cfg.perturb_max, max_nodes, cfg.newest_share)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(pool={self.pool.location.shape[0]}, "
            f"fraction=[{self.min_fraction}, {self.max_fraction}], max_nodes={self.max_nodes}, "
            f"newest_share={self.newest_share})"
        )

    # ------------------------------------------------------------------ public
    def perturb(self, g: Data, rng: np.random.Generator, configuration: Configuration | None = None) -> NegativeSample:
        """One negative of ``g`` (which is not modified)."""
        conf: Configuration = configuration or CONFIGURATIONS[int(rng.integers(3))]
        x, merchant = g.x.clone(), g.merchant.clone()
        edge_index, edge_attr = g.edge_index.clone(), g.edge_attr.clone()
        single = self.newest_share > 0 and bool(rng.random() < self.newest_share)
        if single:
            x, merchant, edge_index, edge_attr = self._newest(conf, x, merchant, edge_index, edge_attr, rng)
        elif conf in ("C2", "C3"):
            x, merchant, edge_index, edge_attr = self._features(x, merchant, edge_index, edge_attr, rng, conf == "C3")
        if conf in ("C1", "C3") and not single:
            edge_index, edge_attr = self._topology(x.shape[0], edge_index, edge_attr, rng)
        out = Data(x=x, merchant=merchant, edge_index=edge_index, edge_attr=edge_attr, num_nodes=x.shape[0])
        if "history" in g:  # the cardholder's event history is not what a graph negative perturbs
            out.history = g.history
        check_graph(out, max(self.max_nodes, int(g.num_nodes)))
        return NegativeSample(out, conf)

    def sample(self, graphs: Sequence[Data], rng: np.random.Generator) -> list[NegativeSample]:
        """One negative per graph, in order."""
        return [self.perturb(g, rng) for g in graphs]

    # ------------------------------------------------------------------ helpers
    def _newest(
        self,
        conf: Configuration,
        x: Tensor,
        merchant: Tensor,
        edge_index: Tensor,
        edge_attr: Tensor,
        rng: np.random.Generator,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One transaction's worth of change at the newest node/edge (see the module docstring)."""
        n = x.shape[0]
        newest = torch.tensor([n - 1])
        if conf == "C3" and n >= self.max_nodes:
            conf = "C2"  # no room for a node: make the newest one foreign instead
        if conf == "C1":
            if edge_index.shape[1] and rng.random() < 0.5:
                edge_attr[-1] = self._times(1, rng)[0]
            else:
                dst = torch.from_numpy(rng.integers(n, size=1))
                edge_index = torch.cat([edge_index, torch.stack([newest, dst])], dim=1)
                edge_attr = torch.cat([edge_attr, self._times(1, rng)])
        elif conf == "C2":
            loc, merch = self._foreign(1, rng)
            what = int(rng.integers(3))  # 0: merchant and location, 1: location only, 2: merchant only
            if what in (0, 1):
                x[-1] = loc[0]
            if what in (0, 2):
                merchant[-1] = merch[0]
        else:
            loc, merch = self._foreign(1, rng)
            x, merchant = torch.cat([x, loc]), torch.cat([merchant, merch])
            edge_index = torch.cat([edge_index, torch.tensor([[n - 1], [n]])], dim=1)
            edge_attr = torch.cat([edge_attr, self._times(1, rng)])
        return x, merchant, edge_index, edge_attr

    def _count(self, size: int, rng: np.random.Generator) -> int:
        frac = rng.uniform(self.min_fraction, self.max_fraction)
        return int(min(max(1, round(frac * size)), max(size, 1)))

    def _foreign(self, count: int, rng: np.random.Generator) -> tuple[Tensor, Tensor]:
        idx = torch.from_numpy(rng.integers(self.pool.location.shape[0], size=count))
        return self.pool.location[idx], self.pool.merchant[idx]

    def _times(self, count: int, rng: np.random.Generator) -> Tensor:
        return self.pool.time[torch.from_numpy(rng.integers(self.pool.time.shape[0], size=count))]

    def _features(
        self,
        x: Tensor,
        merchant: Tensor,
        edge_index: Tensor,
        edge_attr: Tensor,
        rng: np.random.Generator,
        allow_new_nodes: bool,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        n = x.shape[0]
        choices = ["inject", "swap"] if n >= 2 else ["inject"]
        if allow_new_nodes and n < self.max_nodes:
            choices.append("new-nodes")
        kind = choices[int(rng.integers(len(choices)))]
        if kind == "inject":
            nodes = torch.from_numpy(rng.choice(n, size=self._count(n, rng), replace=False))
            loc, merch = self._foreign(nodes.numel(), rng)
            what = int(rng.integers(3))  # 0: merchant and location, 1: location only, 2: merchant only
            if what in (0, 1):
                x[nodes] = loc
            if what in (0, 2):
                merchant[nodes] = merch
        elif kind == "swap":
            pairs = max(1, self._count(n, rng) // 2)
            for _ in range(pairs):
                i, j = rng.choice(n, size=2, replace=False)
                x[[i, j]] = x[[j, i]]
                merchant[[i, j]] = merchant[[j, i]]
        else:  # new foreign nodes, each reached by a transition from a random existing node
            add = min(self._count(n, rng), self.max_nodes - n)
            loc, merch = self._foreign(add, rng)
            new = torch.arange(n, n + add)
            src = torch.from_numpy(rng.integers(n, size=add))
            x = torch.cat([x, loc])
            merchant = torch.cat([merchant, merch])
            edge_index = torch.cat([edge_index, torch.stack([src, new])], dim=1)
            edge_attr = torch.cat([edge_attr, self._times(add, rng)])
        return x, merchant, edge_index, edge_attr

    def _topology(
        self, n: int, edge_index: Tensor, edge_attr: Tensor, rng: np.random.Generator
    ) -> tuple[Tensor, Tensor]:
        e = edge_index.shape[1]
        choices = ["add"]
        if e and n >= 2:
            choices += ["rewire", "drop"]
        kind = choices[int(rng.integers(len(choices)))]
        if kind == "drop":
            dropped = self._drop(n, edge_index, self._count(e, rng), rng)
            if dropped is not None:
                return edge_index[:, dropped], edge_attr[dropped]
            kind = "rewire"  # every transition is some node's only one: rewire instead
        if kind == "rewire":
            rewired = self._rewire(n, edge_index, self._count(e, rng), rng)
            if rewired is not None:
                return rewired, edge_attr
        add = self._count(max(e, 1), rng)
        src = torch.from_numpy(rng.integers(n, size=add))
        dst = torch.from_numpy(rng.integers(n, size=add))
        return torch.cat([edge_index, torch.stack([src, dst])], dim=1), torch.cat([edge_attr, self._times(add, rng)])

    @staticmethod
    def _degree(n: int, edge_index: Tensor) -> np.ndarray:
        deg = np.zeros(n, dtype=np.int64)
        ei = edge_index.numpy()
        np.add.at(deg, ei[0], 1)
        np.add.at(deg, ei[1], 1)
        return deg

    def _drop(self, n: int, edge_index: Tensor, count: int, rng: np.random.Generator) -> Tensor | None:
        """Mask keeping all but ``count`` edges whose removal detaches no node; None if none can go."""
        deg = self._degree(n, edge_index)
        keep = np.ones(edge_index.shape[1], dtype=bool)
        ei = edge_index.numpy()
        removed = 0
        for k in rng.permutation(edge_index.shape[1]):
            if removed == count:
                break
            s, d = ei[0, k], ei[1, k]
            ok = deg[s] > 2 if s == d else (deg[s] > 1 and deg[d] > 1)  # a self-loop counts twice at its node
            if ok:
                keep[k] = False
                deg[s] -= 1
                deg[d] -= 1
                removed += 1
        return torch.from_numpy(keep) if removed else None

    def _rewire(self, n: int, edge_index: Tensor, count: int, rng: np.random.Generator) -> Tensor | None:
        """Move one endpoint of up to ``count`` edges to another node, never stranding the old endpoint."""
        deg = self._degree(n, edge_index)
        out = edge_index.clone()
        moved = 0
        for k in rng.permutation(edge_index.shape[1]):
            if moved == count:
                break
            side = int(rng.integers(2))
            old = int(out[side, k])
            if deg[old] < 2:
                side, old = 1 - side, int(out[1 - side, k])
                if deg[old] < 2:
                    continue
            new = int(rng.integers(n - 1))
            new = new + 1 if new >= old else new
            out[side, k] = new
            deg[old] -= 1
            deg[new] += 1
            moved += 1
        return out if moved else None

"""An iterative gradient-inversion attack on the anomaly model (section 5 of ``fedfraud bench attacks``): what an
attacker who sees the gradient of one local step recovers of the node locations L' of a bank's ego graphs.

The attack is "Inverting Gradients" (Geiping et al. 2020): dummy node features x' are optimised with Adam so that
the gradient they induce matches the observed one in cosine distance (averaged per observed tensor, where Geiping
uses one cosine over the whole vector: see :func:`_cosine_distance`); the restart with the smallest distance wins
(the attacker can compute it). The recovered x' is decoded with section 4's nearest-neighbour decoder
(:func:`fedfraud.bench.inversion.nearest`) among candidate places, so its error sits beside the perfect-inversion
bound (decoding L' itself) and a no-information guess.

The attacker's view is deliberately generous, so what this attack recovers bounds what it would recover from a
real update (not what every attack could):

* it observes the gradient of **one** step of the bank's loss on a batch of B ego graphs (the server receives the
  weight difference after a whole local run of Adam steps under FedProx, which is harder to invert: one Adam step
  alone reveals ≈ −lr·sign(g), not g);
* it knows the weights, each graph's structure (edge_index), merchant buckets and history summary, the time
  features T' (edge_attr), and (``known targets``) the next-event targets; dropout is off (the bank's random mask
  is unknown to an attacker in reality);
* the gradient of the merchant table is observed as the per-bucket sums of dL/dX (what its sparse rows hold).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedfraud.bench.harness import rounded, table
from fedfraud.bench.inversion import nearest

__all__ = [
    "AttackCell",
    "DEFAULT_CELLS",
    "GradientInversion",
    "InversionSample",
    "attack_batch",
    "sample_ego_graphs",
]

logger = logging.getLogger(__name__)


#: Views of each graph: the thesis's feature LDP (the mechanism whose L' keeps the clean encoding's shape, so an
#: inversion that recovers L' decodes it; section 4 bounds the calibrated mechanism), and the noise off (δ = 0).
THESIS_VIEW, NOISE_OFF = "thesis LDP", "noise off (δ = 0)"


@dataclass(frozen=True)
class InversionSample:
    """One training-split G_{t-1} with the true place of each node and the next event (the loss's target)."""

    graphs: dict[str, Any]  # view name → torch_geometric Data (same nodes and edges, L' under that view's LDP)
    lat: np.ndarray
    lon: np.ndarray
    prior: np.ndarray
    event: np.ndarray


@dataclass(frozen=True)
class AttackCell:
    """One row of the section: which model, which feature LDP, batch size, targets known or not, the prior, and
    where the search starts.
    """

    model: str = "fresh"  # "fresh" (the weights a bank receives in round 1) or "trained" (after a few steps)
    view: str = THESIS_VIEW  # key of InversionSample.graphs
    batch: int = 1
    known_targets: bool = True
    prior: str = "features"  # "features": x' free in R^d (Geiping); "places": x' = encode(lat', lon')
    init: str = "random place"  # or "truth + noise": the control that the objective has its minimum at the truth

    @property
    def name(self) -> str:
        return (f"{'features x′ free' if self.prior == 'features' else 'places (lat′, lon′) through the encoder'}"
                f", init {self.init}")


#: Start of the control cell: the true L' plus N(0, σ²) per coordinate (the finest location scales have
#: amplitude ≈ 0.016, so σ must stay below it for the start to be "near").
CONTROL_SIGMA = 0.005
#: The rows run by default (each cell: every graph × restarts × steps of a double backward, on one CPU thread).
DEFAULT_CELLS: tuple[AttackCell, ...] = (
    AttackCell(),
    AttackCell(view=NOISE_OFF),
    AttackCell(batch=4),
    AttackCell(known_targets=False),
    AttackCell(model="trained"),
    AttackCell(prior="places"),
    AttackCell(init="truth + noise"),
)


def sample_ego_graphs(
    frame: pd.DataFrame, views: dict[str, Any], ego_cfg: Any, graphs: int, seed: int = 0, min_nodes: int = 2,
) -> list[InversionSample]:
    """``graphs`` G_{t-1} of distinct cardholders of ``frame`` (one bank's rows), each at a random transaction with
    at least ``min_nodes`` nodes, replayed through :class:`~fedfraud.feature_store.egograph.EgoGraphState` (the
    code the bank trains with) and rendered under each featurizer of ``views`` (same bank secret, other LDP).
    """
    from fedfraud.feature_store.egograph import EgoGraphState
    from fedfraud.feature_store.encoders import timestamps_us

    rng = np.random.default_rng(seed)
    first = next(iter(views.values()))
    data = frame.sort_values(["cardholder_id", "timestamp", "transaction_id"], kind="stable")
    holders = data["cardholder_id"].astype(str).to_numpy()
    keys = first.noise_keys(data["transaction_id"]).tolist()
    merchants = first.merchant_hash(data["merchant_id"]).tolist()
    ts = timestamps_us(data["timestamp"]).tolist()
    lat, lon = data["lat"].to_numpy(np.float64).tolist(), data["lon"].to_numpy(np.float64).tolist()
    amount, mcc = data["amount"].to_numpy(np.float64).tolist(), data["mcc"].astype(str).tolist()
    starts = np.flatnonzero(np.r_[True, holders[1:] != holders[:-1]])
    bounds = np.r_[starts, len(data)]
    out: list[InversionSample] = []
    for c in rng.permutation(len(starts)):
        a, b = int(bounds[c]), int(bounds[c + 1])
        if b - a < min_nodes + 1:
            continue
        stop = int(rng.integers(a + min_nodes, b))  # the transaction whose G_{t-1} is attacked
        state = EgoGraphState(ego_cfg)
        for i in range(a, stop):
            state.update(keys[i], merchants[i], lat[i], lon[i], ts[i], amount[i], mcc[i])
        if state.num_nodes < min_nodes:
            continue
        eps = float(first.epsilon([holders[a]])[0])
        rendered = {name: state.to_data(f, eps) for name, f in views.items()}
        node_lat, node_lon = np.array(state.node_lat), np.array(state.node_lon)
        if not state.update(keys[stop], merchants[stop], lat[stop], lon[stop], ts[stop], amount[stop], mcc[stop]):
            continue
        out.append(InversionSample(rendered, node_lat, node_lon, state.prior.copy(), state.last_event.copy()))
        if len(out) == graphs:
            break
    return out


def _loss(model: Any, batch: Any, priors: np.ndarray, events: np.ndarray, soft: Any = None) -> Any:
    """The bank's local loss on one batch (``engine._event_loss`` of the next-event readout + the pooling's aux
    loss); ``soft``: the attacker's soft targets per head (logits) when it does not know the real ones.
    """
    import torch

    from fedfraud.training.anomaly.engine import _event_loss

    out = model.embed(batch)
    if soft is None:
        loss = _event_loss(model, out.q, priors, events, [], np.random.default_rng(0))
    else:
        logits = model.head(out.q)
        loss = torch.stack([-(torch.softmax(soft[h], -1) * torch.log_softmax(logits[h], -1)).sum(-1).mean()
                            for h in model.head.heads]).sum()
    return loss + model.cfg.aux_weight * out.aux_loss


def _gradient(model: Any, batch: Any, x: Any, priors: np.ndarray, events: np.ndarray, soft: Any = None,
              create_graph: bool = False) -> list[Any]:
    """What the attacker observes: dL/dθ of every dense weight, and the merchant table's rows (Σ dL/dX per bucket)."""
    import torch

    params = [p for n, p in model.named_parameters() if n != "encoder.merchant.weight"]
    grads = torch.autograd.grad(_loss(model, replace(batch, x=x), priors, events, soft), [*params, x],
                                create_graph=create_graph, allow_unused=True)
    dense = [g if g is not None else torch.zeros_like(p) for g, p in zip(grads[:-1], params, strict=True)]
    _, inverse = torch.unique(batch.merchant, return_inverse=True)
    rows = torch.zeros(int(inverse.max()) + 1, x.shape[1], dtype=x.dtype).index_add(0, inverse, grads[-1])
    return [*dense, rows]


def _cosine_distance(a: Sequence[Any], b: Sequence[Any]) -> Any:
    """Mean over the observed tensors of 1 − cos: per tensor, so the large head weights, whose gradient hardly
    depends on x, do not drown the first layer's and the merchant rows' (a whole-vector cosine starts at ≈ 0.05
    from a random x' on the fresh model and barely moves).
    """
    terms = [1.0 - (x * y).sum() / (x.norm() * y.norm() + 1e-12) for x, y in zip(a, b, strict=True)
             if float(y.norm()) > 0]
    return sum(terms) / len(terms)


def attack_batch(
    model: Any, graphs: Sequence[Any], priors: np.ndarray, events: np.ndarray, init: Sequence[np.ndarray], *,
    to_features: Callable[[Any], Any] | None = None, known_targets: bool = True, steps: int = 400,
    lr: float = 0.05, seed: int = 0,
) -> tuple[np.ndarray, float, float]:
    """Recover the node features of ``graphs`` from the gradient of one step on them; the restart (one per entry
    of ``init``) with the smallest final gradient distance wins. Free features (``to_features`` None): each init is
    x' ``[n_nodes, d]``. With the encoder as a prior, each init is the leaf that ``to_features`` maps to x' (here
    (lat, lon) degrees ``[n_nodes, 2]``). Returns the winner's x', its final cosine distance and the distance at
    its start.
    """
    import torch

    from fedfraud.training.anomaly.model import collate_graphs

    model.eval()  # dropout off: the attacker's best case
    batch = collate_graphs(graphs)
    truth = batch.x.clone().requires_grad_(True)
    observed = [g.detach() for g in _gradient(model, batch, truth, priors, events)]
    features = to_features or (lambda leaf: leaf)
    best: tuple[np.ndarray, float, float] | None = None
    for r, start in enumerate(init):
        torch.manual_seed(seed + r)
        leaf = torch.tensor(start, dtype=torch.float64 if to_features else torch.float32, requires_grad=True)
        soft = None if known_targets else {
            h: torch.zeros(len(graphs), int(model.head.out[h].out_features), requires_grad=True)
            for h in model.head.heads}
        opt = torch.optim.Adam([leaf, *(soft.values() if soft else [])], lr=lr)
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, [int(steps * f) for f in (0.375, 0.625, 0.875)], 0.1)
        first = float("nan")
        for step in range(steps):
            opt.zero_grad()
            x = features(leaf).float()
            dist = _cosine_distance(_gradient(model, batch, x, priors, events, soft, create_graph=True), observed)
            if step == 0:
                first = float(dist.detach())
            dist.backward()
            opt.step()
            sched.step()
        x = features(leaf.detach()).float().requires_grad_(True)
        final = float(_cosine_distance(_gradient(model, batch, x, priors, events, soft), observed).detach())
        if best is None or final < best[1]:
            best = (x.detach().numpy().copy(), final, first)
    if best is None:
        raise ValueError("attack_batch needs at least one initialisation")
    return best


#: Search settings: Adam steps and learning rate per prior (x' coordinates have amplitudes 0.016–1, lat/lon are
#: degrees), restarts per batch, graphs attacked, and the short training of the "trained" model. One step on a
#: 32-node graph is a double backward of ~12 ms on a free core, ~80 ms at nice 19 on the shared 2-core machine
#: (one cell of 16 graphs × 2 restarts × 500 steps took 21 min there), hence these small defaults.
STEPS, RESTARTS, GRAPHS = 200, 1, 8
LR = {"features": 0.002, "places": 0.5}
TRAIN_STEPS, TRAIN_BATCH = 30, 32


@dataclass
class GradientInversion:
    """Section 5's table: per attack cell, the decoded places' errors (95% CI over graphs) and gradient distances."""

    graphs: int = 0
    nodes: int = 0
    places: int = 0
    banks: int = 0
    steps: int = STEPS
    restarts: int = RESTARTS
    train_steps: int = TRAIN_STEPS
    rows: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def to_markdown_lines(self) -> list[str]:
        """The table, in the format of section 4's."""
        from fedfraud.bench.inversion import LOCATION_STATS

        stats = list(LOCATION_STATS)
        return table(["what the attacker decodes", "model", "feature LDP", "B", "targets",
                      "gradient distance start → end (median)", *(s + " [95% CI]" for s in stats)],
                     ([r["label"], r["model"], r["view"], r["batch"], r["targets"], r["distance"],
                       *(rounded(r["errors"][s]) for s in stats)] for r in self.rows), "lllr")


def _train_briefly(model: Any, pool: Sequence[InversionSample], view: str, steps: int, seed: int) -> None:
    """A few Adam steps of the bank's loss on ``pool`` (graphs not attacked): the "trained" model."""
    import torch

    from fedfraud.training.anomaly.model import collate_graphs

    rng = np.random.default_rng(seed)
    opt = torch.optim.Adam([p for n, p in model.named_parameters() if n != "encoder.merchant.weight"], lr=1e-3)
    model.train()
    for _ in range(steps):
        pick = [pool[int(i)] for i in rng.choice(len(pool), size=min(TRAIN_BATCH, len(pool)), replace=False)]
        batch = collate_graphs([p.graphs[view] for p in pick])
        opt.zero_grad()
        _loss(model, batch, np.stack([p.prior for p in pick]), np.stack([p.event for p in pick])).backward()
        opt.step()
    model.eval()


def run_gradient_inversion(
    data: Path, cfg: Any, cells: Sequence[AttackCell] = DEFAULT_CELLS, graphs: int = GRAPHS, steps: int = STEPS,
    restarts: int = RESTARTS, resamples: int = 200, seed: int = 0,
) -> GradientInversion:
    """Attack ``graphs`` train-split G_{t-1} (spread over the banks) under every cell and decode the result among
    the true places of section 4's sample (plus the nodes' own), beside the perfect inversion and two
    no-information guesses.
    """
    import torch

    from fedfraud.training.bootstrap import bootstrap_statistics
    from fedfraud.bench.inversion import GRID_DEG, LOCATION_STATS, sample_train_rows
    from fedfraud.feature_store.encoders import encode_location, encode_location_torch
    from fedfraud.feature_store.geo import haversine_km
    from fedfraud.feature_store.layout import list_banks, read_bank, split_of
    from fedfraud.feature_store.privacy import PrivateFeaturizer
    from fedfraud.training.anomaly.model import AnomalyModel

    t0 = time.perf_counter()
    banks = list_banks(data)
    samples: list[InversionSample] = []
    pool: list[InversionSample] = []
    perm = np.arange(cfg.encoder.dim)
    for k, bank in enumerate(banks):
        frame = read_bank(data, bank)
        train = frame["cardholder_id"].astype(str).map(lambda c: split_of(c, val_fraction=0.15)).eq("train")
        thesis = cfg.privacy.model_copy(update={"mechanism": "thesis"})
        views = {THESIS_VIEW: PrivateFeaturizer.for_bank(cfg.encoder, thesis, bank),
                 NOISE_OFF: PrivateFeaturizer.for_bank(cfg.encoder, thesis.model_copy(update={"delta": 0.0}), bank)}
        perm = views[THESIS_VIEW].permutation
        want = graphs // len(banks) + (k < graphs % len(banks))
        drawn = sample_ego_graphs(frame.loc[train.to_numpy()], views, cfg.egograph, want + TRAIN_BATCH, seed + k)
        samples += drawn[:want]
        pool += drawn[want:]
    lat = np.concatenate([s.lat for s in samples])
    lon = np.concatenate([s.lon for s in samples])
    graph_of = np.repeat(np.arange(len(samples)), [len(s.lat) for s in samples])
    rows = sample_train_rows(data)
    places = np.unique(np.r_[np.c_[rows["lat"], rows["lon"]], np.c_[lat, lon]], axis=0)
    cand = encode_location(places[:, 0], places[:, 1], cfg.encoder)[:, perm]

    def km(x: np.ndarray) -> np.ndarray:
        j = nearest(x, cand)
        return haversine_km(lat, lon, places[j, 0], places[j, 1])

    rng = np.random.default_rng(seed)
    starts = [places[rng.integers(len(places), size=len(lat))] for _ in range(restarts)]
    errors: dict[str, np.ndarray] = {}
    meta: dict[str, dict[str, Any]] = {}
    none = {"model": "—", "batch": "—", "targets": "—", "distance": "—"}
    for view in (THESIS_VIEW, NOISE_OFF):
        name = f"perfect inversion: L′ itself decoded (section 4's bound), {view}"
        errors[name] = km(np.concatenate([s.graphs[view].x.numpy() for s in samples]))
        meta[name] = {**none, "view": view, "label": name}
    errors["no information: a random true place (the search's start)"] = km(cand[nearest(
        encode_location(starts[0][:, 0], starts[0][:, 1], cfg.encoder)[:, perm], cand)])
    cells_ = np.c_[np.floor(lat / GRID_DEG), np.floor(lon / GRID_DEG)]
    uniq, counts = np.unique(cells_, axis=0, return_counts=True)
    mode = (uniq[counts.argmax()] + 0.5) * GRID_DEG
    errors["no information: the sample's modal 0.05° cell"] = haversine_km(lat, lon, mode[0], mode[1])
    for name in list(errors)[-2:]:
        meta[name] = {**none, "view": "—", "label": name}
    torch.manual_seed(seed)
    fresh = AnomalyModel(cfg.anomaly, cfg.encoder, cfg.egograph.max_nodes)
    models = {"fresh": fresh}
    if any(c.model == "trained" for c in cells):
        trained = AnomalyModel(cfg.anomaly, cfg.encoder, cfg.egograph.max_nodes)
        trained.load_state_dict(fresh.state_dict())
        _train_briefly(trained, pool, THESIS_VIEW, TRAIN_STEPS, seed)
        models["trained"] = trained
    perm_t = torch.as_tensor(perm)

    def through_encoder(leaf: Any) -> Any:
        return encode_location_torch(leaf[:, 0], leaf[:, 1], cfg.encoder)[:, perm_t]

    offsets = np.r_[0, np.cumsum([len(s.lat) for s in samples])]
    for cell in cells:
        tc = time.perf_counter()
        got = np.empty((len(lat), cfg.encoder.dim), np.float32)
        first, final = [], []
        for a in range(0, len(samples), cell.batch):
            part = samples[a:a + cell.batch]
            lo, hi = offsets[a], offsets[a + len(part)]
            truth = np.concatenate([p.graphs[cell.view].x.numpy() for p in part])
            if cell.init == "truth + noise":
                init = [truth + CONTROL_SIGMA * rng.standard_normal(truth.shape).astype(np.float32)]
            elif cell.prior == "places":
                init = [st[lo:hi] for st in starts]
            else:
                init = [encode_location(st[lo:hi, 0], st[lo:hi, 1], cfg.encoder)[:, perm] for st in starts]
            x, d_end, d_start = attack_batch(
                models[cell.model], [p.graphs[cell.view] for p in part], np.stack([p.prior for p in part]),
                np.stack([p.event for p in part]), init, known_targets=cell.known_targets, steps=steps,
                lr=LR[cell.prior], seed=seed + a, to_features=through_encoder if cell.prior == "places" else None)
            got[lo:hi] = x
            first.append(d_start)
            final.append(d_end)
        name = f"{cell}"  # unique per cell
        errors[name] = km(got)
        meta[name] = {"label": f"gradient inversion: {cell.name}", "model": cell.model, "view": cell.view,
                      "batch": cell.batch, "targets": "known" if cell.known_targets else "unknown (optimised)",
                      "distance": f"{np.median(first):.3f} → {np.median(final):.4f}"}
        logger.info("gradient inversion cell=%s seconds=%.0f", cell, time.perf_counter() - tc)
    out = GradientInversion(len(samples), len(lat), len(places), len(banks), steps, restarts, TRAIN_STEPS)
    stats = bootstrap_statistics(errors, graph_of, LOCATION_STATS, resamples=resamples, seed=seed)
    out.rows = [{**meta[name], "errors": row} for name, row in stats.items()]
    out.seconds = time.perf_counter() - t0
    return out

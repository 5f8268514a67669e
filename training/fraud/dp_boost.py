"""The fraud model under cardholder-level DP: random trees whose leaf sums the banks noise under SecAgg+ (issue 36).

Why not the default federation: ``xgboost.federated`` sums every node's gradient histograms inside libxgboost's C++
collective, in clear, with no hook for noise; and choosing each split from exact histograms is itself a release at
every node. Here no split looks at the data.

Method: Maddock, Cormode, Wang, Maple & Jha, *Federated Boosted Decision Trees with Differential Privacy* (ACM CCS
2022, arXiv 2210.02910): *totally random* trees (every split's feature and threshold drawn at random from public
candidates) and Newton leaf weights ``−η·G/(H + λ)`` from noised per-leaf sums of gradients ``G`` and hessians
``H``. The noise is distributed over the banks and only their SecAgg+ sum carries all of it, as in PrivBoost
(Computer Networks 274, 2026) and the anomaly model's DP-FedSGD (:mod:`fedfraud.training.anomaly.distributed_dp`,
whose integer encoding, field and Skellam shares this reuses).

Releases, each one SecAgg+ round in which every bank sends its integer vector plus a Skellam share:

1. **candidates** (training cardholders): for every feature, the cardholder's own distribution of its rows over a
   fixed log-scale grid (sums to 1 per feature), the whole vector clipped to L2 1. The server keeps the bins whose
   noised mass clears ``candidate_cut``·σ (σ of the banks summed) and takes quantiles: the split candidates.
2. **one per tree** (training cardholders): per leaf of the tree the server drew, the cardholder's ``Σ g`` and
   ``Σ h`` over its training rows (``g = w·(p − y)``, ``h = w·p·(1 − p)``, ``w`` = ``positive_weight`` on a fraud
   row, 1 otherwise; ``p`` from the trees so far), the 2L-vector clipped to L2 ``clip``.
3. **threshold** (validation cardholders): each one's histogram of its validation rows' scores (fraud and legit
   rows apart, ``threshold_bins``), clipped to L2 ``threshold_clip``; the server takes the max-F1 threshold of the sum.

**Columns: the cardholder's own history only** (:func:`own_history_columns`). A column computed from other
cardholders' rows (the bank's category-transition table, the bank's and the federation's merchant statistics, the
anomaly score of a model trained on everyone) would let one cardholder move *other* cardholders' vectors, and the
per-cardholder bound below would not hold. Those columns are dropped, and the model ships no transition table.

**Why the model is (ε, δ)-DP per cardholder** (add/remove one cardholder, all of its rows): in every release one
cardholder moves the banks' clean integer sum by its own rounded, clipped vector (L2 ≤ Δ₂, L1 ≤ Δ₁, as in
:class:`~fedfraud.training.anomaly.distributed_dp.DistributedPlan` with q = 1), and the sum the server can decode
carries Skellam noise of variance ≥ σ² (SecAgg+ halts a round below t banks). The trees' structure is drawn by the
server from the public seed and the released candidates only, so every release is the Skellam mechanism on a query
fixed before it: adaptive composition applies. Releases 1 and 2 see training cardholders only, release 3 validation
cardholders only (disjoint sets): a training cardholder's ε composes 1 + ``trees`` Skellam releases (their RDP
summed, integer orders, dp-accounting's ``compute_epsilon``); a validation cardholder's is that of one release.
Calibration puts both at ``epsilon``. Banks' training-cardholder counts are public plan constants, as in DP-FedSGD.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from fedfraud.training.anomaly.config import CardholderDPConfig
from fedfraud.training.anomaly.distributed_dp import (
    ORDERS,
    DistributedPlan,
    clipped_integer_sum,
    decode_sum,
    plan_distributed,
)
from fedfraud.training.federated.accountant import smallest_noise
from fedfraud.training.fraud.config import FraudConfig, FraudDPConfig
from fedfraud.training.fraud.features import FraudFeatures

__all__ = [
    "ACCOUNTANT",
    "BoostPlan",
    "BoostState",
    "RandomTree",
    "bank_release",
    "bank_vector",
    "candidate_thresholds",
    "dp_boost_card",
    "check_splits",
    "check_state",
    "grid_edges",
    "own_history_columns",
    "plan_boost",
    "to_booster",
    "train_dp_boost",
    "train_dp_model",
]

logger = logging.getLogger(__name__)

ACCOUNTANT = (
    "Skellam mechanism RDP (Agarwal, Kairouz & Liu 2021: dp-accounting's Gaussian RDP + the discretisation term), "
    "integer orders 2..256, summed over the candidate release and every tree release (no sampling: every training "
    "cardholder is in every release), dp-accounting compute_epsilon; add/remove one cardholder"
)
#: Grid of the candidate histogram: t(x) = sign(x)·log2(1 + |x|/0.01), cut every 0.5 in [−32, 32]: 1 % resolution
#: near 0, a factor √2 per bin for large values (an amount of 10,000 is t ≈ 20).
_GRID_UNIT, _GRID_STEP, _GRID_MAX = 0.01, 0.5, 32.0


def grid_edges() -> np.ndarray:
    """The candidate histogram's bin edges in feature units (public, the same for every feature)."""
    t = np.arange(-_GRID_MAX, _GRID_MAX + _GRID_STEP / 2, _GRID_STEP)
    return np.sign(t) * _GRID_UNIT * (np.exp2(np.abs(t)) - 1.0)


@dataclass(frozen=True)
class RandomTree:
    """A complete binary tree of ``depth``: internal nodes in breadth-first order (children ``2i+1``, ``2i+2``), a
    row goes left when its value is below the threshold or missing (XGBoost's ``x < split_condition``,
    ``default_left``); ``leaves`` are the released weights, η included.
    """

    features: np.ndarray
    thresholds: np.ndarray
    leaves: np.ndarray
    cover: np.ndarray | None = None  # the leaves' noised hessian sums (SHAP's node weights); None: equal

    @property
    def depth(self) -> int:
        return int(round(math.log2(len(self.features) + 1)))

    def leaf_of(self, X: np.ndarray) -> np.ndarray:
        """The leaf (0..L−1) of every row of ``X`` (used columns)."""
        node = np.zeros(X.shape[0], dtype=np.int64)
        rows = np.arange(X.shape[0])
        thresholds = self.thresholds.astype(np.float32)  # XGBoost compares float32 values with float32 splits
        for _ in range(self.depth):
            x = X[rows, self.features[node]].astype(np.float32)
            right = x >= thresholds[node]  # NaN compares False: missing goes left
            node = 2 * node + 1 + right
        return node - len(self.features)


def draw_tree(candidates: Sequence[np.ndarray], depth: int, rng: np.random.Generator) -> RandomTree:
    """A totally random tree: each internal node's feature uniform among features with candidates, its threshold
    uniform among that feature's candidates (no data, only the released candidates and the public seed).
    """
    usable = [f for f, c in enumerate(candidates) if len(c)]
    if not usable:
        raise ValueError("no feature has a split candidate")
    internal = (1 << depth) - 1
    features = rng.choice(usable, size=internal)
    thresholds = np.array([rng.choice(candidates[f]) for f in features], dtype=np.float64)
    return RandomTree(features.astype(np.int64), thresholds, np.zeros(1 << depth))


@dataclass(frozen=True)
class BoostPlan:
    """What every bank and the server agree on: the three releases' integer plans and the model settings."""

    cfg: FraudDPConfig
    used: tuple[str, ...]
    candidates: DistributedPlan
    trees: DistributedPlan
    threshold: DistributedPlan

    def epsilon_training(self) -> float:
        """ε of a training cardholder over the candidate release and every tree."""
        return _composed_epsilon([(self.candidates, 1), (self.trees, self.cfg.trees)], self.cfg.delta)

    def epsilon_validation(self) -> float:
        """ε of a validation cardholder (the threshold release alone)."""
        return _composed_epsilon([(self.threshold, 1)], self.cfg.delta)


def _rdp(plan: DistributedPlan) -> np.ndarray:
    from fedfraud.training.merchant_risk.dp import skellam_rdp

    return skellam_rdp(plan.noise_std, plan.l1, plan.l2, ORDERS)


def _composed_epsilon(parts: Sequence[tuple[DistributedPlan, int]], delta: float) -> float:
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    total = sum(count * _rdp(plan) for plan, count in parts)
    eps, _ = compute_epsilon(ORDERS, total, delta)
    return float(eps)


def _plan(z: float, clip: float, banks: int, dims: int, cardholders: int, cfg: FraudDPConfig) -> DistributedPlan:
    dp = CardholderDPConfig(enabled=True, noise="distributed", target_epsilon=0.0, noise_multiplier=z,
                            delta=cfg.delta, clipping_norm=clip, sampling_rate=1.0, min_banks=cfg.min_banks)
    return plan_distributed(dp, 1, banks, dims, max(cardholders, 1))


def plan_boost(cfg: FraudDPConfig, used: Sequence[str], banks: int, train_cardholders: int,
               valid_cardholders: int) -> BoostPlan:
    """Calibrate the noise so a training cardholder and a validation cardholder each spend ``cfg.epsilon``.

    The candidate release runs at ``candidate_noise_ratio`` × the trees' noise multiplier (its histogram spreads
    one cardholder's mass over every feature, so it needs less noise to be useful).
    """
    n_feat = len(used)
    hist_dims = n_feat * (len(grid_edges()) + 1)
    leaf_dims = 2 << cfg.depth

    def plans(z: float) -> tuple[DistributedPlan, DistributedPlan]:
        return (_plan(z * cfg.candidate_noise_ratio, 1.0, banks, hist_dims, train_cardholders, cfg),
                _plan(z, cfg.clip, banks, leaf_dims, train_cardholders, cfg))

    def training(z: float) -> float:
        cand, tree = plans(z)
        return _composed_epsilon([(cand, 1), (tree, cfg.trees)], cfg.delta)

    def threshold_plan(z: float) -> DistributedPlan:
        return _plan(z, cfg.threshold_clip, banks, 2 * cfg.threshold_bins, valid_cardholders, cfg)

    def validation(z: float) -> float:
        return _composed_epsilon([(threshold_plan(z), 1)], cfg.delta)

    cand, tree = plans(smallest_noise(training, cfg.epsilon, floor=1e-3))
    threshold = threshold_plan(smallest_noise(validation, cfg.epsilon, floor=1e-3))
    return BoostPlan(cfg, tuple(used), cand, tree, threshold)


def _holders(data: FraudFeatures) -> np.ndarray:
    codes, _ = pd.factorize(data.cardholder.astype(str))
    return codes.astype(np.int64)


def _per_cardholder(codes: np.ndarray, cols: np.ndarray, values: np.ndarray, holders: int, dims: int) -> np.ndarray:
    """``[holders, dims]``: each cardholder's sum of ``values`` at ``cols`` over its rows (``codes``)."""
    per = np.zeros((holders, dims))
    np.add.at(per, (codes, cols), values)
    return per


def bank_vector(kind: str, data: FraudFeatures, plan: BoostPlan, state: BoostState) -> tuple[np.ndarray, int, int]:
    """A bank's clean integer vector for the release ``kind`` (``candidates``, ``tree``, ``threshold``) at the
    server's state; returns (int64 vector, cardholders, cardholders clipped).
    """
    cfg = plan.cfg
    part = data.of_split("valid" if kind == "threshold" else "train")
    if kind != "candidates" and not (len(part) == 0 or part.has_labels):
        raise ValueError(f"the {kind} release needs a label on every row")
    X = _used(part, plan.used)
    codes = _holders(part)
    holders = int(codes.max()) + 1 if len(codes) else 0
    n = len(part)
    if kind == "candidates":
        width = len(grid_edges()) + 1
        finite = np.isfinite(X)
        counts = np.zeros((holders, X.shape[1]))
        np.add.at(counts, codes, finite.astype(np.float64))
        rows, feats = np.nonzero(finite)
        bins = np.searchsorted(grid_edges(), X[rows, feats], side="right")
        # the cardholder's own distribution of its rows over the grid, per feature (sums to 1)
        weight = 1.0 / counts[codes[rows], feats]
        target = plan.candidates
        per = _per_cardholder(codes[rows], feats * width + bins, weight, holders, target.dims)
    elif kind == "tree":
        tree = state.pending
        if tree is None:
            raise ValueError("no tree to fill: the server sent none")
        p = 1.0 / (1.0 + np.exp(-state.margin(X)))
        y = part.label.astype(np.float64)
        w = np.where(y > 0.5, cfg.positive_weight, 1.0)
        leaf = tree.leaf_of(X)
        n_leaves = 1 << cfg.depth
        target = plan.trees
        per = (_per_cardholder(codes, leaf, w * (p - y), holders, target.dims)
               + _per_cardholder(codes, n_leaves + leaf, w * p * (1.0 - p), holders, target.dims))
    elif kind == "threshold":
        scores = 1.0 / (1.0 + np.exp(-state.margin(X)))
        b = np.minimum((scores * cfg.threshold_bins).astype(np.int64), cfg.threshold_bins - 1)
        cols = np.where(part.label > 0.5, b, cfg.threshold_bins + b)
        target = plan.threshold
        per = _per_cardholder(codes, cols, np.ones(n), holders, target.dims)
    else:
        raise ValueError(f"unknown release {kind!r}")
    total, clipped = clipped_integer_sum(per, target)
    return total, holders, clipped


def own_history_columns(names: Sequence[str]) -> tuple[str, ...]:
    """The columns a DP model may read: those computed from the cardholder's own rows only (see the module doc)."""
    from fedfraud.training.fraud.features import ANOMALY_FEATURE, TRANSITION_FEATURE

    shared = (ANOMALY_FEATURE, TRANSITION_FEATURE)
    return tuple(n for n in names if n not in shared and not n.startswith(("merchant_bank_", "merchant_fed_")))


def check_splits(data: FraudFeatures) -> None:
    """Refuse a bank whose training and validation cardholders overlap: the two releases' ε would add up."""
    train = np.unique(data.cardholder[data.split == "train"].astype(str))
    valid = np.unique(data.cardholder[data.split == "valid"].astype(str))
    if len(np.intersect1d(train, valid)):
        raise ValueError("a cardholder has training and validation rows: the two releases' ε would add up")


def _used(data: FraudFeatures, used: Sequence[str]) -> np.ndarray:
    idx = [data.names.index(n) for n in used]
    return data.X[:, idx].astype(np.float64)


def candidate_thresholds(noised: np.ndarray, plan: BoostPlan, banks_summed: int) -> list[np.ndarray]:
    """Split candidates per feature from the decoded candidate sum: bins whose noised mass is below
    ``candidate_cut``·σ are dropped (σ of the ``banks_summed`` shares: m·σ²/t), and the upper edges of the bins
    where the cumulative mass crosses each of ``candidates`` quantiles are kept.
    """
    edges = grid_edges()
    width = len(edges) + 1
    sigma = plan.candidates.noise_std / plan.candidates.scale * math.sqrt(banks_summed / plan.candidates.survivors)
    mass = noised.reshape(len(plan.used), width).astype(np.float64)
    mass = np.where(mass > plan.cfg.candidate_cut * sigma, mass, 0.0)
    out = []
    qs = np.arange(1, plan.cfg.candidates + 1) / (plan.cfg.candidates + 1)
    for row in mass:
        total = row.sum()
        if total <= 0 or np.count_nonzero(row) < 2:
            out.append(np.empty(0))
            continue
        cum = np.cumsum(row) / total
        crossing = np.unique(np.searchsorted(cum, qs, side="left"))
        crossing = crossing[crossing < width - 1]  # the upper edge of bin k is edges[k]
        out.append(np.unique(edges[crossing].astype(np.float32).astype(np.float64)))  # XGBoost's float32 splits
    return out


@dataclass
class BoostState:
    """The server's model so far (post-processing of the releases): candidates, finished trees, the tree being
    filled, the threshold. The banks hold the same state, rebuilt from what the server sends.
    """

    candidates: list[np.ndarray] | None = None
    trees: list[RandomTree] = field(default_factory=list)
    pending: RandomTree | None = None
    threshold: float | None = None

    def margin(self, X: np.ndarray) -> np.ndarray:
        out = np.zeros(X.shape[0])
        for t in self.trees:
            out += t.leaves[t.leaf_of(X)]
        return out

    def to_arrays(self) -> list[np.ndarray]:
        """The state as Flower arrays (what the server sends): a JSON header, then three arrays per tree."""
        trees = [*self.trees, *([self.pending] if self.pending is not None else [])]
        head = {"trees": len(self.trees), "pending": self.pending is not None,
                "candidates": None if self.candidates is None else [c.tolist() for c in self.candidates]}
        out = [np.frombuffer(json.dumps(head).encode(), dtype=np.uint8).copy()]
        for t in trees:
            out += [t.features.astype(np.float64), t.thresholds, t.leaves]
        return out

    @staticmethod
    def from_arrays(arrays: Sequence[np.ndarray]) -> BoostState:
        head = json.loads(np.asarray(arrays[0], dtype=np.uint8).tobytes().decode())
        trees = [RandomTree(np.asarray(arrays[i], dtype=np.float64).astype(np.int64),
                            np.asarray(arrays[i + 1], dtype=np.float64), np.asarray(arrays[i + 2], dtype=np.float64))
                 for i in range(1, len(arrays), 3)]
        cands = head["candidates"]
        return BoostState(None if cands is None else [np.asarray(c, dtype=np.float64) for c in cands],
                          trees[: head["trees"]], trees[head["trees"]] if head["pending"] else None)

    def next_release(self, total_trees: int) -> str | None:
        if self.candidates is None:
            return "candidates"
        if len(self.trees) < total_trees:
            return "tree"
        return "threshold" if self.threshold is None else None


class BoostServer:
    """The server's side: decode each SecAgg+ sum and turn it into candidates, leaf weights or the threshold.

    Has the ``plan``/``apply``/``weights`` of :class:`~fedfraud.training.federated.dp_fedsgd.DPFedSGDStrategy`'s
    server, so the same SecAgg+ strategy runs it.
    """

    def __init__(self, plan: BoostPlan, seed: int) -> None:
        self.boost = plan
        self.plan = plan.trees  # banks, survivors, modulus: the same for the three releases
        self.state = BoostState()
        self.rng = np.random.default_rng([seed, 36])  # the public draw of the trees' structure

    def kind(self) -> str | None:
        return self.state.next_release(self.boost.cfg.trees)

    def apply(self, summed: np.ndarray, banks_summed: int) -> np.ndarray:
        from fedfraud.training.anomaly.distributed_dp import RoundRefused

        if banks_summed < self.plan.survivors:
            raise RoundRefused(f"{banks_summed} banks summed, the plan needs t = {self.plan.survivors}")
        kind = self.kind()
        cfg = self.boost.cfg
        if kind == "candidates":
            noised = decode_sum(summed, self.boost.candidates) / self.boost.candidates.scale
            self.state.candidates = candidate_thresholds(noised, self.boost, banks_summed)
        elif kind == "tree":
            noised = decode_sum(summed, self.boost.trees) / self.boost.trees.scale
            L = 1 << cfg.depth
            G, H = noised[:L], np.maximum(noised[L:], 0.0)
            tree = self.state.pending
            assert tree is not None
            leaves = -cfg.eta * G / (H + cfg.reg_lambda * cfg.clip)
            self.state.trees.append(RandomTree(tree.features, tree.thresholds, leaves, np.maximum(H, 1e-6)))
            self.state.pending = None
        elif kind == "threshold":
            noised = decode_sum(summed, self.boost.threshold) / self.boost.threshold.scale
            self.state.threshold = _threshold_of(noised, cfg.threshold_bins)
        else:
            raise ValueError("the run is complete; no release is pending")
        if self.kind() == "tree" and self.state.pending is None:
            assert self.state.candidates is not None
            self.state.pending = draw_tree(self.state.candidates, cfg.depth, self.rng)
        return noised

    def weights(self) -> list[np.ndarray]:
        return self.state.to_arrays()


def _threshold_of(noised: np.ndarray, bins: int) -> float:
    """The max-F1 threshold (a bin's lower edge) of the noised fraud and legit score histograms (clamped at 0)."""
    from fedfraud.training.fraud.metrics import threshold_from_histograms

    pos, neg = np.maximum(noised[:bins], 0.0), np.maximum(noised[bins:], 0.0)
    threshold, _ = threshold_from_histograms(pos, neg)
    return float(threshold)


def check_state(state: BoostState, plan: BoostPlan) -> None:
    """Refuse a state the plan does not allow (a bank checks what the server sent before touching its data, so a
    malformed tree cannot fail on some rows and not others): shapes, feature indices, finite values, tree count.
    """
    cfg = plan.cfg
    internal, leaves = (1 << cfg.depth) - 1, 1 << cfg.depth
    if state.candidates is not None and (len(state.candidates) != len(plan.used) or not all(
            np.all(np.isfinite(c)) for c in state.candidates)):
        raise ValueError("bad candidates")
    trees = [*state.trees, *([state.pending] if state.pending is not None else [])]
    if len(state.trees) > cfg.trees or (state.pending is not None and state.candidates is None):
        raise ValueError("more trees than the plan")
    for t in trees:
        if (t.features.shape != (internal,) or t.thresholds.shape != (internal,) or t.leaves.shape != (leaves,)
                or t.features.min() < 0 or t.features.max() >= len(plan.used)
                or not np.all(np.isfinite(t.thresholds)) or not np.all(np.isfinite(t.leaves))):
            raise ValueError("bad tree")


def bank_release(data: FraudFeatures, plan: BoostPlan, state: BoostState, rng: np.random.Generator
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """A bank's round: its clean vector for the pending release, its Skellam share, and the residues mod M
    (what goes to SecAgg+); returns (residues, clean, noise, cardholders).
    """
    from fedfraud.training.merchant_risk.dp import skellam_share

    check_state(state, plan)
    kind = state.next_release(plan.cfg.trees)
    if kind is None:
        raise ValueError("the run is complete; no release is pending")
    target = {"candidates": plan.candidates, "tree": plan.trees, "threshold": plan.threshold}[kind]
    clean, holders, clipped = bank_vector(kind, data, plan, state)
    noise = skellam_share(clean.shape, target.share_variance, rng)
    logger.debug("dp_boost_bank release=%s cardholders=%d clipped=%d", kind, holders, clipped)
    return np.mod(clean + noise, target.modulus), clean, noise, holders


def train_dp_boost(banks: Mapping[int, FraudFeatures], cfg: FraudDPConfig, used: Sequence[str], seed: int,
                   noise_seed: int | None = None) -> tuple[BoostServer, dict[str, Any]]:
    """Every release in one process with the Flower path's arithmetic (each bank's residues summed mod M, as
    SecAgg+ does). ``seed`` draws the trees' structure (public); the banks' noise comes from OS entropy, or, with
    ``noise_seed`` (the study's reproducible draws, never a published model), from (noise_seed, bank, round):
    whoever knows that seed can subtract the noise. Returns the server (its state is the model) and a log.
    """
    from tqdm.auto import tqdm

    order = sorted(banks)
    for b in order:
        check_splits(banks[b])
    n_train = sum(len(np.unique(banks[b].cardholder[banks[b].split == "train"])) for b in order)
    n_valid = sum(len(np.unique(banks[b].cardholder[banks[b].split == "valid"])) for b in order)
    plan = plan_boost(cfg, used, len(order), n_train, n_valid)
    server = BoostServer(plan, seed)
    rounds = 2 + cfg.trees
    for r in tqdm(range(rounds), desc="dp-boost releases", leave=False, disable=None):
        state = BoostState.from_arrays(server.weights())  # what the banks receive
        residues = [bank_release(banks[b], plan, state, np.random.default_rng(
            None if noise_seed is None else [noise_seed, b, r]))[0] for b in order]
        server.apply(np.mod(np.sum(residues, axis=0), plan.trees.modulus), len(order))
    log = {"train_cardholders": n_train, "valid_cardholders": n_valid, "rounds": rounds,
           "noise": "OS entropy" if noise_seed is None else f"seeded ({noise_seed}): not a guarantee",
           "candidates_per_feature": [len(c) for c in server.state.candidates or []]}
    return server, log


def to_booster(state: BoostState, used: Sequence[str], nthread: int = 1) -> Any:
    """The trees as an XGBoost booster (so serving, SHAP reasons and batch scoring are the default model's code):
    the JSON of a one-tree template on the same columns, its trees replaced by ours.
    """
    import xgboost as xgb

    n = len(used)
    template = xgb.train({"objective": "binary:logistic", "base_score": 0.5, "max_depth": 1, "nthread": 1,
                          "verbosity": 0},
                         xgb.DMatrix(np.zeros((2, n), dtype=np.float32), label=[0.0, 1.0], feature_names=list(used)),
                         num_boost_round=1)
    doc = json.loads(template.save_raw("json").decode())
    model = doc["learner"]["gradient_booster"]["model"]
    trees = [_tree_json(i, t, n) for i, t in enumerate(state.trees)]
    model["trees"] = trees
    model["tree_info"] = [0] * len(trees)
    model["iteration_indptr"] = list(range(len(trees) + 1))
    model["gbtree_model_param"]["num_trees"] = str(len(trees))
    booster = xgb.Booster()
    booster.load_model(bytearray(json.dumps(doc).encode()))
    booster.set_param({"nthread": nthread})
    return booster


def _tree_json(tree_id: int, tree: RandomTree, num_feature: int) -> dict[str, Any]:
    internal = len(tree.features)
    nodes = 2 * internal + 1
    left = [2 * i + 1 if i < internal else -1 for i in range(nodes)]
    right = [2 * i + 2 if i < internal else -1 for i in range(nodes)]
    parents = [2147483647] + [(i - 1) // 2 for i in range(1, nodes)]
    values = [float(t) for t in tree.thresholds] + [float(v) for v in tree.leaves]
    weights = [0.0] * internal + [float(v) for v in tree.leaves]
    cover = np.zeros(nodes)
    cover[internal:] = np.ones(internal + 1) if tree.cover is None else tree.cover
    for i in range(internal - 1, -1, -1):  # an inner node covers its children
        cover[i] = cover[2 * i + 1] + cover[2 * i + 2]
    return {
        "base_weights": weights, "categories": [], "categories_nodes": [], "categories_segments": [],
        "categories_sizes": [], "default_left": [1] * internal + [0] * (internal + 1), "id": tree_id,
        "left_children": left, "loss_changes": [0.0] * nodes, "parents": parents, "right_children": right,
        "split_conditions": values, "split_indices": [int(f) for f in tree.features] + [0] * (internal + 1),
        "split_type": [0] * nodes, "sum_hessian": [float(c) for c in cover],
        "tree_param": {"num_deleted": "0", "num_feature": str(num_feature), "num_nodes": str(nodes),
                       "size_leaf_vector": "1"},
    }


def train_dp_model(banks: Mapping[int, FraudFeatures], cfg: FraudConfig) -> Any:
    """Variant ``federated-dp`` as a :class:`~fedfraud.training.fraud.model.FraudModel` (kind ``fraud``: serving,
    reasons and batch scoring are the default model's), its card's ``client_dp`` in ``meta``.
    """
    from fedfraud.training.fraud.model import FraudModel

    if len(banks) < 3:
        raise ValueError("federated-dp needs at least 3 banks (SecAgg+)")
    names = next(iter(banks.values())).names
    used = own_history_columns(names)
    if cfg.use_anomaly_score:
        logger.warning("fraud_dp_columns the anomaly score is not a column of a DP model (trained on everyone)")
    server, log = train_dp_boost(banks, cfg.dp, used, cfg.seed)  # the noise: OS entropy, never a known seed
    booster = to_booster(server.state, used, cfg.nthread)
    card = {**dp_boost_card(server.boost), "noise_source": log["noise"],
            "execution": "in-process replay of the SecAgg+ arithmetic (fedfraud train fraud): one process held every "
            "bank's rows, so the (epsilon, delta) is the published model's, against whoever reads it"}
    logger.info("fraud_dp_trained trees=%d epsilon=%.3f delta=%g", len(server.state.trees), card["epsilon"],
                card["delta"])
    threshold = 0.5 if server.state.threshold is None else float(server.state.threshold)
    return FraudModel(booster, names, used, threshold, "federated-dp",
                      {"banks": sorted(banks), "client_dp": card, **log})


def dp_boost_card(plan: BoostPlan) -> dict[str, Any]:
    """The fraud model card's ``client_dp`` entry of a DP-boosted model."""
    cfg = plan.cfg
    return {
        "dp": "on",
        "noise": "distributed",
        "unit_of_privacy": "one cardholder: all of its transactions in its bank (add/remove); a person with cards "
        "at two banks is two cardholders",
        "epsilon": plan.epsilon_training(),
        "delta": cfg.delta,
        "epsilon_validation_cardholders": plan.epsilon_validation(),
        "noise_multiplier_trees": plan.trees.noise_multiplier,
        "noise_multiplier_candidates": plan.candidates.noise_multiplier,
        "noise_multiplier_threshold": plan.threshold.noise_multiplier,
        "trees": cfg.trees, "depth": cfg.depth, "eta": cfg.eta, "clip": cfg.clip,
        "columns": list(plan.used),
        "columns_excluded": "every column computed from other cardholders' rows (category-transition surprise, "
        "merchant statistics, anomaly score): with them one cardholder would move other cardholders' vectors",
        "releases": cfg.trees + 2,
        "banks": plan.trees.banks,
        "min_banks_summed": plan.trees.survivors,
        "train_cardholders": plan.trees.cardholders,
        "accountant": ACCOUNTANT,
        "mechanism": "totally random trees (Maddock et al., CCS 2022) with Newton leaf weights from per-leaf "
        "gradient and hessian sums; per release each bank clips every cardholder's vector, rounds it to integers, "
        "adds a Skellam share of variance sigma^2/t and sends it mod 2**field_bits masked by SecAgg+; the server "
        "decodes only the sum over >= t banks. Releases: split candidates (1), leaf sums (one per tree), the "
        "decision threshold (validation cardholders, 1)",
        "protects": "each training cardholder in the candidates and every tree; each validation cardholder in the "
        "threshold; a single bank's masked vector is not DP by itself and only SecAgg+ keeps it from the server",
        "not_covered": "test cardholders (scalar metrics only); per-bank counts of training and validation "
        "cardholders (public plan constants); a server colluding with k of the m summed banks knows their shares, so "
        "the stated epsilon holds only while k <= m - t",
    }

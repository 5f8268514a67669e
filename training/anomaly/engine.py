"""Local training and evaluation of the anomaly model, shared by the federated clients and the centralized trainer.

One optimizer step takes ``batch_size`` real transitions (G_{t-1}, G_t),
draws one negative G̃_t per pair with the source bank's
:class:`~fedfraud.training.anomaly.negatives.NegativeSampler`, embeds the three graph
lists in one encoder pass and minimises
``BCE(f(q_{t-1}, q_t), 1) + BCE(f(q_{t-1}, q̃_t), 0) + aux_weight·aux + (μ/2)‖w − w_global‖²``
(the last term only in FedProx clients).

Test metrics treat "anomalous" (a perturbed graph) as the positive class and
predict it when the anomaly score 1 − f exceeds 0.5.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import average_precision_score, precision_recall_fscore_support, roc_auc_score
from torch import Tensor
from torch_geometric.data import Batch
from tqdm.auto import tqdm

from fedfraud.training.anomaly.config import AnomalyConfig
from fedfraud.training.anomaly.data import BankData, PairSet
from fedfraud.training.anomaly.dpsgd import CardholderDP, CardholderPool, private_gradient
from fedfraud.training.anomaly.event_negatives import EventNegativeSampler, parse_mix
from fedfraud.training.anomaly.heads import ContrastiveHead, event_targets
from fedfraud.training.anomaly.model import AnomalyModel, eval_mode, score_pairs
from fedfraud.training.anomaly.negatives import NegativeSampler

__all__ = [
    "TASK_METRICS",
    "TrainSource",
    "TrainStats",
    "anomaly_metrics",
    "evaluate_fraud",
    "evaluate_selection",
    "evaluate_task",
    "event_loss",
    "sources_of",
    "train_model",
]

logger = logging.getLogger(__name__)

#: Metric names of the negative-sampling test task, in report order.
TASK_METRICS = ("loss", "accuracy", "precision", "recall", "f1", "roc_auc")


@dataclass(frozen=True)
class TrainSource:
    """Training pairs of one bank with the samplers that perturb them (from that bank's own pool and events)."""

    pairs: PairSet
    sampler: NegativeSampler
    event_sampler: EventNegativeSampler | None = None

    def __post_init__(self) -> None:
        if len(self.pairs) == 0:
            raise ValueError("TrainSource needs at least one pair")


@dataclass(frozen=True)
class TrainStats:
    """What a local training run reports (loss of the first and last epoch, work done)."""

    loss_first: float
    loss_last: float
    steps: int
    examples: int
    seconds: float

    def __post_init__(self) -> None:
        if self.steps < 1 or not (math.isfinite(self.loss_first) and math.isfinite(self.loss_last)):
            raise ValueError(f"training produced no finite loss (steps={self.steps})")


def sources_of(banks: Sequence[BankData], cfg: AnomalyConfig, max_nodes: int) -> list[TrainSource]:
    """One :class:`TrainSource` per bank, each sampler drawing foreign elements from its own bank."""
    return [
        TrainSource(
            b.train,
            NegativeSampler.from_config(b.pool, cfg, max_nodes),
            EventNegativeSampler(b.train.priors, b.train.events, parse_mix(cfg.negatives))
            if cfg.readout == "contrastive"
            else None,
        )
        for b in banks
    ]


def _event_loss(
    model: AnomalyModel,
    q: Tensor,
    priors: np.ndarray,
    events: np.ndarray,
    samplers: Sequence[tuple[EventNegativeSampler | None, np.ndarray]],
    rng: np.random.Generator,
    poisoned: bool = False,
) -> Tensor:
    """Loss of an event readout on real transitions (``q``: embeddings of their G_{t-1}).

    next-event: the summed mean NLL of each head. contrastive: BCE of real vs
    perturbed events; ``samplers`` lists (sampler, rows) so each row's negative
    comes from its own bank. ``poisoned`` (a simulated malicious bank):
    next-event targets shuffled across the batch, contrastive labels swapped.
    """
    if model.cfg.readout == "next-event":
        raw = event_targets(priors, events)
        if poisoned:
            perm = rng.permutation(len(priors))
            raw = {h: t[perm] for h, t in raw.items()}
        targets = {h: torch.from_numpy(t).to(q.device) for h, t in raw.items()}
        nll = model.head.nll(q, targets)  # type: ignore[operator]
        return torch.stack([v.mean() for v in nll.values()]).sum()
    neg_priors, neg_events = priors.copy(), events.copy()
    for sampler, rows in samplers:
        if sampler is None:
            raise ValueError("the contrastive readout needs an EventNegativeSampler")
        neg_priors[rows], neg_events[rows], _ = sampler.perturb(priors[rows], events[rows], rng)
    x_pos = ContrastiveHead.features(priors, events, q.device)
    x_neg = ContrastiveHead.features(neg_priors, neg_events, q.device)
    logits = torch.cat([model.head(q, x_pos), model.head(q, x_neg)])  # type: ignore[operator]
    target = torch.cat([torch.ones(len(priors), device=q.device), torch.zeros(len(priors), device=q.device)])
    return F.binary_cross_entropy_with_logits(logits, 1.0 - target if poisoned else target)


class _Optimizer:
    """Adam for the dense weights and SparseAdam for the merchant table, whose gradient is sparse.

    A step touches only the table rows of the merchants in its batch, so the
    sparse optimizer updates a few hundred rows instead of all
    ``merchant_buckets`` (32k × 128 by default), which dominated the step time
    on CPU. The FedProx term is applied the same way: on the table it covers
    the rows in the batch. Rows never touched locally keep the global value
    exactly, so their term is zero; rows touched earlier are pulled back
    whenever they appear again.
    """

    def __init__(self, model: AnomalyModel, lr: float, proximal_mu: float) -> None:
        self.table = model.encoder.merchant.weight
        self.dense = [p for p in model.parameters() if p is not self.table]
        self.adam = torch.optim.Adam(self.dense, lr=lr, foreach=True)
        self.sparse_adam = torch.optim.SparseAdam([self.table], lr=lr)
        self.mu = proximal_mu
        self.global_dense = [p.detach().clone() for p in self.dense] if proximal_mu > 0 else []
        self.global_table = self.table.detach().clone() if proximal_mu > 0 else None

    def proximal(self, buckets: Tensor) -> Tensor:
        """(μ/2)‖w − w_global‖² over the dense weights and the table rows in ``buckets``."""
        if self.mu <= 0 or self.global_table is None:
            return self.table.new_zeros(())
        dense = sum(((p - g) ** 2).sum() for p, g in zip(self.dense, self.global_dense, strict=True))
        rows = torch.unique(buckets)
        table = ((F.embedding(rows, self.table, sparse=True) - self.global_table[rows]) ** 2).sum()
        return (self.mu / 2.0) * (dense + table)

    def zero_grad(self) -> None:
        self.adam.zero_grad(set_to_none=True)
        self.sparse_adam.zero_grad(set_to_none=True)

    def step(self) -> None:
        self.adam.step()
        self.sparse_adam.step()

    def state_dict(self) -> dict[str, object]:
        return {"adam": self.adam.state_dict(), "sparse_adam": self.sparse_adam.state_dict()}

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        self.adam.load_state_dict(state["adam"])  # type: ignore[arg-type]
        self.sparse_adam.load_state_dict(state["sparse_adam"])  # type: ignore[arg-type]


def train_model(
    model: AnomalyModel,
    sources: Sequence[TrainSource],
    *,
    epochs: int,
    samples_per_epoch: int,
    batch_size: int,
    lr: float,
    seed: Sequence[int] | int,
    proximal_mu: float = 0.0,
    aux_weight: float = 1.0,
    optimizer_state: Mapping[str, object] | None = None,
    progress: bool = False,
    desc: str = "train",
    poisoned: bool = False,
    dp: CardholderDP | None = None,
) -> tuple[TrainStats, dict[str, object]]:
    """Train in place; returns stats and the optimizer state (the centralized trainer carries it across rounds).

    With ``proximal_mu > 0`` the FedProx term pulls the weights towards their
    values at entry (the global model the client received). ``poisoned``
    simulates a malicious bank's data: wrong targets (see :func:`_event_loss`;
    the pair readout's real/perturbed labels are swapped). ``dp``: cardholder-level
    DP-SGD (:mod:`fedfraud.training.anomaly.dpsgd`) with the same number of steps.
    """
    if not sources:
        raise ValueError("train_model needs at least one source")
    if dp is not None:
        if poisoned:
            raise ValueError("a simulated poisoned bank is not supported under cardholder-level DP")
        return _train_private(
            model, sources, dp, epochs=epochs, steps=math.ceil(samples_per_epoch / batch_size), lr=lr, seed=seed,
            proximal_mu=proximal_mu, optimizer_state=optimizer_state, progress=progress, desc=desc,
        )
    device = next(model.parameters()).device
    rng = np.random.default_rng(seed)
    optimizer = _Optimizer(model, lr, proximal_mu)
    if optimizer_state:
        optimizer.load_state_dict(optimizer_state)
    sizes = np.array([len(s.pairs) for s in sources], dtype=np.float64)
    weights = sizes / sizes.sum()
    model.train()
    start = time.perf_counter()
    epoch_losses: list[float] = []
    steps = examples = 0
    for _epoch in tqdm(range(epochs), disable=not progress, desc=desc, leave=False):
        which = rng.choice(len(sources), size=samples_per_epoch, p=weights)
        idx = np.array([rng.integers(sizes[w]) for w in which])
        total, count = 0.0, 0
        for a in range(0, samples_per_epoch, batch_size):
            chosen = [
                (sources[int(w)], int(i))
                for w, i in zip(which[a : a + batch_size], idx[a : a + batch_size], strict=True)
            ]
            b = len(chosen)
            prevs = [src.pairs.previous[i] for src, i in chosen]
            if model.uses_events:  # only G_{t-1} is embedded; the newest event is scored against it
                batch = Batch.from_data_list(prevs).to(device)
                out = model.embed(batch)
                priors = np.stack([src.pairs.priors[i] for src, i in chosen])
                events = np.stack([src.pairs.events[i] for src, i in chosen])
                rows_of: dict[int, list[int]] = {}
                for row, (src, _) in enumerate(chosen):
                    rows_of.setdefault(id(src), []).append(row)
                samplers = [(chosen[r[0]][0].event_sampler, np.array(r)) for r in rows_of.values()]
                loss = _event_loss(model, out.q, priors, events, samplers, rng, poisoned) + aux_weight * out.aux_loss
            else:
                curs = [src.pairs.current[i] for src, i in chosen]
                negs = [src.sampler.perturb(src.pairs.current[i], rng).graph for src, i in chosen]
                batch = Batch.from_data_list(prevs + curs + negs).to(device)
                out = model.embed(batch)
                q_prev, q_cur, q_neg = out.q[:b], out.q[b : 2 * b], out.q[2 * b :]
                logits = torch.cat([model.logits(q_prev, q_cur), model.logits(q_prev, q_neg)])
                target = torch.cat([torch.ones(b, device=device), torch.zeros(b, device=device)])
                if poisoned:
                    target = 1.0 - target
                loss = F.binary_cross_entropy_with_logits(logits, target) + aux_weight * out.aux_loss
            optimizer.zero_grad()
            (loss + optimizer.proximal(batch.merchant)).backward()
            optimizer.step()
            total += float(loss.detach()) * b
            count += b
            steps += 1
            examples += b
        epoch_losses.append(total / max(count, 1))
        logger.debug("%s epoch=%d loss=%.4f", desc, _epoch + 1, epoch_losses[-1])
    stats = TrainStats(epoch_losses[0], epoch_losses[-1], steps, examples, time.perf_counter() - start)
    logger.debug("%s steps=%d steps_per_second=%.1f", desc, stats.steps, stats.steps / max(stats.seconds, 1e-9))
    return stats, optimizer.state_dict()


def _train_private(
    model: AnomalyModel,
    sources: Sequence[TrainSource],
    dp: CardholderDP,
    *,
    epochs: int,
    steps: int,
    lr: float,
    seed: Sequence[int] | int,
    proximal_mu: float,
    optimizer_state: Mapping[str, object] | None,
    progress: bool,
    desc: str,
) -> tuple[TrainStats, dict[str, object]]:
    """``epochs × steps`` DP-SGD steps; the merchant table stays frozen (see :mod:`.dpsgd`).

    The FedProx term's gradient depends on the weights only, so it is added after the noise.
    """
    if model.cfg.readout != "next-event":
        raise ValueError("cardholder-level DP needs the next-event readout")
    rng = np.random.default_rng(seed)
    sets = [s.pairs for s in sources]
    pool = CardholderPool.of(sets)
    table = model.encoder.merchant.weight
    frozen = table.requires_grad
    table.requires_grad_(False)
    optimizer = _Optimizer(model, lr, proximal_mu)
    if optimizer_state:
        optimizer.load_state_dict(optimizer_state)
    no_rows = torch.zeros(0, dtype=torch.long, device=table.device)
    model.train()
    start = time.perf_counter()
    epoch_losses: list[float] = []
    done = examples = 0
    try:
        for epoch in tqdm(range(epochs), disable=not progress, desc=desc, leave=False):
            losses = []
            for _ in range(steps):
                step = private_gradient(model, sets, pool, dp, rng)
                optimizer.zero_grad()
                for name, p in model.named_parameters():
                    if p.requires_grad:
                        p.grad = step.gradient[name]
                prox = optimizer.proximal(no_rows)
                if prox.requires_grad:
                    prox.backward()
                optimizer.step()
                done += 1
                examples += step.cardholders
                if math.isfinite(step.loss):
                    losses.append(step.loss)
            epoch_losses.append(float(np.mean(losses)) if losses else math.nan)
            logger.debug("%s dp epoch=%d loss=%.4f", desc, epoch + 1, epoch_losses[-1])
    finally:
        table.requires_grad_(frozen)
    finite = [x for x in epoch_losses if math.isfinite(x)] or [math.nan]
    stats = TrainStats(finite[0], finite[-1], done, examples, time.perf_counter() - start)
    return stats, optimizer.state_dict()


def anomaly_metrics(is_anomaly: np.ndarray, score: np.ndarray, threshold: float = 0.5) -> dict[str, float]:
    """Accuracy, precision, recall, F1 (anomaly = positive, predicted when score > threshold) and ROC-AUC.

    The thesis's Table 4.1 bundle for telling real transitions from perturbed ones, sent as a Flower
    MetricRecord; the fraud model's bundle (PR-AUC, recall at an FPR, its threshold rule) is
    :func:`fedfraud.training.fraud.metrics.classification_metrics`.
    """
    y = np.asarray(is_anomaly, dtype=bool)
    pred = np.asarray(score) > threshold
    p, r, f1, _ = precision_recall_fscore_support(y, pred, average="binary", zero_division=0)
    auc = roc_auc_score(y, score) if 0 < y.sum() < len(y) else float("nan")
    return {
        "accuracy": float((pred == y).mean()),
        "precision": float(p),
        "recall": float(r),
        "f1": float(f1),
        "roc_auc": float(auc),
    }


def event_loss(model: AnomalyModel, pairs: PairSet, batch_size: int = 256, seed: int = 0) -> float:
    """Mean event-readout loss on ``pairs`` in eval mode (contrastive negatives drawn with a fixed seed)."""
    if len(pairs) == 0:
        return float("nan")
    device = next(model.parameters()).device
    sampler = (
        EventNegativeSampler(pairs.priors, pairs.events, parse_mix(model.cfg.negatives))
        if model.cfg.readout == "contrastive"
        else None
    )
    rng = np.random.default_rng(seed)
    total = 0.0
    with eval_mode(model), torch.no_grad():
        for a in range(0, len(pairs), batch_size):
            rows = np.arange(a, min(a + batch_size, len(pairs)))
            q = model.embed(Batch.from_data_list(pairs.previous[a : a + batch_size]).to(device)).q
            priors, events = pairs.priors[rows], pairs.events[rows]
            loss = _event_loss(model, q, priors, events, [(sampler, np.arange(len(rows)))], rng)
            total += float(loss) * len(rows)
    return total / len(pairs)


def evaluate_selection(model: AnomalyModel, bank: BankData, batch_size: int = 256) -> dict[str, float]:
    """The model-selection metric on validation cardholders, ``val_loss`` (event readouts; else empty).

    Thesis readouts have no validation task and keep the last round. A bank
    without validation cardholders reports NaN (every bank sends the same keys;
    the mean over banks skips it).
    """
    if not model.uses_events:
        return {}
    return {"val_loss": event_loss(model, bank.val, batch_size)}


def evaluate_task(model: AnomalyModel, bank: BankData, batch_size: int = 256) -> dict[str, float]:
    """Metrics on the negative-sampling test task: each test transition vs its fixed perturbed twin.

    Event readouts have no graph twin: they report their own loss on test cardholders (``loss``).
    """
    if model.uses_events:
        return {"loss": event_loss(model, bank.test, batch_size)}
    test = bank.test
    real = score_pairs(model, test.previous, test.current, batch_size)
    fake = score_pairs(model, test.previous, bank.test_negatives, batch_size)
    score = np.r_[real, fake]
    is_anomaly = np.r_[np.zeros(len(real), dtype=bool), np.ones(len(fake), dtype=bool)]
    eps = 1e-7
    loss = -float(np.mean(np.log(np.clip(1 - real, eps, 1))) + np.mean(np.log(np.clip(fake, eps, 1)))) / 2
    return {"loss": loss, **anomaly_metrics(is_anomaly, score)}


def evaluate_fraud(model: AnomalyModel, bank: BankData, batch_size: int = 256) -> dict[str, float]:
    """ROC-AUC and PR-AUC of the anomaly score against true fraud labels on test cardholders' real transitions.

    Normal transitions are a reservoir sample; their weights (inverse sampling
    rate) make PR-AUC refer to the bank's true fraud prevalence.
    """
    labels, weights = bank.fraud_labels, bank.fraud_weights
    if not 0 < labels.sum() < len(labels):
        return {"fraud_roc_auc": float("nan"), "fraud_pr_auc": float("nan"), "fraud_n": float(labels.sum())}
    ev = bank.fraud_eval
    score = score_pairs(model, ev.previous, ev.current, batch_size, ev.priors, ev.events)
    return {
        "fraud_roc_auc": float(roc_auc_score(labels, score, sample_weight=weights)),
        "fraud_pr_auc": float(average_precision_score(labels, score, sample_weight=weights)),
        "fraud_n": float(labels.sum()),
    }

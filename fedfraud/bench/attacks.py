"""Attacks on what leaves a bank, measured with and without DP: what a curious server (or anyone holding a released
model) learns about a bank's cardholders and transactions.

``fedfraud bench attacks --csv ../shared/data/sparkov_dev_1000cards_2022H1.csv.gz``
runs :func:`run_attacks_bench` and prints :meth:`AttacksBench.to_markdown`
for ``docs/benchmarks.md``.

1. **Membership inference on cardholders (anomaly model)**, the loss-threshold
   attack of Yeom et al. (2018): the attacker holds the released model and a
   cardholder's transactions and guesses "member" when the model's mean
   anomaly score over them is low. Members are the train-split cardholders,
   non-members the validation and test cardholders (the split is by
   cardholder, :func:`fedfraud.feature_store.layout.split_of`). The models are those of
   the privacy bench at a small budget: DP off and client-level DP at a few ε,
   cached under ``--work``. SecAgg+ does not enter: the attack reads the
   released model, which SecAgg+ does not change.
2. **What the server learns from the fraud model's histograms**
   (:mod:`fedfraud.training.fraud.federated.hist`): the histogram federation runs for
   real with a recording proxy between every bank and the server
   (:class:`fedfraud.training.fraud.federated.wire.RecordingProxy`); the root
   histogram of the first tree, decoded off the wire, gives the bank's row
   counts per bin of every feature (hessian Σ w/4 and gradient Σ w(½ − y)
   give the counts of frauds and of legit rows). The reconstruction of the
   bank's amount and hour distributions is compared with the truth (the bank's
   rows binned with the cuts its worker used) by total-variation distance,
   beside the federation-wide pooled distribution (what a server knows under
   secure aggregation, which leaves only the sum) and under Laplace noise on
   the counts at a few ε (what DP on the histograms would give; not in the
   product).
3. **Merchant membership from one bank's anomaly-model update**: the merchant
   table's sparse updates move only the rows a bank's batches touched. The
   banks' round-1 replies, as the server-side strategy receives them
   (clipped under DP), are captured by the strategy's observer while the
   membership models train; each (bank, bucket) pair is scored by the row's
   movement against the keyed buckets of the bank's training transactions.
   Also scored: the mean of the replies (all SecAgg+ leaves the server) and
   the released global model.
4. **What a perfect inversion of an update recovers** (:mod:`fedfraud.bench.inversion`): the LDP bound, the
   thesis's divergence condition made concrete. No model is needed: ``--inversion-only`` runs this section alone.
5. **An iterative gradient-inversion attack** (:mod:`fedfraud.bench.gradient_inversion`): "Inverting Gradients"
   (Geiping et al. 2020) on the anomaly model's gradient of one local step, decoded like section 4. Off by default
   (tens of minutes on a shared CPU): ``--gradient-inversion`` adds it, ``--gradient-inversion-only`` runs it alone.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedfraud.bench.adversary import reused
from fedfraud.bench.detection import DETECTION_SETTINGS, ingested, train_run
from fedfraud.bench.harness import loads_now, machine_line, table, timing_lines
from fedfraud.training.bootstrap import Interval, bootstrap_by_group
from fedfraud.bench.gradient_inversion import CONTROL_SIGMA, GRAPHS, LR, RESTARTS, STEPS, GradientInversion
from fedfraud.bench.inversion import GRID_DEG, INVERSION_ROWS, InversionBound

__all__ = [
    "ATTACK_EPSILONS",
    "ATTACK_SETTINGS",
    "AttacksBench",
    "HistogramLeak",
    "MembershipResult",
    "MerchantResult",
    "histogram_leak",
    "membership_inference",
    "merchant_membership",
    "run_attacks_bench",
]

logger = logging.getLogger(__name__)

#: The budget of the adversary bench's cells, cut to one round (a cell trains in ~2 min on 2 shared cores).
ATTACK_SETTINGS: dict[str, Any] = {"rounds": 1, "local-epochs": 2}
#: DP off and the privacy bench's smallest and largest finite ε.
ATTACK_EPSILONS: tuple[float, ...] = (math.inf, 1.0, 8.0)
#: ε of the Laplace noise on the histogram counts ("what DP on the histograms would give").
HISTOGRAM_EPSILONS: tuple[float, ...] = (10.0, 1.0, 0.1)
#: The histogram table's baseline row.
POOLED = "baseline: the federation's pooled distribution (all a server learns under SecAgg of the histograms)"
#: The fraud features whose distributions the histogram attack reconstructs.
HISTOGRAM_FEATURES: tuple[str, ...] = ("amount", "hour_utc")


def _dp_name(epsilon: float) -> str:
    return "DP off" if math.isinf(epsilon) else f"client-level DP ε={epsilon:g}"


# ---------------------------------------------------------------------------- 1. membership inference
@dataclass(frozen=True)
class MembershipResult:
    """The loss-threshold attack on one released model: its ROC-AUC over cardholders and the counts."""

    setting: str
    epsilon: float
    card: dict[str, Any]
    auc: Interval
    members: int
    non_members: int
    member_score: float
    non_member_score: float


def cardholder_scores(
    data: Path, registries: dict[str, Path], privacy_cfg: Any, max_per_cardholder: int
) -> pd.DataFrame:
    """One row per cardholder: its split and, per model, the mean anomaly score of its first
    ``max_per_cardholder`` transactions (the attacker's view: the model and the cardholder's transactions).
    """
    from fedfraud.feature_store.layout import list_banks, read_bank, split_of
    from fedfraud.feature_store.privacy import PrivateFeaturizer
    from fedfraud.training.anomaly.scorer import AnomalyScorer

    scorers = {name: AnomalyScorer.from_registry(path, device="cpu") for name, path in registries.items()}
    parts = []
    for bank in list_banks(data):
        frame = read_bank(data, bank)
        frame = frame.groupby("cardholder_id", sort=False).head(max_per_cardholder).reset_index(drop=True)
        part = pd.DataFrame({"cardholder_id": frame["cardholder_id"].astype(str)})
        for name, scorer in scorers.items():
            featurizer = PrivateFeaturizer.for_bank(scorer.encoder_cfg, privacy_cfg, bank)
            part[name] = scorer.score_frame(frame, featurizer)
        per = part.groupby("cardholder_id").mean()
        per["split"] = [split_of(c, val_fraction=0.15) for c in per.index]
        parts.append(per)
        logger.info("attacks_bench membership bank=%d rows=%d cardholders=%d", bank, len(frame), len(per))
    return pd.concat(parts)


def membership_inference(
    per_cardholder: pd.DataFrame, models: dict[str, tuple[float, dict[str, Any]]], resamples: int, seed: int = 0
) -> list[MembershipResult]:
    """The attack's ROC-AUC for "train-split cardholder" against the negated mean score, per model, with a
    95% bootstrap interval over cardholders; cardholders without a finite score in every model are dropped.
    """
    cols = list(models)
    table = per_cardholder.dropna(subset=cols)
    member = table["split"].eq("train").to_numpy()
    got = bootstrap_by_group(
        member, {c: -table[c].to_numpy(dtype=np.float64) for c in cols}, table.index.to_numpy(),
        resamples=resamples, seed=seed,
    )
    out = []
    for name, (eps, card) in models.items():
        scores = table[name].to_numpy(dtype=np.float64)
        out.append(MembershipResult(
            name, eps, card, got[name]["roc_auc"], int(member.sum()), int((~member).sum()),
            float(scores[member].mean()), float(scores[~member].mean()),
        ))
    return out


@dataclass(frozen=True)
class TrainedModel:
    """One federated model of the bench: its registry, ε, DP card, training time, and what the server received."""

    registry: Path
    epsilon: float
    card: dict[str, Any]
    seconds: float
    rows: Path | None


#: Per model, the merchant-table row movements the server saw in round 1 (written next to the registry).
MERCHANT_ROWS = "merchant-rows.npz"
TABLE = "encoder.merchant.weight"


def _row_norms(table: Any, initial: Any) -> np.ndarray:
    return (table.double() - initial.double()).norm(dim=1).numpy()


def capture_merchant_rows(settings: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """An observer for :func:`~fedfraud.training.anomaly.federated.trainer.run_federated` and what it fills: for
    round 1, each bank's reply (as the server-side strategy receives it: clipped under DP) turned into the L2 norm
    of every merchant-table row's change from the initial global model, and the same for the mean of the replies
    (what SecAgg+ leaves the server: ``tests/integration/test_secagg.py`` checks its aggregate equals this mean
    within 1e-4).
    """
    from fedfraud.training.anomaly.federated.task import build_model

    initial = build_model(settings).state_dict()[TABLE]
    got: dict[str, np.ndarray] = {}

    def observer(kind: str, rnd: int, replies: list[Any]) -> None:
        if kind != "train" or rnd != 1:
            return
        tables = {int(r.content["metrics"]["partition-id"]): r.content["arrays"].to_torch_state_dict()[TABLE]
                  for r in replies}
        banks = sorted(tables)
        got["banks"] = np.asarray(banks)
        got["per_bank"] = np.stack([_row_norms(tables[b], initial) for b in banks])
        deltas = [tables[b].double() - initial.double() for b in banks]  # in float64: no rounding in untouched rows
        got["mean"] = (sum(deltas) / len(deltas)).norm(dim=1).numpy()

    return observer, got


def trained_models(data: Path, work: Path, epsilons: Sequence[float], base: dict[str, Any]) -> dict[str, TrainedModel]:
    """One federated model per ε under ``work``, reused when an earlier invocation published it with the same
    settings (with the merchant rows it captured then, if any).
    """
    from fedfraud.training.anomaly.run import Checkpoint, checkpoint_dir
    from fedfraud.training.anomaly.federated.task import RunSettings, build_model
    from fedfraud.training.registry import ModelRegistry

    out: dict[str, TrainedModel] = {}
    for eps in epsilons:
        dp = {"dp-enabled": False} if math.isinf(eps) else {"dp-enabled": True, "dp-target-epsilon": float(eps)}
        tag = f"attacks-{'inf' if math.isinf(eps) else f'eps{eps:g}'}"
        flat = {**base, **dp}
        found = reused(data, work, flat, tag)
        if found is None:
            settings = RunSettings.from_flat({**flat, "data-dir": str(data)})
            observer, got = capture_merchant_rows(settings)
            registry, seconds = train_run(data, work, "federated", flat, name=tag, observer=observer)
            if got:
                released = Checkpoint.load(checkpoint_dir(registry, "federated")).selected[1][TABLE]
                got["released"] = _row_norms(released, build_model(settings).state_dict()[TABLE])
                np.savez(registry / MERCHANT_ROWS, **got)
        else:
            registry, seconds = found
        card = dict(ModelRegistry(registry).get("anomaly", "latest").privacy.get("client_dp", {}))
        rows = registry / MERCHANT_ROWS
        out[_dp_name(eps)] = TrainedModel(registry, float(eps), card, seconds, rows if rows.exists() else None)
        logger.info("attacks_bench model=%s wall=%.1f", tag, seconds)
    return out


# ---------------------------------------------------------------------------- 3. merchant membership
@dataclass(frozen=True)
class MerchantResult:
    """The merchant-membership attack in one setting: ROC-AUC over (bank, bucket) pairs and the counts."""

    setting: str
    view: str
    auc: Interval
    visited: int
    pairs: int


def bank_buckets(data: Path, settings: Any) -> dict[int, np.ndarray]:
    """Per bank, the merchant-table rows (keyed buckets, as the bank computes them) of its train-split
    transactions: the ground truth "visited by this bank" of the merchant attack.
    """
    from fedfraud.feature_store.layout import list_banks, read_bank, split_of
    from fedfraud.feature_store.privacy import PrivateFeaturizer

    out: dict[int, np.ndarray] = {}
    for bank in list_banks(data):
        frame = read_bank(data, bank, columns=["cardholder_id", "merchant_id"])
        train = frame["cardholder_id"].astype(str).map(lambda c: split_of(c, val_fraction=0.15)).eq("train")
        merchants = frame.loc[train.to_numpy(), "merchant_id"].astype(str).unique()
        featurizer = PrivateFeaturizer.for_bank(settings.encoder, settings.privacy, bank)
        out[bank] = np.unique(featurizer.merchant(merchants))
    return out


def merchant_membership(
    models: dict[str, TrainedModel], truth: dict[int, np.ndarray], resamples: int, seed: int = 0
) -> list[MerchantResult]:
    """Per model and view (the bank's own update, the SecAgg+ sum, the released model), the ROC-AUC of "this
    bucket was visited by this bank" scored by the row's movement, over every (bank, bucket) pair; 95% bootstrap
    interval over buckets (the same draws for every bank).
    """
    views = (
        ("per_bank", "server reads the bank's own update (default path)"),
        ("mean", "SecAgg+: server reads only the sum, attributes it to every bank"),
        ("released", "anyone holding the released global model"),
    )
    out: list[MerchantResult] = []
    for name, model in models.items():
        if model.rows is None:
            continue
        with np.load(model.rows, allow_pickle=False) as z:
            rows = {k: z[k] for k in z.files}
        banks = [int(b) for b in rows["banks"]]
        n = rows["mean"].shape[0]
        label = np.concatenate([np.isin(np.arange(n), truth[b]) for b in banks])
        group = np.tile(np.arange(n), len(banks))
        scores: dict[str, np.ndarray] = {}
        for key, _ in views:
            per = rows[key] if key == "per_bank" else np.tile(rows[key], (len(banks), 1))
            scores[key] = per.reshape(-1)
        got = bootstrap_by_group(label, scores, group, resamples=resamples, seed=seed)
        out += [MerchantResult(name, view, got[key]["roc_auc"], int(label.sum()), int(label.size))
                for key, view in views]
    return out


# ---------------------------------------------------------------------------- 2. the fraud model's histograms
def _tv(p: np.ndarray, q: np.ndarray) -> float:
    """Total-variation distance between two count vectors, each normalized to a distribution."""
    p, q = np.clip(np.asarray(p, dtype=np.float64), 0, None), np.clip(np.asarray(q, dtype=np.float64), 0, None)
    if p.sum() <= 0 or q.sum() <= 0:
        return 1.0
    return 0.5 * float(np.abs(p / p.sum() - q / q.sum()).sum())


def binned(values: np.ndarray, cuts: np.ndarray) -> np.ndarray:
    """Counts of ``values`` per XGBoost hist bin (``cuts``: a feature's upper bounds; the first bin whose bound is
    above the value, the last bin for anything beyond); missing values are in no bin, as in the histograms.
    """
    values = np.asarray(values, dtype=np.float32)
    values = values[np.isfinite(values)]
    idx = np.minimum(np.searchsorted(cuts, values, side="right"), len(cuts) - 1)
    return np.bincount(idx, minlength=len(cuts)).astype(np.float64)


@dataclass(frozen=True)
class BankHistograms:
    """What the server decoded off one bank's wire for the first tree's root, and that bank's truth."""

    bank: int
    rows: int
    reconstructed: dict[str, np.ndarray]
    truth: dict[str, np.ndarray]


@dataclass
class HistogramLeak:
    """Per bank and feature: the exact reconstruction, the pooled baseline and Laplace-noised reconstructions."""

    banks: list[BankHistograms]
    features: tuple[str, ...]
    n_features: int
    total_bins: int
    scale_pos_weight: float
    messages: dict[int, int]
    tv: dict[str, dict[str, Interval]] = field(default_factory=dict)
    per_bank: dict[int, dict[str, tuple[float, float]]] = field(default_factory=dict)


def capture_root_histograms(
    banks: dict[int, Any], cfg: Any, workdir: Path, timeout_s: float = 1800.0
) -> tuple[dict[int, np.ndarray], dict[str, tuple[int, np.ndarray]], float, dict[int, int]]:
    """Run the real histogram federation (one tree) with a recording proxy between every bank and the server.

    Returns per bank the root histogram of the first tree as sent (``[total_bins, 2]``: Σ gradient, Σ hessian),
    the cuts its worker used (feature → (offset in the histogram, upper bounds)), the pooled ``scale_pos_weight``
    and how many requests each bank sent.
    """
    from fedfraud.core.net import free_port
    from fedfraud.training.fraud.federated.hist import HistJob, federated_hist_train
    from fedfraud.training.fraud.federated.wire import RecordingProxy

    order = sorted(banks)
    port = free_port()
    proxies = {rank: RecordingProxy(port) for rank in range(len(order))}
    try:
        models = federated_hist_train(
            banks, cfg, [HistJob("base")], tls=False, timeout_s=timeout_s, rounds=1, port=port, workdir=workdir,
            worker_address={rank: f"127.0.0.1:{p.port}" for rank, p in proxies.items()},
        )
    finally:
        for p in proxies.values():
            p.close()
    with np.load(Path(workdir) / "rank_0.base.cuts.npz", allow_pickle=False) as z:
        indptr, values, names = z["indptr"], z["values"], z["names"].tolist()
    # per feature: [min, upper bound of bin 1, ..., of bin k]; the histogram holds k bins per feature
    cuts: dict[str, tuple[int, np.ndarray]] = {}
    offset = 0
    for f, name in enumerate(names):
        bounds = values[int(indptr[f]) + 1:int(indptr[f + 1])]
        cuts[str(name)] = (offset, bounds)
        offset += len(bounds)
    total_bins = offset
    roots: dict[int, np.ndarray] = {}
    sent: dict[int, int] = {}
    for rank, b in enumerate(order):
        buffers = [m.send_buffer for m in proxies[rank].messages()]
        sent[b] = len(buffers)
        hist = [x for x in buffers if len(x) == 16 * total_bins]
        if not hist:
            raise RuntimeError(f"bank {b}: no {total_bins}-bin histogram among its {len(buffers)} requests")
        roots[b] = np.frombuffer(hist[0], "<f8").reshape(-1, 2)
    return roots, cuts, float(models["base"].meta["scale_pos_weight"]), sent


def row_counts(root: np.ndarray, scale_pos_weight: float) -> np.ndarray:
    """Rows per bin from a first-tree root histogram (base score ½): H = Σ w/4 and G = Σ w(½ − y), w = spw for
    frauds, give frauds = (4H − 2G)/(2 spw) and legit rows = (4H + 2G)/2.
    """
    grad, hess = root[:, 0], root[:, 1]
    frauds = (4 * hess - 2 * grad) / (2 * scale_pos_weight)
    legit = (4 * hess + 2 * grad) / 2
    return frauds + legit


def histogram_leak(
    banks: dict[int, Any], cfg: Any, workdir: Path, epsilons: Sequence[float] = HISTOGRAM_EPSILONS,
    features: Sequence[str] = HISTOGRAM_FEATURES, draws: int = 200, seed: int = 0,
) -> HistogramLeak:
    """The server's reconstruction of each bank's binned ``features`` distributions from the real first root
    histogram it received, against the truth; the pooled (federation-sum) baseline; Laplace noise on the counts.

    Noise, per unit: one transaction is one row, in one bin of each of the F features, so the root histogram's
    counts have L1 sensitivity F (scale F/ε); one cardholder has up to m rows (scale m·F/ε, m the largest
    number of training rows of one cardholder in that bank). ε covers this one message only.
    """
    roots, cuts, spw, sent = capture_root_histograms(banks, cfg, workdir)
    missing = [f for f in features if f not in cuts]
    if missing:
        raise ValueError(f"features {missing} not among the histogram's {sorted(cuts)}")
    n_features = len(cuts)
    counts = {b: row_counts(r, spw) for b, r in roots.items()}
    pooled = sum(counts.values())
    out: list[BankHistograms] = []
    for b, data in sorted(banks.items()):
        train = data.split == "train"
        rec, truth = {}, {}
        for name in features:
            offset, bounds = cuts[name]
            rec[name] = counts[b][offset:offset + len(bounds)]
            truth[name] = binned(data.X[train, data.names.index(name)], bounds)
        out.append(BankHistograms(b, int(train.sum()), rec, truth))
    leak = HistogramLeak(out, tuple(features), n_features, sum(len(c) for _, c in cuts.values()), spw, sent)
    rng = np.random.default_rng(seed)
    settings: list[tuple[str, float]] = [("server reads the bank's root histogram (no noise, no SecAgg)", 0.0)]
    settings += [(f"Laplace on the counts, ε={e:g} per transaction (not in the product)", n_features / e)
                 for e in epsilons]
    per_cardholder = max(int(pd.Series(d.cardholder[d.split == "train"]).value_counts().max()) for d in banks.values())
    settings.append((f"Laplace on the counts, ε=1 per cardholder (≤ {per_cardholder} rows; not in the product)",
                     per_cardholder * n_features))
    for label, scale in settings:
        row: dict[str, Interval] = {}
        for name in features:
            offset, bounds = cuts[name]
            k = len(bounds)
            samples = np.empty(draws if scale > 0 else 1)
            for i in range(len(samples)):
                tvs = [_tv(bh.reconstructed[name] + (rng.laplace(0.0, scale, k) if scale > 0 else 0.0),
                           bh.truth[name]) for bh in out]
                samples[i] = float(np.mean(tvs))
            row[name] = Interval(float(np.median(samples)), float(np.quantile(samples, 0.025)),
                                 float(np.quantile(samples, 0.975)))
        leak.tv[label] = row
    base: dict[str, Interval] = {}
    for name in features:
        offset, bounds = cuts[name]
        v = float(np.mean([_tv(pooled[offset:offset + len(bounds)], bh.truth[name]) for bh in out]))
        base[name] = Interval(v, v, v)
    leak.tv[POOLED] = base
    for bh in out:
        leak.per_bank[bh.bank] = {
            name: (_tv(bh.reconstructed[name], bh.truth[name]),
                   _tv(pooled[cuts[name][0]:cuts[name][0] + len(cuts[name][1])], bh.truth[name]))
            for name in features
        }
    return leak


# ---------------------------------------------------------------------------- the bench
@dataclass
class AttacksBench:
    """The attack tables of one invocation, with the settings and the load average at start and end."""

    source: str
    settings: dict[str, Any]
    membership: list[MembershipResult] = field(default_factory=list)
    control: MembershipResult | None = None
    max_per_cardholder: int = 0
    histograms: HistogramLeak | None = None
    merchants: list[MerchantResult] = field(default_factory=list)
    merchant_buckets: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    load: tuple[str, str] = ("", "")
    label: str = ""
    inversion: InversionBound | None = None
    inversion_only: bool = False
    gradient: GradientInversion | None = None
    gradient_only: bool = False

    def _membership_table(self) -> list[str]:
        def row(r: MembershipResult) -> list[object]:
            c = r.card
            dp = f"z = {c['noise_multiplier']:.3f}, ε = {c['epsilon']:.3f}" if c.get("dp") == "on" else "off"
            secagg = "no effect (the attack reads the released model)"
            if r.setting == CONTROL:
                dp = secagg = "—"
            return [r.setting, dp, secagg, r.auc, f"{r.members} / {r.non_members}",
                    f"{r.member_score:.4f} / {r.non_member_score:.4f}"]

        return table(["released model", "DP (card)", "SecAgg+", "attack ROC-AUC [95% CI]", "members / non-members",
                      "mean score members / non-members"],
                     [*map(row, [*self.membership, *([self.control] if self.control else [])]),
                      ["no-information baseline (a coin)", "—", "—", "0.500", "—", "—"]])

    def _histogram_intro(self) -> str:
        h, s = self.histograms, self.settings
        if h is None:
            return "Not run (`--no-histograms`)."
        return (
            "The histogram federation runs for real (`fedfraud.training.fraud.federated.hist`: an `xgboost.federated` "
            "server and one worker process per bank, plaintext so a recording proxy between each bank and the server "
            "reads every request; in production TLS hides them from the wire but not from the server). From each "
            "bank's first root histogram (base score ½: Σ w/4 and Σ w(½ − y) per bin) the server computes the bank's "
            "training rows per bin of every feature. TV: total-variation distance between the server's estimate and "
            "the bank's true distribution over the same bins (the cuts its worker used), mean over the 5 banks. The "
            f"root histogram of the first tree holds {h.total_bins:,} bins over {h.n_features} features (max_bin "
            f"{s.get('max_bin', 256)}); pooled scale_pos_weight {h.scale_pos_weight:.1f}. Noise rows: Laplace noise "
            "added to the decoded counts, negative counts set to 0, 95% range over 200 draws; ε covers this one "
            "message only (every node of every tree sends one more). The exact and pooled rows have no randomness."
        )

    def _histogram_tables(self) -> list[str]:
        h = self.histograms
        if h is None:
            return []
        feats = h.features
        rows = {bh.bank: bh.rows for bh in h.banks}
        return [
            *table(["what the server has", *(f"TV to the bank's `{f}` distribution [95%]" for f in feats)],
                   ([k, *(v[f] for f in feats)] for k, v in h.tv.items())),
            "",
            "Per bank (no noise): TV of the server's reconstruction / TV of the pooled baseline; training rows.",
            "",
            *table(["bank", "training rows", "requests to the server",
                    *(f"`{f}` reconstruction / pooled" for f in feats)],
                   ([b, f"{rows[b]:,}", h.messages[b], *(f"{per[f][0]:.1e} / {per[f][1]:.3f}" for f in feats)]
                    for b, per in h.per_bank.items()), "rrr"),
        ]

    def _merchant_table(self) -> list[str]:
        if not self.merchants:
            return ["(no model of this invocation captured its round-1 replies)"]
        return table(["model", "what the attacker reads", "attack ROC-AUC [95% CI]",
                      "visited (bank, bucket) pairs / all"],
                     [*([r.setting, r.view, r.auc, f"{r.visited:,} / {r.pairs:,}"] for r in self.merchants),
                      ["—", "no-information baseline (a coin)", "0.500", "—"]])

    def _inversion_section(self) -> list[str]:
        v = self.inversion
        if v is None:
            return ["Not run (`--no-inversion`)."]
        return [
            "A bank trains on the noised embeddings L', T' (the model input is X = L' + M[merchant]), so every "
            "update leaving it is g(x̃), x̃ = M(x; ε, δ): an attacker who inverts an update *perfectly* holds L' and "
            "T', never L and T (the thesis's divergence condition E(g(x), g(x')) < E(g(x̃), g(x'))). The rows are "
            "what that attacker learns: it decodes each row's L' by nearest neighbour among the encodings of "
            "candidate places and T' among those of candidate times, and the error is the distance to the true place "
            "and time. No iterative gradient inversion is run: a real one recovers at best x̃, so these rows bound it. "
            f"Rows: {v.rows:,} train-split transactions of {v.cardholders:,} cardholders drawn uniformly over the "
            f"{v.banks} banks, each bank's L', T' made by its own `PrivateFeaturizer` (its secret, its keyed noise, "
            f"each cardholder's personal ε). ε policy: {v.policy}. The attacker knows the encoder and the "
            "federation's permutation (a colluding bank has it). Location candidates: every true place of the sample "
            f"({v.places:,}; the strongest attacker, the truth is always a candidate) or a {GRID_DEG:g}° grid over "
            "the data's bounding box (coarse 0.5° search, then 0.05° around it; a clean decode is off by the grid's "
            "quantization, ≤ 3.9 km). Time candidates: a 10-minute grid over the sample's span, then 1-minute steps "
            "around the best. Baseline: the population's modal 0.05° cell (its centre), modal hour (its middle) and "
            "median timestamp for every row. Intervals: 95% bootstrap over cardholders. "
            f"Decoding took {v.seconds:.0f} s.",
            "",
            *v.to_markdown_lines(),
        ]

    def _gradient_section(self) -> list[str]:
        g = self.gradient
        if g is None:
            return ["Not run (add `--gradient-inversion`, or `--gradient-inversion-only` for this section alone)."]
        return [
            "\"Inverting Gradients\" (Geiping et al. 2020) against the default anomaly model (next-event readout, "
            "topk pooling, 2 GCN layers, hidden 64): the attacker observes the gradient of **one** step of the bank's "
            "loss (the summed next-event NLL + the pooling's aux loss) on a batch of B train-split G_{t-1} and "
            "optimises dummy node features x′ with Adam so that their gradient matches it (mean over the observed "
            "tensors of 1 − cosine; the merchant table's rows are observed as the per-bucket sums of dL/dX). It "
            "knows the weights, each graph's edge_index, merchant buckets, history summary and T′ (edge_attr), and the "
            "next-event targets unless the row says otherwise (then it optimises soft targets too, as DLG does); "
            "dropout is off. This is generous: a bank sends the weight difference after a whole local run of Adam "
            "steps (FedProx), and one Adam step alone reveals ≈ −lr·sign(g), not g. Unknown: the node features L′. "
            f"Search: {g.steps} Adam steps (learning rate {LR['features']:g} for x′, {LR['places']:g}° for places, "
            f"÷10 at 3/8, 5/8, 7/8), {g.restarts} restart(s) from random "
            "true places (their encodings), the restart with the smallest final distance wins; priors: x′ free in "
            "R^d, or x′ = the encoder of optimised (lat′, lon′) (the attacker knows the encoder and the permutation). "
            f"Control row: the search started at the true L′ + N(0, {CONTROL_SIGMA:g}²) per coordinate (does the "
            "objective keep the truth?). Models: `fresh` = the round-1 weights a bank receives (seeded init), "
            f"`trained` = after {g.train_steps} Adam steps (lr 1e-3, 32 graphs) on other graphs of the same banks. "
            f"Decoding: section 4's nearest neighbour among {g.places:,} true places (section 4's sample plus the "
            f"attacked nodes' own: the truth is always a candidate). {g.graphs} graphs ({g.nodes} nodes) of "
            f"{g.banks} banks, one per cardholder, each at a random transaction of its history (so most have the "
            "maximum 32 nodes). Intervals: 95% bootstrap over graphs. "
            f"Took {g.seconds:.0f} s.",
            "",
            *g.to_markdown_lines(),
        ]

    def to_markdown(self) -> str:
        s = self.settings
        only = ("--gradient-inversion-only", "1–4") if self.gradient_only else (
            "--inversion-only", "1–3") if self.inversion_only else None
        flag = f" {only[0]}" if only else ""
        skipped = f" Sections {only[1]} not run (`{only[0]}`)." if only else ""
        head = [
            f"## Attacks on what leaves a bank (`fedfraud bench attacks{flag}`){self.label}",
            "",
            f"{machine_line()} Data: `{self.source}`, 5 banks (hash partition by cardholder). Load average at start / "
            f"end: {self.load[0]} / {self.load[1]}.{skipped}",
            "",
        ]
        inversion = ["### 4. What a perfect inversion of an update recovers: the LDP bound (the thesis's divergence "
                     "condition)", "", *self._inversion_section(), ""]
        gradient = ["### 5. An iterative gradient-inversion attack on the anomaly model's update", "",
                    *self._gradient_section(), ""]
        if self.gradient_only:
            return "\n".join([*head, *gradient])
        if self.inversion_only:
            return "\n".join([*head, *inversion])
        return "\n".join([
            *head,
            "### 1. Membership inference on cardholders (anomaly model, loss-threshold attack)",
            "",
            "The attacker holds a released global model and a cardholder's transactions (their first "
            f"{self.max_per_cardholder}) and scores \"member\" by the negated mean anomaly score (Yeom et al. "
            "2018). Members: train-split cardholders (60%); non-members: validation and test cardholders (40%); "
            "the split is by cardholder. Models: federated FedProx, aggregation "
            f"`{s.get('aggregation')}`, pooling `{s.get('pooling')}`, {s.get('rounds')} round × "
            f"{s.get('local-epochs')} local epochs × {s.get('samples-per-epoch')} transitions (at most "
            f"{s.get('max-train-pairs'):,} training transitions per bank); client-level DP clips each bank's update "
            f"to L2 ≤ {s.get('dp-clipping-norm')} at δ = {s.get('dp-delta'):g}. Intervals: 95% bootstrap over "
            "cardholders. The control row scores cardholders by a label-free baseline that never saw the split "
            "(mean `amount_surprise`), so any AUC above it is the model's.",
            "",
            *self._membership_table(),
            "",
            "### 2. What the server learns from the fraud model's histograms",
            "",
            self._histogram_intro(),
            "",
            *self._histogram_tables(),
            "",
            "### 3. Merchant membership from one bank's anomaly-model update",
            "",
            f"The merchant table has {self.merchant_buckets:,} rows keyed by the federation's key; a bank's update "
            "moves only the rows its training batches touched. The attacker (the server, or a bank colluding with "
            "it: banks hold the key) scores every (bank, bucket) pair by the L2 norm of that row's change in round 1 "
            "and guesses \"this bank's customers paid at a merchant of this bucket\". Truth: the keyed buckets of "
            "the bank's train-split transactions. Views: the bank's own reply as the server-side strategy received "
            "it (clipped under DP: the clip scales the whole update, it does not hide which rows moved); the mean of "
            "the replies, which is what SecAgg+ leaves the server (not a SecAgg+ run: `test_secagg.py` checks "
            "SecAgg+'s aggregate equals that mean within 1e-4), attributed to every bank; the released global model "
            "(the server's aggregate, noised under DP). Intervals: 95% bootstrap over buckets.",
            "",
            *self._merchant_table(),
            "",
            *inversion,
            *gradient,
            "### Time",
            "",
            *timing_lines(self.timings),
            "",
        ])


def run_attacks_bench(
    csv: Path | None,
    work: Path,
    epsilons: Sequence[float] = ATTACK_EPSILONS,
    overrides: dict[str, Any] | None = None,
    resamples: int = 500,
    data: Path | None = None,
    max_per_cardholder: int = 100,
    histograms: bool = True,
    label: str = "",
    config: Any = None,
    inversion: bool = True,
    inversion_only: bool = False,
    inversion_rows: int = INVERSION_ROWS,
    gradient_inversion: bool = False,
    gradient_inversion_only: bool = False,
    gradient_graphs: int = GRAPHS,
    gradient_search: tuple[int, int] = (STEPS, RESTARTS),
) -> AttacksBench:
    """Train (or reuse) one anomaly model per ε under ``work``, run the membership attack on each, then the
    histogram attack on the real fraud federation's messages, then the inversion bound (``inversion_only``: that
    alone, no model trained), then the gradient-inversion attack (``gradient_inversion``; ``gradient_inversion_only``:
    that alone). ``config``: the :class:`FedfraudConfig` whose privacy, encoder and fraud sections
    apply (default: the defaults).
    """
    from fedfraud.config import FedfraudConfig
    from fedfraud.training.anomaly.federated.task import RunSettings

    if not epsilons or any(not e > 0 for e in epsilons):
        raise ValueError(f"every ε must be > 0 (inf: DP off); got {list(epsilons)}")
    cfg = config if config is not None else FedfraudConfig()
    work = Path(work)
    data = Path(data) if data is not None else ingested(Path(str(csv)), work)
    base = {**RunSettings.defaults(), **DETECTION_SETTINGS, **ATTACK_SETTINGS, **(overrides or {})}
    bench = AttacksBench(source=str(csv or data), settings=dict(base), max_per_cardholder=max_per_cardholder,
                         label=label)
    start = loads_now()
    if gradient_inversion_only:
        bench.gradient_only = True
        _run_gradient_inversion(bench, data, cfg, gradient_graphs, gradient_search, resamples)
        bench.load = (start, loads_now())
        return bench
    if inversion_only:
        bench.inversion_only = True
        _run_inversion(bench, data, cfg, inversion_rows, resamples)
        bench.load = (start, loads_now())
        return bench
    models = trained_models(data, work, epsilons, base)
    for name, m in models.items():
        bench.timings[f"training, {name}"] = m.seconds
    t0 = time.perf_counter()
    per = cardholder_scores(data, {n: m.registry for n, m in models.items()}, cfg.privacy, max_per_cardholder)
    per = per.join(control_scores(data, max_per_cardholder))
    bench.timings["membership scoring"] = time.perf_counter() - t0
    named = {n: (m.epsilon, m.card) for n, m in models.items()}
    results = membership_inference(per, {**named, CONTROL: (math.nan, {})}, resamples)
    bench.membership = [r for r in results if r.setting != CONTROL]
    bench.control = next(r for r in results if r.setting == CONTROL)
    t0 = time.perf_counter()
    truth = bank_buckets(data, RunSettings.from_flat({**base, "data-dir": str(data)}))
    bench.merchants = merchant_membership(models, truth, min(resamples, 200))
    bench.merchant_buckets = int(base.get("encoder-merchant-buckets", 0))
    bench.timings["merchant attack"] = time.perf_counter() - t0
    if histograms:
        from fedfraud.training.fraud.dataset import bank_features
        from fedfraud.feature_store.layout import list_banks

        t0 = time.perf_counter()
        banks = {b: bank_features(data, b, cfg.fraud, cfg.encoder, cfg.privacy) for b in list_banks(data)}
        bench.timings["fraud features"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        bench.histograms = histogram_leak(banks, cfg.fraud.model_copy(update={"nthread": 1}), work / "hist")
        bench.timings["histogram federation and attack"] = time.perf_counter() - t0
    if inversion:
        _run_inversion(bench, data, cfg, inversion_rows, resamples)
    if gradient_inversion:
        _run_gradient_inversion(bench, data, cfg, gradient_graphs, gradient_search, resamples)
    bench.load = (start, loads_now())
    return bench


def _run_inversion(bench: AttacksBench, data: Path, cfg: Any, rows: int, resamples: int) -> None:
    """Section 4 on up to ``rows`` train-split transactions, timed into ``bench``."""
    from fedfraud.bench.inversion import inversion_bound, sample_train_rows

    t0 = time.perf_counter()
    bench.inversion = inversion_bound(sample_train_rows(data, rows), cfg.encoder, cfg.privacy, min(resamples, 200))
    bench.timings["inversion bound"] = time.perf_counter() - t0


def _run_gradient_inversion(
    bench: AttacksBench, data: Path, cfg: Any, graphs: int, search: tuple[int, int], resamples: int
) -> None:
    """Section 5 on ``graphs`` ego graphs with (steps, restarts) ``search``, timed into ``bench``."""
    from fedfraud.bench.gradient_inversion import run_gradient_inversion

    t0 = time.perf_counter()
    bench.gradient = run_gradient_inversion(data, cfg, graphs=graphs, steps=search[0], restarts=search[1],
                                            resamples=min(resamples, 200))
    bench.timings["gradient inversion"] = time.perf_counter() - t0


#: The membership attack's control: a label-free baseline's per-cardholder mean, which never saw the split.
CONTROL = "control: mean amount_surprise (no model)"


def control_scores(data: Path, max_per_cardholder: int) -> pd.DataFrame:
    """Per cardholder, the mean of the label-free ``amount_surprise`` over the same transactions as the attack."""
    from fedfraud.feature_store.layout import list_banks, read_bank
    from fedfraud.training.anomaly.baselines import causal_baselines

    parts = []
    for bank in list_banks(data):
        frame = read_bank(data, bank)
        frame = frame.groupby("cardholder_id", sort=False).head(max_per_cardholder).reset_index(drop=True)
        base = causal_baselines(frame)
        parts.append(pd.DataFrame({"cardholder_id": frame["cardholder_id"].astype(str),
                                   CONTROL: base["amount_surprise"].to_numpy(dtype=np.float64)})
                     .groupby("cardholder_id").mean())
    return pd.concat(parts)

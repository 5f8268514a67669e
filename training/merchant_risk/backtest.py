"""Backtest behind ``fedfraud eval backtest``: replay time, feed labels back late, release merchant risk daily.

Why a replay and not a cardholder split: the merchant statistics are about *when* a label comes back. A
transaction at ``t`` is labelled at ``t + D``; the model is trained at ``--train-until`` on the rows before it
whose labels had arrived by then, and the rest is replayed day by day with each day's transactions scored
from the release of the day before (:func:`fedfraud.training.merchant_risk.stats.daily_merchant_features`).

Variants, all scored on every transaction from ``--train-until`` on:

* ``local``: each bank alone (its own model on the project's fraud features);
* ``fl``: the federated model (histogram federation, :mod:`fedfraud.training.fraud.federated.hist`, what
  ``fedfraud train fraud --variant federated`` trains; without the anomaly score, which needs a published
  anomaly model) or, with ``trainer="central"``, the centralized fit on the union of the banks' training
  rows as its stand-in;
* ``fl+merchant-bank``: ``fl`` plus merchant statistics from the bank's own vector only;
* ``fl+merchant-fed``: ``fl+merchant-bank`` plus the federation's release (the sum over banks), as serving reads
  both;
* ``fl+merchant-fed ε=E`` (one per :class:`PrivateRelease`): ``fl+merchant-fed`` with every daily release, of the
  training period and of the replay, replaced by the private release
  (:func:`fedfraud.training.merchant_risk.release.private_release`: each bank's Skellam share, summed as SecAgg+
  sums), and the model retrained on it, so training and scoring see the same mechanism.

Metrics: PR-AUC and recall at 1 % FPR, pooled, per bank and per fraud scenario (genuine rows + that
scenario's frauds), each with a 95 % interval from the cardholder bootstrap of
:mod:`fedfraud.training.bootstrap`; differences are paired (same replicates).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from fedfraud.feature_store.config import EncoderConfig, PrivacyConfig
from fedfraud.feature_store.encoders import timestamps_us
from fedfraud.feature_store.privacy import PrivateFeaturizer
from fedfraud.training.data.config import IngestConfig
from fedfraud.training.bootstrap import (
    Interval,
    RankedScores,
    bootstrap_counts,
    interval,
    metric_draws,
    weighted_metrics,
)
from fedfraud.training.fraud.config import FraudConfig
from fedfraud.training.fraud.dataset import fraud_split
from fedfraud.training.fraud.features import FraudFeatures, build_features, fit_transitions
from fedfraud.training.fraud.model import FraudModel
from fedfraud.training.merchant_risk.config import MerchantNoiseConfig, MerchantRiskConfig
from fedfraud.training.merchant_risk.features import with_merchant_columns
from fedfraud.training.merchant_risk.release import ReleasePlan, plan_release, private_release
from fedfraud.training.merchant_risk.stats import (
    DAY_S,
    BankActivity,
    ReleaseHook,
    bank_feature_names,
    daily_merchant_features,
    release_feature_names,
)

__all__ = [
    "COMPARISONS",
    "VARIANTS",
    "BacktestData",
    "BacktestReport",
    "GroupResult",
    "PrivateRelease",
    "backtest_frames",
    "load_bank_frames",
    "prepare_backtest",
    "private_fed_columns",
    "run_backtest",
    "select_columns",
]

logger = logging.getLogger(__name__)

VARIANTS: tuple[str, ...] = ("local", "fl", "fl+merchant-bank", "fl+merchant-fed")
#: (name, a, b): the paired differences a − b the report prints.
COMPARISONS: tuple[tuple[str, str, str], ...] = (
    ("fl+merchant-fed − fl+merchant-bank", "fl+merchant-fed", "fl+merchant-bank"),
    ("fl+merchant-fed − fl", "fl+merchant-fed", "fl"),
    ("fl − local", "fl", "local"),
)
REPORTED: tuple[str, ...] = ("pr_auc", "recall_at_fpr")
TITLES = {"pr_auc": "PR-AUC", "recall_at_fpr": "recall@1%FPR"}
Trainer = Literal["hist", "central"]

#: Targets of issue 35 (S2: compromised terminals).
S2_RECALL_TARGET = 0.50
S2_GAIN_TARGET = 0.10
PR_AUC_GAIN_POINTS = 5.0
#: Target of issue 35, part 4: at ε = 1 per cardholder per release, S2 recall loses at most this against ε = ∞.
S2_PRIVATE_EPSILON = 1.0
S2_PRIVATE_LOSS = 0.05
CLEAR = "fl+merchant-fed"


def select_columns(data: FraudFeatures, names: tuple[str, ...]) -> FraudFeatures:
    """The same rows with only the ``names`` columns (in that order): one feature set of a variant."""
    idx = [data.names.index(n) for n in names]
    return FraudFeatures(data.X[:, idx], names, data.transaction_id, data.cardholder, data.label, data.split)


@dataclass(frozen=True)
class PrivateRelease:
    """One private row of the backtest: the daily release at ``epsilon`` per cardholder per release.

    Attributes:
        epsilon: per-cardholder ε of one daily release at ``delta``.
        delta: δ of that (ε, δ).
        plan: the banks' noise and field; its σ meets ``epsilon`` for one release when ``plan.survivors`` banks are
            summed (more banks summed: more noise).
        seed: the release of day ``r`` draws from ``default_rng([seed, round(ε·10⁶), r])``, so a day's noise is the
            same whatever the replay's range or the other rows.
    """

    epsilon: float
    delta: float
    plan: ReleasePlan
    seed: int = 0

    @classmethod
    def calibrated(cls, epsilon: float, risk: MerchantRiskConfig, banks: int,
                   noise: MerchantNoiseConfig | None = None, seed: int = 0) -> PrivateRelease:
        """The plan for ``banks`` banks whose σ (``noise_for_epsilon`` with one release) meets ``epsilon`` at
        ``noise``'s δ (default: the config's); the rest of ``noise`` (t, count cap) as given.
        """
        if not (epsilon > 0 and math.isfinite(epsilon)):
            raise ValueError(f"epsilon must be positive and finite (the clear row is ε = ∞), got {epsilon}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        base = (noise or MerchantNoiseConfig()).model_dump()
        cfg = MerchantNoiseConfig.model_validate({**base, "target_epsilon": epsilon, "period_days": 1})
        return cls(float(epsilon), cfg.delta, plan_release(risk, cfg, banks), seed)

    @property
    def variant(self) -> str:
        """The row's name, e.g. ``fl+merchant-fed ε=1``."""
        return f"{CLEAR} ε={self.epsilon:g}"

    def rng(self, release_day: int) -> np.random.Generator:
        """The generator of the release of ``release_day`` (UTC day index)."""
        return np.random.default_rng([self.seed, round(self.epsilon * 1_000_000), int(release_day)])

    def columns(self, risk: MerchantRiskConfig) -> tuple[str, ...]:
        """This row's ``fed`` column names, tagged with ε, so one feature table holds every release side by side."""
        tag = "merchant_fed_eps" + f"{self.epsilon:g}".replace("+", "") + "_"
        return tuple(n.replace("merchant_fed_", tag, 1) for n in release_feature_names(risk))

    def release(self, release_day: int, vectors: list[np.ndarray]) -> np.ndarray:
        """The private release of one day (a :data:`~.stats.Releaser`): bank ``i`` of the sorted banks draws the
        ``i``-th share of this day's generator.
        """
        return private_release(vectors, self.plan, self.rng(release_day))


def private_fed_columns(
    activity: Mapping[int, BankActivity],
    risk: MerchantRiskConfig,
    private: tuple[PrivateRelease, ...],
    progress: bool = False,
) -> dict[str, dict[int, np.ndarray]]:
    """Variant → bank → the ``fed`` columns of every row (the caller's order) with each daily release replaced by
    :func:`~.release.private_release` of the banks' release vectors; a transaction of day ``d`` reads releases up
    to ``d − 1``, exactly as :func:`~.stats.daily_merchant_features` (which it runs).
    """
    cols = daily_merchant_features(activity, risk, progress=progress,
                                   releasers={p.variant: p.release for p in private})
    return {p.variant: {b: c.private[p.variant] for b, c in cols.items()} for p in private}


@dataclass(frozen=True)
class BacktestData:
    """Every bank's rows of the replay, featurized once; ``fit`` marks the rows a model may train on.

    Attributes:
        base: the project's fraud features per bank (split ``train``/``valid`` before the cut, ``test`` after).
        activity: the per-bank inputs of the merchant statistics.
        fit: per bank, rows before the cut whose label had arrived by the cut.
        cut_s: ``train_until`` in UTC seconds.
    """

    base: dict[int, FraudFeatures]
    activity: dict[int, BankActivity]
    fit: dict[int, np.ndarray]
    cut_s: int
    rows: int = 0
    info: dict[str, object] = field(default_factory=dict)


def _utc_seconds(day: str | pd.Timestamp) -> int:
    ts = pd.Timestamp(day)
    ts = ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")
    return int(ts.value // 1_000_000_000)


def prepare_backtest(
    frames: Mapping[int, pd.DataFrame],
    train_until: str | pd.Timestamp,
    label_delay_days: int,
    fraud_cfg: FraudConfig,
    encoder_cfg: EncoderConfig,
    privacy_cfg: PrivacyConfig,
    buckets: int,
    until: str | pd.Timestamp | None = None,
    progress: bool = True,
) -> BacktestData:
    """Featurize every bank once: private features, the project's fraud features, the merchant-statistics inputs.

    Rows at or after ``until`` are dropped. Before ``train_until`` a row is ``valid`` (threshold) if its
    cardholder is in the project's validation hash split, else ``train``; a row may be fit only if its label
    had come back by ``train_until`` (``t + D <= train_until``); rows from ``train_until`` on are ``test``.
    """
    cut = _utc_seconds(train_until)
    stop = None if until is None else _utc_seconds(until)
    if stop is not None and stop <= cut:
        raise ValueError(f"until ({until}) must be after train_until ({train_until})")
    base: dict[int, FraudFeatures] = {}
    activity: dict[int, BankActivity] = {}
    fit: dict[int, np.ndarray] = {}
    for bank in tqdm(sorted(frames), desc="banks", disable=not progress):
        frame = frames[bank]
        ts_s = timestamps_us(frame["timestamp"]) // 1_000_000
        if stop is not None:
            frame, ts_s = frame.loc[ts_s < stop].reset_index(drop=True), ts_s[ts_s < stop]
        if "is_fraud" not in frame or frame["is_fraud"].isna().any():
            raise ValueError(f"bank {bank}: the backtest needs a label on every transaction (is_fraud)")
        featurizer = PrivateFeaturizer.for_bank(encoder_cfg, privacy_cfg, bank)
        before = ts_s < cut
        valid = fraud_split(frame["cardholder_id"], fraud_cfg.validation_fraction) == "valid"
        split = np.where(before, np.where(valid, "valid", "train"), "test").astype(object)
        private = featurizer.transform(frame)
        # the bank's category-transition table from its training rows only, as `train fraud` fits it
        transitions = (fit_transitions(frame, private.cardholder, split == "train")
                       if fraud_cfg.previous_transaction_features else None)
        base[bank] = build_features(frame, private, fraud_cfg, None, split, progress=progress, transitions=transitions)
        label = frame["is_fraud"].astype("float32").to_numpy(dtype=np.float32)
        activity[bank] = BankActivity.of(frame["cardholder_id"], featurizer.merchant_hash(frame["merchant_id"]),
                                         ts_s, label, buckets)
        fit[bank] = before & (ts_s + label_delay_days * DAY_S <= cut)
    rows = sum(len(b) for b in base.values())
    if not any((b.split == "test").any() for b in base.values()):
        raise ValueError(f"no transaction on or after train_until ({train_until}): nothing to replay")
    if not any(np.nansum(base[b].label[fit[b]]) > 0 for b in base):
        raise ValueError(f"no fraud labelled by train_until ({train_until}): nothing to train on")
    logger.info("backtest_prepared banks=%d rows=%d fit_rows=%d test_rows=%d", len(base), rows,
                sum(int(f.sum()) for f in fit.values()), sum(int((b.split == "test").sum()) for b in base.values()))
    return BacktestData(base, activity, fit, cut, rows)


def _train(data: BacktestData, features: Mapping[int, FraudFeatures], fraud_cfg: FraudConfig, trainer: Trainer,
           risk: MerchantRiskConfig, private: Mapping[str, tuple[str, ...]] | None = None,
           ) -> dict[str, dict[int, FraudModel]]:
    """Variant → bank → the model that scores that bank's rows; ``private``: private variant → its release columns
    (each trained as ``fl+merchant-fed`` on its own release, the other variants never see them).
    """
    from fedfraud.training.fraud.train import train_centralized, train_local

    order = sorted(features)
    cfg = fraud_cfg.model_copy(update={"nthread": 1})
    fit = {b: features[b].subset(data.fit[b]) for b in order}
    base_names = data.base[order[0]].names
    bank_names, fed_names = bank_feature_names(risk), release_feature_names(risk)
    private = private or {}
    noisy = tuple(n for cols in private.values() for n in cols)
    # fl+merchant-fed reads the federation's release beside the bank's own counts (what serving reads), so its
    # gain over fl+merchant-bank is what the federation adds; each private row swaps the clear release for its own
    drops = {"fl": (*bank_names, *fed_names, *noisy), "fl+merchant-bank": (*fed_names, *noisy),
             "fl+merchant-fed": noisy}
    drops.update({v: (*fed_names, *(n for n in noisy if n not in cols)) for v, cols in private.items()})
    models: dict[str, dict[int, FraudModel]] = {
        "local": {b: train_local(select_columns(fit[b], base_names), False, cfg, b) for b in order}}
    if trainer == "central":
        for variant, drop in drops.items():
            keep = tuple(n for n in fit[order[0]].names if n not in drop)
            model = train_centralized({b: select_columns(fit[b], keep) for b in order}, False, cfg)
            models[variant] = dict.fromkeys(order, model)
        return models
    from fedfraud.training.fraud.federated.hist import HistJob, federated_hist_train

    jobs = [HistJob(variant, None, cfg.seed, drop) for variant, drop in drops.items()]
    trained = federated_hist_train(fit, cfg, jobs, tls=cfg.federated_tls, timeout_s=cfg.federated_timeout_s)
    for variant in drops:
        models[variant] = dict.fromkeys(order, trained[variant])
    return models


@dataclass(frozen=True)
class GroupResult:
    """One slice of the test rows (pooled, a bank, a scenario): its size and every variant's intervals."""

    rows: int
    frauds: int
    cardholders: int
    metrics: dict[str, dict[str, Interval]]
    diffs: dict[str, dict[str, Interval]]


@dataclass(frozen=True)
class BacktestReport:
    """What ``fedfraud eval backtest`` prints: groups ``pooled``, ``bank <b>``, ``S<k>`` and the targets."""

    groups: dict[str, GroupResult]
    scores: pd.DataFrame
    releases: pd.DataFrame
    info: dict[str, object] = field(default_factory=dict)
    #: private variant → its noise and ε: ``epsilon``, ``delta``, ``sigma`` (t banks summed), ``sigma_all`` (every
    #: bank summed), ``epsilon_test`` (over the releases the replayed period reads), ``epsilon_all`` (every release).
    private: dict[str, dict[str, float]] = field(default_factory=dict)

    def targets(self) -> list[tuple[str, str, bool | None]]:
        """(target, measured, met) of issue 35; met is None where it could not be measured (no S2 frauds)."""
        out: list[tuple[str, str, bool | None]] = []
        s2 = self.groups.get("S2")
        if s2 is None or s2.frauds == 0:
            out.append(("S2 targets", "no S2 frauds in the test rows (give --scenarios)", None))
        else:
            r = s2.metrics["fl+merchant-fed"]["recall_at_fpr"]
            out.append((f"S2 recall@1%FPR of fl+merchant-fed >= {S2_RECALL_TARGET:.2f}", r.fmt(),
                        r.value >= S2_RECALL_TARGET))
            d = s2.diffs["fl+merchant-fed − fl+merchant-bank"]["recall_at_fpr"]
            out.append((f"S2 recall@1%FPR fl+merchant-fed − fl+merchant-bank >= +{S2_GAIN_TARGET:.2f}, "
                        "interval above 0", d.fmt(signed=True), d.value >= S2_GAIN_TARGET and d.low > 0))
        d = self.groups["pooled"].diffs["fl+merchant-fed − fl"]["pr_auc"]
        out.append((f"pooled PR-AUC fl+merchant-fed − fl >= +{PR_AUC_GAIN_POINTS:g} points, interval above 0",
                    f"{d.fmt(100, 2, True)} points", 100 * d.value >= PR_AUC_GAIN_POINTS and d.low > 0))
        for variant, noise in self.private.items():
            if noise["epsilon"] != S2_PRIVATE_EPSILON:
                continue
            name = (f"S2 recall@1%FPR {variant} − {CLEAR} (ε = ∞) >= −{S2_PRIVATE_LOSS:.2f} (ε over the replayed "
                    f"period {noise['epsilon_test']:.2f})")
            if s2 is None or s2.frauds == 0:
                out.append((name, "no S2 frauds in the test rows (give --scenarios)", None))
            else:
                d = s2.diffs[f"{variant} − {CLEAR}"]["recall_at_fpr"]
                out.append((name, d.fmt(signed=True), d.value >= -S2_PRIVATE_LOSS))
        return out

    def _private_lines(self) -> list[str]:
        """The private rows' table: noise, ε per release and composed, figures and paired loss against ε = ∞."""
        i, pooled, s2 = self.info, self.groups["pooled"], self.groups.get("S2")
        first = next(iter(self.private.values()))
        lines = [
            f"**Private release** (issue 35, part 4): σ calibrated with `noise_for_epsilon` for one release at "
            f"δ = {first['delta']:g} per cardholder (add/remove), guaranteed while at least t = {i.get('survivors')} "
            f"of the {i.get('banks')} banks are summed (every bank adds σ²/t, so with all of them the noise std is "
            f"σ·√({i.get('banks')}/{i.get('survivors')})); ε composed with `release_epsilon` over the "
            f"{i.get('test_releases')} daily releases the replayed period reads (and over all "
            f"{i.get('replay_releases')} releases of the run, training period included). Every row is retrained on "
            f"its own releases; noise seed {i.get('noise_seed')}.",
            "",
            "| row | σ | noise std, all banks | ε per release | ε over the replayed period | ε over the run "
            "| pooled PR-AUC | pooled recall@1%FPR | S2 recall@1%FPR | S2 recall − ε = ∞ (paired) "
            "| pooled PR-AUC − ε = ∞ (paired) |",
            "|---|" + "---:|" * 10,
        ]
        clear = dict.fromkeys(("sigma", "sigma_all"), 0.0) | dict.fromkeys(("epsilon", "epsilon_test", "epsilon_all"),
                                                                           math.inf)
        for variant, noise in [(CLEAR, clear), *self.private.items()]:
            diff = f"{variant} − {CLEAR}"
            cells = [pooled.metrics[variant][m].fmt() for m in REPORTED]
            cells.append(s2.metrics[variant]["recall_at_fpr"].fmt() if s2 is not None else "—")
            cells += [g.diffs[diff][m].fmt(signed=True) if g is not None and diff in g.diffs else "—"
                      for g, m in ((s2, "recall_at_fpr"), (pooled, "pr_auc"))]
            figures = [_num(noise[k]) for k in ("sigma", "sigma_all", "epsilon", "epsilon_test", "epsilon_all")]
            name = variant if noise is not clear else f"{variant} (ε = ∞, clear sum)"
            lines.append(f"| {name} | " + " | ".join([*figures, *cells]) + " |")
        return [*lines, ""]

    def to_markdown(self) -> str:
        """The report block (docs/fraud.md's merchant-risk section quotes it)."""
        i = self.info
        lines = [
            f"### Backtest: federated merchant risk, scored on the replayed period {i.get('replay', '?')}",
            "",
            f"Data: {i.get('data', '?')}; banks={i.get('banks', '?')}; train until {i.get('train_until')} "
            f"(fit rows {i.get('fit_rows')}, labels as they had arrived); replay {i.get('replay')}; "
            f"label delay D={i.get('label_delay_days')} days; merchant risk: {i.get('risk')}; "
            f"fl trained by: {i.get('trainer')}; bootstrap: {i.get('reps')} replicates over test cardholders; "
            f"wall {float(i.get('seconds', math.nan)):.0f} s; load average at start {i.get('load_start')}, "
            f"at end {i.get('load_end')}. " + (
                "DP and SecAgg are OFF: the release is the clear sum of the banks' vectors." if not self.private else
                f"DP and SecAgg are OFF for {CLEAR} (ε = ∞: the clear sum of the banks' vectors); each "
                f"`{CLEAR} ε=E` row replaces every daily release, training period included, by `private_release` "
                "(each bank's Skellam share, summed as SecAgg+ sums, in process)."),
            "",
        ]
        if i.get("skew"):
            lines += [f"Skewed banks (`--skew`): {i['skew']}", ""]
        if self.private:
            lines += self._private_lines()
        for name, g in self.groups.items():
            lines += [f"**{name}**: {g.rows} rows, {g.frauds} frauds, {g.cardholders} cardholders", "",
                      "| variant | " + " | ".join(TITLES[m] for m in REPORTED) + " |",
                      "|---|" + "---:|" * len(REPORTED)]
            for v, metrics in g.metrics.items():
                lines.append(f"| {v} | " + " | ".join(metrics[m].fmt() for m in REPORTED) + " |")
            for c, metrics in g.diffs.items():
                lines.append(f"| {c} (paired) | " + " | ".join(metrics[m].fmt(signed=True) for m in REPORTED) + " |")
            lines.append("")
        lines += ["**Targets** (issue 35; figures of the replayed period)", ""]
        for name, measured, met in self.targets():
            verdict = "not measured" if met is None else ("met" if met else "NOT met")
            lines.append(f"- {name}: {measured} → **{verdict}**")
        return "\n".join(lines) + "\n"


def _group(label: np.ndarray, holder: np.ndarray, scores: Mapping[str, tuple[np.ndarray, np.ndarray]],
           counts: np.ndarray, rows: np.ndarray, max_fpr: float,
           comparisons: tuple[tuple[str, str, str], ...] = COMPARISONS) -> GroupResult | None:
    """Intervals of every variant and comparison on the ``rows`` of the test set; None without a fraud."""
    y = label[rows]
    if not y.any() or y.all():
        return None
    ranked = {v: [RankedScores.of(y, s[rows], t[rows])] for v, (s, t) in scores.items()}
    draws = metric_draws(ranked, holder[rows], counts, max_fpr)
    points = {v: weighted_metrics(r[0], np.ones(y.size), max_fpr) for v, r in ranked.items()}
    metrics = {v: {m: interval([points[v][m]], draws[v][m]) for m in REPORTED} for v in ranked}
    diffs = {name: {m: interval([points[a][m] - points[b][m]], draws[a][m] - draws[b][m]) for m in REPORTED}
             for name, a, b in comparisons}
    return GroupResult(int(rows.sum()), int(y.sum()), int(np.unique(holder[rows]).size), metrics, diffs)


def _top_releases(top: int, risk: MerchantRiskConfig) -> tuple[list[pd.DataFrame], ReleaseHook]:
    """A release hook keeping, per day, the ``top`` buckets by the first released statistic (frauds by default) of
    the shortest release window: what an operator is shown (a bank maps a bucket back to its own merchants with the
    federation key; the server cannot).
    """
    kept: list[pd.DataFrame] = []
    columns = [f"{stat}_{w}d" for w in risk.release_window_days for stat in risk.released_stats]
    lead = risk.released_stats.index("frauds") if "frauds" in risk.released_stats else 0

    def hook(day: int, release: np.ndarray) -> None:
        frauds = release[lead]
        hit = np.flatnonzero(frauds)
        if not hit.size:
            return
        hit = hit[np.argsort(-frauds[hit], kind="stable")[:top]]
        frame = pd.DataFrame(release[:, hit].T, columns=columns)
        frame.insert(0, "bucket", hit)
        frame.insert(0, "release_day", pd.Timestamp(day * DAY_S, unit="s").date().isoformat())
        kept.append(frame)

    return kept, hook


def run_backtest(
    data: BacktestData,
    fraud_cfg: FraudConfig,
    risk: MerchantRiskConfig,
    scenarios: pd.Series | None = None,
    trainer: Trainer = "hist",
    reps: int | None = None,
    top_releases: int = 20,
    progress: bool = True,
    private: tuple[PrivateRelease, ...] = (),
) -> BacktestReport:
    """Release merchant risk daily, train the four variants (and one per private release) on the fit rows, score the
    replayed rows, bootstrap.

    Args:
        data: :func:`prepare_backtest` output (the cut and the label delay are in it).
        fraud_cfg: XGBoost and threshold settings (the project's defaults).
        risk: the merchant statistics' window, delay, bound and domain; its delay must be the data's.
        scenarios: ``transaction_id`` → scenario name (NaN for genuine), for per-scenario figures.
        trainer: ``hist`` (histogram federation) or ``central`` (the pooled stand-in).
        reps: bootstrap replicates (default ``fraud_cfg.bootstrap_reps``).
        top_releases: per release day, the buckets with the most frauds kept for the operator's view.
        progress: progress bars.
        private: one ``fl+merchant-fed ε=E`` row each, its releases private (distinct ε, plans for these banks).
    """
    started, load_start = time.perf_counter(), _load()
    reps = fraud_cfg.bootstrap_reps if reps is None else reps
    order = sorted(data.base)
    if len({p.variant for p in private}) != len(private):
        raise ValueError(f"private releases need distinct ε, got {[p.epsilon for p in private]}")
    kept, hook = _top_releases(top_releases, risk)
    cols = daily_merchant_features(data.activity, risk, on_release=hook, progress=progress,
                                   releasers={p.variant: p.release for p in private})
    features = {b: with_merchant_columns(data.base[b], cols[b], risk,
                                         [(p.columns(risk), cols[b].private[p.variant]) for p in private])
                 for b in order}
    models = _train(data, features, fraud_cfg, trainer, risk, {p.variant: p.columns(risk) for p in private})
    variants = (*VARIANTS, *(p.variant for p in private))
    comparisons = (*COMPARISONS, *((f"{p.variant} − {CLEAR}", p.variant, CLEAR) for p in private))

    tests = {b: features[b].of_split("test") for b in order}
    label = np.concatenate([tests[b].label for b in order]).astype(bool)
    bank_of_row = np.concatenate([np.full(len(tests[b]), b) for b in order])
    tx_ids = np.concatenate([tests[b].transaction_id for b in order]).astype(str)
    holder_codes, holders = pd.factorize(pd.Series(np.concatenate(
        [[f"{b}:{c}" for c in tests[b].cardholder] for b in order]), dtype=object))
    scores: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for variant in variants:
        s, t = [], []
        for b in order:
            model = models[variant][b]
            s.append(model.scores(select_columns(tests[b], model.input_names).X))
            t.append(np.full(len(tests[b]), model.threshold))
        scores[variant] = (np.concatenate(s), np.concatenate(t))
    score_frame = pd.concat([pd.DataFrame({"transaction_id": tx_ids, "variant": v, "fraud_score": s})
                             for v, (s, _) in scores.items()], ignore_index=True)

    counts = bootstrap_counts(len(holders), reps, fraud_cfg.seed)
    groups: dict[str, GroupResult] = {}
    slices: list[tuple[str, np.ndarray]] = [("pooled", np.ones(label.size, dtype=bool))]
    slices += [(f"bank {b}", bank_of_row == b) for b in order]
    if scenarios is not None:
        scen = pd.Series(tx_ids).map(scenarios).to_numpy(dtype=object)
        names = sorted({str(s) for s, y in zip(scen, label, strict=True) if y and isinstance(s, str)})
        slices += [(name, ~label | (scen == name)) for name in names]
    for name, rows in tqdm(slices, desc="bootstrap", disable=not progress):
        result = _group(label, holder_codes, scores, counts, rows, fraud_cfg.fpr_target, comparisons)
        if result is not None:
            groups[name] = result
    info: dict[str, object] = {
        **data.info, "banks": len(order), "fit_rows": sum(int(f.sum()) for f in data.fit.values()),
        "train_until": pd.Timestamp(data.cut_s, unit="s").date().isoformat(),
        "label_delay_days": risk.label_delay_days, "trainer": (
            "histogram federation (xgboost.federated, one process per bank)" if trainer == "hist"
            else "CENTRALIZED fit on the union of the banks' training rows, a stand-in for the federated model"),
        "risk": (f"bank: windows {'/'.join(map(str, risk.window_days))} d, CPP horizon {risk.cpp_days} d, "
                 f"k = {risk.max_merchants} merchants per cardholder per window; release: "
                 f"{'+'.join(risk.released_stats)} over {'/'.join(map(str, risk.release_window_days))} d, "
                 f"k_f = {risk.release_max_merchants}, features average the last {risk.release_average} releases; "
                 f"cap {risk.per_merchant_cap} per merchant, {risk.buckets} buckets "
                 f"(L1 / L2 sensitivity {risk.sensitivity_l1()} / {risk.sensitivity_l2():.3g})"),
        "reps": reps, "seconds": time.perf_counter() - started, "load_start": load_start, "load_end": _load(),
    }
    first = min(int(a.day[0]) for a in data.activity.values() if len(a))
    last = max(int(a.day[-1]) for a in data.activity.values() if len(a))
    # releases cut_day − 1 .. last − 1 feed the replayed rows; first − 1 .. last − 1 are made in all
    info.update({"test_releases": last - data.cut_s // DAY_S + 1, "replay_releases": last - first + 1})
    noise: dict[str, dict[str, float]] = {}
    for p in private:
        noise[p.variant] = {
            "epsilon": p.epsilon, "delta": p.delta, "sigma": p.plan.noise_std,
            "sigma_all": math.sqrt(p.plan.banks * p.plan.share_variance),
            "epsilon_test": p.plan.epsilon(int(info["test_releases"]), p.delta, risk),
            "epsilon_all": p.plan.epsilon(int(info["replay_releases"]), p.delta, risk)}
        info.update({"survivors": p.plan.survivors, "noise_seed": p.seed})
        logger.info("backtest_private_release variant=%r sigma=%.3f epsilon_test=%.3f test_releases=%s",
                    p.variant, p.plan.noise_std, noise[p.variant]["epsilon_test"], info["test_releases"])
    releases = pd.concat(kept, ignore_index=True) if kept else pd.DataFrame(columns=["release_day", "bucket"])
    report = BacktestReport(groups, score_frame, releases, info, noise)
    for name, measured, met in report.targets():
        logger.info("backtest_target name=%r measured=%r met=%s", name, measured, met)
    return report


def _num(x: float) -> str:
    return "∞" if math.isinf(x) else f"{x:.4g}"


def _load() -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def load_bank_frames(csv: Path, ingest_cfg: IngestConfig, stack: ExitStack,
                     info: dict[str, object] | None = None) -> dict[int, pd.DataFrame]:
    """Every bank's canonical rows of ``csv``, split into banks exactly as ``fedfraud ingest`` does.

    With ``ingest_cfg.skew`` the banks are thinned to their fraud rates; ``info`` (when given) gets ``skew``, the
    per-bank line of :func:`~fedfraud.training.data.skew.describe_skew` for the report.
    """
    from fedfraud.feature_store.layout import list_banks, read_bank
    from fedfraud.training.data.skew import describe_skew, skew_summary
    from fedfraud.training.fraud.dataset import materialize

    root = stack.enter_context(materialize(csv, ingest_cfg))
    if info is not None and ingest_cfg.skew is not None:
        info["skew"] = describe_skew(skew_summary(root))
    return {b: read_bank(root, b) for b in list_banks(root)}


def backtest_frames(
    frames: Mapping[int, pd.DataFrame],
    train_until: str,
    fraud_cfg: FraudConfig,
    encoder_cfg: EncoderConfig,
    privacy_cfg: PrivacyConfig,
    risk: MerchantRiskConfig,
    *,
    until: str | None = None,
    scenarios: pd.Series | None = None,
    trainer: Trainer = "hist",
    reps: int | None = None,
    progress: bool = True,
    private: tuple[PrivateRelease, ...] = (),
) -> BacktestReport:
    """:func:`prepare_backtest` then :func:`run_backtest`: the whole backtest of per-bank frames."""
    started = time.perf_counter()
    data = prepare_backtest(frames, train_until, risk.label_delay_days, fraud_cfg, encoder_cfg, privacy_cfg,
                            risk.buckets, until=until, progress=progress)
    data.info.update({"rows": data.rows, "replay": f"{train_until} .. {until or 'end of data'}"})
    report = run_backtest(data, fraud_cfg, risk, scenarios, trainer, reps, progress=progress, private=private)
    report.info["seconds"] = time.perf_counter() - started
    return report

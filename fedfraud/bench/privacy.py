"""Utility cost of client-level DP: the anomaly GNN's fraud detection on third-party data at ε ∈ {1, 3, 8, ∞}.

``fedfraud bench privacy --csv ../shared/data/sparkov_dev_1000cards_2022H1.csv.gz``
runs :func:`run_privacy_bench` and prints :meth:`PrivacyBench.to_markdown`
for ``docs/benchmarks.md``.

Protocol: the one of ``fedfraud bench anomaly`` (:mod:`fedfraud.bench.detection`,
whose ingest, training, scoring and counts are reused): the CSV in 5 banks,
cardholders split 60/15/25 by a keyed hash, the federated model trained on
train cardholders with the same budget for every ε, the round selected on
validation loss, every transaction of validation and test cardholders scored
through the published model, 95% bootstrap intervals over cardholders
(paired draws, so ``ε − ∞`` differences have honest intervals). Each finite
ε is a run with client-level DP whose noise multiplier the accountant
calibrated so that all rounds together spend that ε at the stated δ; ε = ∞
is the same run with DP off. The demo's default is chosen on validation
cardholders only (:meth:`PrivacyBench.choose_default`).

``--unit cardholder`` with ``--set anomaly.cardholder_dp.noise=distributed``
trains the finite-ε rows with DP-FedSGD and distributed Skellam noise
(:func:`fedfraud.training.anomaly.distributed_dp.run_distributed`, the
in-process replay of the SecAgg+ path's arithmetic); the ε = ∞ row stays the
project's federated training.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedfraud.bench.detection import (
    DETECTION_SETTINGS,
    bootstrap_splits,
    ingested,
    score_split,
    split_counts,
    train_run,
)
from fedfraud.bench.harness import (
    TrainedRunsBench, machine_line, paired_difference_rows, table, test_line, timing_lines,
)
from fedfraud.training.bootstrap import Interval, bootstrap_by_group
from fedfraud.feature_store.config import PrivacyConfig

__all__ = ["PRIVACY_EPSILONS", "PrivacyBench", "PrivacyRun", "rule_dp_keys", "run_privacy_bench"]

logger = logging.getLogger(__name__)

#: The ε of the table (∞: DP off).
PRIVACY_EPSILONS: tuple[float, ...] = (1.0, 3.0, 8.0, math.inf)


def _name(epsilon: float, features: str = "thesis", rule: str = "fedavg") -> str:
    name = "ε=∞ (DP off)" if math.isinf(epsilon) else f"ε={epsilon:g}"
    name = name if features == "thesis" else f"{name}, {features} features"
    return f"{name}, DSFL" if rule == "dsfl" else name


@dataclass(frozen=True)
class PrivacyRun:
    """One trained model: the ε asked for, what the accountant put in its card, and its training time."""

    epsilon: float
    card: dict[str, Any]
    wall_seconds: float
    registry: Path
    features: str = "thesis"
    unit: str = "bank"
    rule: str = "fedavg"

    @property
    def name(self) -> str:
        return _name(self.epsilon, self.features, self.rule)


@dataclass
class PrivacyBench(TrainedRunsBench[PrivacyRun]):
    """All runs of one invocation with their validation and test intervals and the chosen default."""

    def choose_default(self) -> tuple[float, str]:
        """The demo's default ε, from validation cardholders only: the smallest finite ε whose validation ROC-AUC
        interval lies above the best label-free baseline (the model still adds something a bank cannot get alone
        without sharing anything); if none does, ∞ (DP off), said plainly.
        """
        base = {k: v["roc_auc"] for k, v in self.val.items() if k.startswith("baseline:")}
        if not base:
            return math.inf, "no baseline on validation to compare with"
        best = max(base, key=lambda k: base[k].value)
        bar = base[best].value
        ladder = (r for r in self.runs if r.features == "thesis" and r.rule == "fedavg")
        for run in sorted(ladder, key=lambda r: r.epsilon):
            got = self.val.get(run.name, {}).get("roc_auc")
            if got is not None and math.isfinite(run.epsilon) and got.low > bar:
                return run.epsilon, (
                    f"the smallest ε whose validation ROC-AUC interval ({got}) lies above the best label-free "
                    f"baseline ({best.split(':', 1)[1]}, {bar:.3f})"
                )
        off = self.val.get(_name(math.inf), {}).get("roc_auc")
        why = (
            "The per-cardholder noise still costs more than the model adds over the baselines at this number of "
            "cardholders"
            if self.settings.get("unit") == "cardholder"
            else "With 5 banks, noise sized for one bank's whole update swamps the averaged update"
        )
        return math.inf, (
            f"no finite ε in the table keeps the validation ROC-AUC interval above the best label-free baseline "
            f"({best.split(':', 1)[1]}, {bar:.3f}); DP off reaches {off}. {why}, so the default stays DP off and "
            "every card says so"
        )

    def _table(self, table_: dict[str, dict[str, Interval]], with_runs: bool) -> list[str]:
        rows = [[run.name, *(self._noise(run.card) if with_runs else []), m["roc_auc"], m["pr_auc"]]
                for run in self.runs if (m := table_.get(run.name)) is not None]
        rows += [[name, *(["—"] * 3 if with_runs else []), m["roc_auc"], m["pr_auc"]]
                 for name, m in table_.items() if name.startswith("baseline:")]
        noise = ["noise multiplier z", "noise std per coordinate", "ε (card)"] if with_runs else []
        return (table(["model", *noise, "ROC-AUC [95% CI]", "PR-AUC [95% CI]"], rows, "lrrr" if with_runs else "")
                + paired_difference_rows(table_, "paired difference"))

    @staticmethod
    def _noise(c: dict[str, Any]) -> list[str]:
        """A run's noise multiplier, noise std per coordinate and ε from its DP card (— where DP is off)."""
        if c.get("dp") != "on":
            return ["—", "—", "∞"]
        if c.get("noise") == "dsfl":  # Laplace: std √2·b, selected / other coordinates; ε per bank
            lap = c["laplace_scale"]
            return ["Laplace", f"{math.sqrt(2) * lap['selected']:.4f} / {math.sqrt(2) * lap['other']:.4f}",
                    f"{c['epsilon_bank']:.3f} (per cardholder {c['epsilon']:.3f})"]
        # bank level: on the server's mean; cardholder level: on a (bank's or all banks') sum
        std = (c["noise_std_sum"] if "noise_std_sum" in c else c["noise_std"][0] if "noise_std" in c
               else c["noise_multiplier"] * c["clipping_norm"])
        return [f"{c['noise_multiplier']:.3f}", f"{std:.4f}", f"{c['epsilon']:.3f}"]

    def _calibrated(self) -> str:
        cal = self.settings.get("calibrated")
        if not cal:
            return " (not run)"
        return (
            f" (DP off on the updates; planar Laplace on the coordinates, ε_geo = {cal['geo_epsilon_per_km']:g} per "
            f"km per report, and randomized response on the hour, ε_hour = {cal['hour_epsilon']:g} per report)"
        )

    def _dp_sentence(self) -> str:
        s = self.settings
        per = ("per cardholder (any change to one bank's data: an L1 shift of 2·clip)"
               if s.get("unit") == "cardholder" else
               "per bank (against a zero update, the analogue of add/remove one bank)")
        dsfl = (
            "; DSFL rows (`aggregation: dsfl`, training/federated/dsfl.py): each bank clips its update to L1 ≤ "
            f"{s.get('dsfl-l1-clip')}, picks the top {s.get('dsfl-top-fraction'):g} of coordinates by the exponential "
            "mechanism and adds Laplace noise per coordinate (std selected / other in the noise column), its ε₁, ε₂, "
            f"ε₃ scaled by one factor so that all rounds spend ε {per} at the same δ; the server weights banks by "
            "contribution; the ε = ∞ DSFL row is the weighting without noise"
            if any(r.rule == "dsfl" for r in self.runs)
            else ""
        )
        if self.settings.get("unit") == "cardholder" and s.get("cardholder-dp-noise") == "distributed":
            steps = s.get("cardholder-dp-steps")
            return (
                f"DP: cardholder-level DP-FedSGD with distributed noise under SecAgg+ "
                f"(training/anomaly/distributed_dp.py): {steps} rounds of one private step each (the same count as "
                f"{s.get('rounds')} × {s.get('local-epochs')} local epochs × {s.get('batch-size')}-transition steps), "
                f"each bank Poisson-samples its training cardholders at q = {s.get('cardholder-dp-sampling-rate'):g}, "
                f"a sampled cardholder's {s.get('cardholder-dp-pairs-per-step')} transitions form one gradient clipped "
                f"to L2 ≤ {s.get('cardholder-dp-clipping-norm'):g} and rounded to integers, each bank adds a Skellam "
                "share of 1/t of the noise (t = 3 of 5, SecAgg+'s threshold) and the server decodes only the sum, "
                f"divides by q·N and steps Adam at lr {s.get('lr')}; merchant table frozen; z calibrated by the "
                f"Skellam-RDP accountant with Zhu–Wang Poisson amplification at δ = {s.get('cardholder-dp-delta'):g}; "
                "unit of privacy: one cardholder. The in-process replay of the SecAgg+ arithmetic trains these rows "
                "(the same sums as the Flower path, tests/unit/test_distributed_dp.py). The ε = ∞ row is the "
                "project's federated training (FedProx) at the same rounds × local epochs without DP. The noise "
                "column is the std of the summed noise per coordinate, in gradient units, before ÷ q·N" + dsfl
            )
        if self.settings.get("unit") == "cardholder":
            steps = s.get("cardholder-dp-steps")
            return (
                f"DP: cardholder-level DP-SGD inside every bank: each local step Poisson-samples the bank's training "
                f"cardholders at q = {s.get('cardholder-dp-sampling-rate'):g}, a sampled cardholder's "
                f"{s.get('cardholder-dp-pairs-per-step')} transitions form one gradient clipped to L2 ≤ "
                f"{s.get('cardholder-dp-clipping-norm'):g}, the bank adds N(0, (z·C)²) to the sum (merchant table "
                f"frozen, at most {s.get('cardholder-dp-pool-per-cardholder')} training transitions kept per "
                f"cardholder); z calibrated by the RDP accountant for ε per cardholder over all {steps} steps "
                f"({s.get('rounds')} rounds) at δ = {s.get('cardholder-dp-delta'):g}; unit of privacy: one "
                "cardholder. The ε = ∞ row is the same budget without DP (shared training pool, merchant table "
                "trained). The noise column is z·C on a bank's sum per step" + dsfl
            )
        return (
            f"DP: each bank clips its update to L2 ≤ {s.get('dp-clipping-norm')}, the server adds N(0, (z·C/5)²) to "
            f"every coordinate of the mean; z calibrated by the RDP accountant for ε over all {s.get('rounds')} "
            f"rounds at δ = {s.get('dp-delta'):g}; unit of privacy: one bank{dsfl}"
        )

    def to_markdown(self) -> str:
        s, c = self.settings, self.counts
        default, why = self.choose_default()
        unit = "cardholder-level" if s.get("unit") == "cardholder" else "client-level"
        test = (
            ["### Test cardholders", "", *self._table(self.test, with_runs=True), ""]
            if self.test
            else ["### Test cardholders", "", "Not scored (`--validation-only`).", ""]
        )
        return "\n".join(
            [
                f"## Utility of {unit} DP (`fedfraud bench privacy`){self.label}",
                "",
                f"{machine_line()} Data: `{self.source}`, 5 banks, cardholders split 60/15/25 (train/validation/test) "
                f"as in `fedfraud bench anomaly`. {test_line(c)} Federated (FedProx with the server's mean, pinned "
                f"whatever the default rule: the noise below is the mean's; all 5 banks every round), readout "
                f"`{s.get('readout')}`, pooling `{s.get('pooling')}`, {s.get('rounds')} rounds × "
                f"{s.get('local-epochs')} local epochs × {s.get('samples-per-epoch')} transitions, batch "
                f"{s.get('batch-size')}, lr {s.get('lr')}; round selected on validation loss. {self._dp_sentence()}. "
                f"Features: the thesis mechanism (pinned), except the `calibrated features` row{self._calibrated()}. "
                "Intervals: 95% bootstrap over cardholders, paired resamples.",
                "",
                *test,
                "### Validation cardholders (where the default is chosen)",
                "",
                *self._table(self.val, with_runs=not self.test),
                "",
                "### Training time",
                "",
                *timing_lines({r.name: r.wall_seconds for r in self.runs}),
                "",
                f"**Demo default: {_name(default)}**: {why}.",
                "",
            ]
        )


def _privacy_keys(cfg: PrivacyConfig) -> dict[str, Any]:
    """The ``privacy-*`` run keys of a feature-privacy config."""
    return {f"privacy-{k.replace('_', '-')}": v for k, v in cfg.model_dump().items()}


def run_privacy_bench(
    csv: Path | None,
    work: Path,
    epsilons: Sequence[float] = PRIVACY_EPSILONS,
    overrides: dict[str, Any] | None = None,
    resamples: int = 500,
    data: Path | None = None,
    label: str = "",
    calibrated: PrivacyConfig | None = None,
    unit: str = "bank",
    validation_only: bool = False,
    dsfl: bool = True,
) -> PrivacyBench:
    """Train one federated model per ε (∞: DP off) under ``work``, plus, with ``calibrated``, one with DP off and
    the calibrated feature mechanism; score validation and (unless ``validation_only``: a tuning run, not a look
    at test) test cardholders. ``unit``: ``bank`` (client-level DP on the updates) or ``cardholder`` (DP-SGD inside
    every bank, :mod:`fedfraud.training.anomaly.dpsgd`). ``dsfl``: a DSFL row per ε as well, its Laplace budgets
    calibrated to the same ε in the same unit.
    """
    from fedfraud.config import FedfraudConfig
    from fedfraud.training.anomaly.federated.task import RunSettings, total_dp_steps
    from fedfraud.training.registry import ModelRegistry

    if not epsilons or any(not e > 0 for e in epsilons):
        raise ValueError(f"every ε must be > 0 (inf: DP off); got {list(epsilons)}")
    if unit not in ("bank", "cardholder"):
        raise ValueError(f"unknown unit of privacy {unit!r}; valid: bank, cardholder")
    work = Path(work)
    data = Path(data) if data is not None else ingested(Path(str(csv)), work)
    # the ε ladder is measured on the mean (the noise z·C/n the report states) and the thesis's features, whatever
    # the defaults; the calibrated row changes only the features
    pinned = {"aggregation": "fedavg", "privacy-mechanism": "thesis"}
    base = {**RunSettings.defaults(), **DETECTION_SETTINGS, **pinned, **(overrides or {})}
    # DSFL's rows at the Gaussian rows' δ
    base["dsfl-delta"] = base["cardholder-dp-delta" if unit == "cardholder" else "dp-delta"]
    bench = PrivacyBench(source=str(csv or data), settings={**base, "unit": unit}, label=label)
    if unit == "cardholder":
        bench.settings["cardholder-dp-steps"] = total_dp_steps(RunSettings.from_flat(base))
    registries: dict[str, Path] = {}
    features: dict[str, PrivacyConfig] = {}
    plan: list[tuple[float, str, dict[str, Any]]] = [
        (eps, "thesis", _dp_keys(unit, eps)) for eps in sorted(set(epsilons))
    ]
    if dsfl:
        plan += [(eps, "thesis", rule_dp_keys("dsfl", eps, unit)) for eps in sorted(set(epsilons))]
    if calibrated is not None:
        bench.settings["calibrated"] = calibrated.model_dump()
        plan.append((math.inf, "calibrated", {"dp-enabled": False, **_privacy_keys(calibrated)}))
    for eps, mechanism, extra in plan:
        rule = str(extra.get("aggregation", base["aggregation"]))
        name = ("inf" if math.isinf(eps) else f"eps{eps:g}") + ("" if mechanism == "thesis" else f"-{mechanism}")
        name += "-dsfl" if rule == "dsfl" else ""
        name += "-cardholder" if unit == "cardholder" and not math.isinf(eps) else ""
        distributed = (unit == "cardholder" and not math.isinf(eps) and rule != "dsfl"
                       and base.get("cardholder-dp-noise") == "distributed")
        if distributed:
            name += "-distributed"
            registry, seconds = _train_distributed(data, work, {**base, **extra}, name)
        else:
            registry, seconds = train_run(data, work, "federated", {**base, **extra}, name=name)
        card = dict(ModelRegistry(registry).get("anomaly", "latest").privacy.get("client_dp", {}))
        run = PrivacyRun(float(eps), card, seconds, registry, mechanism, unit, rule)
        bench.runs.append(run)
        registries[run.name] = registry
        if mechanism == "calibrated" and calibrated is not None:
            features[run.name] = calibrated
        logger.info("privacy_bench run=%s card_epsilon=%s wall=%.1f", run.name, card.get("epsilon"), seconds)
    t0 = time.perf_counter()
    ladder = FedfraudConfig().privacy.model_copy(update={"mechanism": str(base["privacy-mechanism"])})
    splits = ("val",) if validation_only else ("val", "test")
    rows, _ = score_split(data, registries, ladder, splits, privacy_by_model=features)
    logger.info("privacy_bench scored rows=%d seconds=%.1f", len(rows), time.perf_counter() - t0)
    detectors = [*registries, *[c for c in rows.columns if c.startswith("baseline:")]]
    off = _name(math.inf)
    pairs = tuple((r.name, off) for r in bench.runs if off in registries and r.name != off)
    if validation_only:
        part = rows[rows["split"] == "val"]
        bench.val = bootstrap_by_group(
            part["is_fraud"].astype(bool).to_numpy(),
            {d: part[d].to_numpy(dtype=float) for d in detectors},
            part["cardholder_id"].astype(str).to_numpy(),
            resamples=resamples,
            pairs=pairs,
        )
        bench.counts = split_counts(part, detectors, prefix="val")
    else:
        bench.test, bench.val, bench.counts = bootstrap_splits(rows, detectors, resamples, pairs)
    return bench


def _train_distributed(data: Path, work: Path, flat: dict[str, Any], name: str) -> tuple[Path, float]:
    """One DP-FedSGD run with distributed noise (:func:`~fedfraud.training.anomaly.distributed_dp.run_distributed`),
    published into ``work/registry-<name>`` like :func:`~fedfraud.bench.detection.train_run` does.
    """
    from fedfraud.training.anomaly.distributed_dp import run_distributed
    from fedfraud.training.anomaly.federated.task import RunSettings

    out = work / f"registry-{name}"
    settings = RunSettings.from_flat(
        {**flat, "data-dir": str(data), "out-dir": str(out), "publish": True, "cache-dir": str(work / "cache")}
    )
    start = time.perf_counter()
    run_distributed(settings)
    return out, time.perf_counter() - start


def rule_dp_keys(rule: str, epsilon: float, unit: str = "bank") -> dict[str, Any]:
    """The run keys of an aggregation rule at ``epsilon`` in ``unit`` (∞: no noise). DSFL carries its own noise:
    its Laplace budgets are calibrated to ε per bank against a zero update (the analogue of the Gaussian rows'
    add/remove one bank) or per cardholder (any change to one bank's data, beside the cardholder-level DP-SGD
    rows), and at ∞ it is the contribution weighting alone; the other rules take ``federated.dp``.
    """
    if rule != "dsfl":
        return {**_dp_keys("bank", epsilon), "aggregation": rule}
    noise = {"dsfl-noise": False} if math.isinf(epsilon) else {"dsfl-noise": True, "dsfl-target-unit": unit,
                                                                "dsfl-target-epsilon": float(epsilon)}
    return {"dp-enabled": False, "cardholder-dp-enabled": False, "aggregation": "dsfl", **noise}


def _dp_keys(unit: str, epsilon: float) -> dict[str, Any]:
    """The run keys of one row: DP off at ε = ∞, else DP of ``unit`` calibrated to ``epsilon``."""
    if math.isinf(epsilon):
        return {"dp-enabled": False, "cardholder-dp-enabled": False}
    if unit == "cardholder":
        return {"dp-enabled": False, "cardholder-dp-enabled": True, "cardholder-dp-target-epsilon": float(epsilon)}
    return {"dp-enabled": True, "dp-target-epsilon": float(epsilon), "cardholder-dp-enabled": False}

"""One malicious bank against the anomaly federation: fraud ROC-AUC per aggregation rule, with and without attacks.

``fedfraud bench adversary --csv ../shared/data/sparkov_dev_1000cards_2022H1.csv.gz``
runs :func:`run_adversary_bench` and prints :meth:`AdversaryBench.to_markdown`
for ``docs/benchmarks.md``.

Protocol: the one of ``fedfraud bench privacy`` (ingest, training, scoring
and counts of :mod:`fedfraud.bench.detection`): the CSV in 5 banks,
cardholders split 60/15/25 by a keyed hash, one federated model per
(aggregation rule, attack, ε) trained on train cardholders with the same
budget, round selected on validation loss, every transaction of validation
and test cardholders scored through the published model, 95% bootstrap
intervals over cardholders (paired draws, so "attack − none" differences have
honest intervals). Bank 0 is the malicious one in every round (the hash
partition gives it about a fifth of the cardholders). The default rule is chosen on validation cardholders only
(:meth:`AdversaryBench.choose_default`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedfraud.bench.detection import DETECTION_SETTINGS, bootstrap_splits, ingested, score_split, train_run
from fedfraud.bench.harness import (
    TrainedRunsBench, loads_now, machine_line, paired_difference_rows, table, test_line, timing_lines,
)
from fedfraud.training.bootstrap import Interval
from fedfraud.bench.privacy import rule_dp_keys

__all__ = [
    "ADVERSARY_ATTACKS",
    "ADVERSARY_SETTINGS",
    "AdversaryBench",
    "AdversaryRun",
    "SecAggCost",
    "run_adversary_bench",
    "run_secagg_cost",
]

logger = logging.getLogger(__name__)

#: The attacks of the table: none, the scaled and sign-flipped update, training on shuffled targets.
ADVERSARY_ATTACKS: tuple[str, ...] = ("", "scale:-10", "flip-targets")
#: A budget small enough for 2 shared cores (the privacy bench's small run: 3 rounds × 2 local epochs).
ADVERSARY_SETTINGS: dict[str, Any] = {"rounds": 3, "local-epochs": 2}


def _attack_name(attack: str) -> str:
    return attack or "none"


def _dp_name(epsilon: float) -> str:
    return "DP off" if math.isinf(epsilon) else f"DP ε={epsilon:g}"


@dataclass(frozen=True)
class AdversaryRun:
    """One trained model: its aggregation rule, attack and ε, its DP card and training time."""

    aggregation: str
    attack: str
    epsilon: float
    card: dict[str, Any]
    wall_seconds: float
    registry: Path

    @property
    def name(self) -> str:
        return f"{self.aggregation}, {_attack_name(self.attack)}, {_dp_name(self.epsilon)}"


@dataclass
class AdversaryBench(TrainedRunsBench[AdversaryRun]):
    """All runs of one invocation with their validation and test intervals."""

    def choose_default(self) -> tuple[str, str]:
        """The default rule from validation cardholders only: the highest worst case over the attacks measured
        (DP off): max over rules of min over attacks of the validation ROC-AUC.
        """
        worst: dict[str, float] = {}
        for run in self.runs:
            if not math.isinf(run.epsilon) or run.name not in self.val:
                continue
            auc = self.val[run.name]["roc_auc"].value
            worst[run.aggregation] = min(worst.get(run.aggregation, math.inf), auc)
        if not worst:
            return "fedavg", "no DP-off run on validation"
        best = max(worst, key=lambda k: worst[k])
        listing = ", ".join(f"{k} {v:.3f}" for k, v in sorted(worst.items(), key=lambda kv: -kv[1]))
        return best, f"highest worst-case validation ROC-AUC over the attacks (DP off): {listing}"

    def _grid(self, table_: dict[str, dict[str, Interval]], epsilon: float) -> list[str]:
        runs = [r for r in self.runs if r.epsilon == epsilon]
        attacks = list(dict.fromkeys(r.attack for r in runs))
        by = {(r.aggregation, r.attack): table_.get(r.name) for r in runs}
        return table(["rule", *(f"{_attack_name(a)}: ROC-AUC [95% CI]" for a in attacks)],
                     ([rule, *((m := by.get((rule, a))) and m["roc_auc"] for a in attacks)]
                      for rule in dict.fromkeys(r.aggregation for r in runs)))

    def _blocks(self, table_: dict[str, dict[str, Interval]], with_details: bool) -> list[str]:
        out: list[str] = []
        for eps in sorted({r.epsilon for r in self.runs}, key=lambda e: (not math.isinf(e), e)):
            out += [f"**{_dp_name(eps)}** (fraud ROC-AUC of the anomaly score):", "", *self._grid(table_, eps), ""]
        base = [(n, m["roc_auc"]) for n, m in table_.items() if n.startswith("baseline:")]
        out += ["Label-free baselines (no training, no federation):", "",
                *table(["baseline", "ROC-AUC [95% CI]"], base), ""]
        if with_details:
            prs = [(r.name, table_[r.name]["pr_auc"]) for r in self.runs if r.name in table_]
            prs += [(n, m["pr_auc"]) for n, m in table_.items() if n.startswith("baseline:")]
            out += [*table(["model (rule, attack, DP)", "PR-AUC [95% CI]"], prs),
                    *paired_difference_rows(table_, "paired difference (attack − none)"), ""]
        return out

    def _dp_line(self) -> str:
        on = [r for r in self.runs if not math.isinf(r.epsilon) and r.card.get("dp") == "on"
              and r.card.get("noise") != "dsfl"]
        dsfl = (" DSFL: no federated.dp; each bank clips its update to L1, adds Laplace noise per coordinate "
                "(exponential-mechanism selection of the top coordinates) calibrated to the same ε per bank, and the "
                "server weights banks by contribution; DP off = the weighting without noise."
                if any(r.aggregation == "dsfl" for r in self.runs) else "")
        if not on:
            finite = any(not math.isinf(r.epsilon) for r in self.runs)
            return ("DP: only DSFL's own noise." if finite and dsfl else "DP: off in every run.") + dsfl
        parts = [
            f"{r.aggregation}: z = {r.card['noise_multiplier']:.3f}, sensitivity ×{r.card['sensitivity_factor'][0]:.1f}"
            f", noise std {r.card['noise_std'][0]:.4f}"
            for r in {r.aggregation: r for r in on}.values()
        ]
        return (
            f"DP: each bank clips its update to L2 ≤ {self.settings.get('dp-clipping-norm')} (the scaling attacker "
            "skips the clip, the flip-targets bank does not), the server adds Gaussian noise scaled to the rule's "
            "sensitivity; z from the RDP accountant for ε over all rounds at δ = "
            f"{self.settings.get('dp-delta'):g} ({'; '.join(parts)}).{dsfl}"
        )

    def to_markdown(self) -> str:
        s = self.settings
        default, why = self.choose_default()
        return "\n".join(
            [
                f"## One malicious bank (`fedfraud bench adversary`){self.label}",
                "",
                f"{machine_line()} Data: `{self.source}`, 5 banks, cardholders split 60/15/25 (train/validation/test) "
                f"as in `fedfraud bench anomaly`. {test_line(self.counts)} FedProx clients "
                f"(μ = {s.get('proximal-mu')}), all 5 "
                f"banks every round, readout `{s.get('readout')}`, pooling `{s.get('pooling')}`, {s.get('rounds')} "
                f"rounds × {s.get('local-epochs')} local epochs × {s.get('samples-per-epoch')} transitions, batch "
                f"{s.get('batch-size')}; round selected on validation loss. Malicious bank: bank "
                f"{s.get('attack-bank')} in every round; `scale:F` sends received + F·update and skips the "
                "clipping mod; `flip-targets` trains on shuffled next-event targets (each history taught another "
                f"cardholder's next event). Rules: fedtrimmedavg β = {s.get('trim-beta')} (one bank cut at each "
                f"end), krum/multikrum f = {s.get('byzantine-banks')} (multikrum averages n − f = 4). "
                f"{self._dp_line()} Intervals: 95% bootstrap over cardholders, paired resamples.",
                "",
                "### Test cardholders",
                "",
                *self._blocks(self.test, with_details=True),
                "### Validation cardholders (where the default is chosen)",
                "",
                *self._blocks(self.val, with_details=False),
                "### Training time",
                "",
                *timing_lines({r.name: r.wall_seconds for r in self.runs}),
                "",
                f"**Default rule: {default}**: {why}.",
                "",
            ]
        )


def run_adversary_bench(
    csv: Path | None,
    work: Path,
    aggregations: Sequence[str],
    attacks: Sequence[str] = ADVERSARY_ATTACKS,
    epsilons: Sequence[float] = (math.inf,),
    overrides: dict[str, Any] | None = None,
    resamples: int = 500,
    data: Path | None = None,
    label: str = "",
    reuse: bool = False,
    pairs_only: Sequence[tuple[str, str]] = (),
) -> AdversaryBench:
    """Train one federated model per (rule, attack, ε) under ``work`` (∞: DP off); score validation and test
    cardholders; "attack − none" paired differences per rule and ε. ``pairs_only``: these (rule, attack) cells
    instead of the whole product (a budget cut; the table shows the others as —). ``reuse``: take a model an
    earlier invocation published under ``work`` with exactly these settings instead of training it again.
    """
    from fedfraud.config import FedfraudConfig
    from fedfraud.training.anomaly.federated.task import RunSettings
    from fedfraud.training.registry import ModelRegistry

    if not aggregations or not attacks or not epsilons or any(not e > 0 for e in epsilons):
        raise ValueError("need at least one rule, one attack and one ε > 0 (inf: DP off)")
    work = Path(work)
    data = Path(data) if data is not None else ingested(Path(str(csv)), work)
    base = {**RunSettings.defaults(), **DETECTION_SETTINGS, **ADVERSARY_SETTINGS, **(overrides or {})}
    base["dsfl-delta"] = base["dp-delta"]  # DSFL's rows at the Gaussian rows' δ
    bench = AdversaryBench(source=str(csv or data), settings=dict(base), label=label)
    registries: dict[str, Path] = {}
    grid = list(pairs_only) if pairs_only else [(rule, attack) for rule in aggregations for attack in attacks]
    for eps in epsilons:
        for rule, attack in grid:
            tag = f"{rule}-{(attack or 'none').replace(':', '')}-{'inf' if math.isinf(eps) else f'eps{eps:g}'}"
            flat = {**base, **rule_dp_keys(rule, eps), "attack-mode": attack}
            registry, seconds = (reused(data, work, flat, tag) if reuse else None) or train_run(
                data, work, "federated", flat, name=tag
            )
            card = dict(ModelRegistry(registry).get("anomaly", "latest").privacy.get("client_dp", {}))
            run = AdversaryRun(rule, attack, float(eps), card, seconds, registry)
            bench.runs.append(run)
            registries[run.name] = registry
            logger.info("adversary_bench run=%s wall=%.1f", run.name, seconds)
    t0 = time.perf_counter()
    rows, _ = score_split(data, registries, FedfraudConfig().privacy, ("val", "test"))
    logger.info("adversary_bench scored rows=%d seconds=%.1f", len(rows), time.perf_counter() - t0)
    detectors = [*registries, *[c for c in rows.columns if c.startswith("baseline:")]]
    clean = {(r.aggregation, r.epsilon): r.name for r in bench.runs if not r.attack}
    pairs = tuple(
        (r.name, clean[(r.aggregation, r.epsilon)]) for r in bench.runs if r.attack and (r.aggregation, r.epsilon)
        in clean
    )
    bench.test, bench.val, bench.counts = bootstrap_splits(rows, detectors, resamples, pairs)
    return bench


def reused(data: Path, work: Path, flat: dict[str, Any], tag: str) -> tuple[Path, float] | None:
    """(registry, training seconds) of the model an earlier run published at ``work/registry-<tag>`` if its
    recorded settings equal these (every section, the data dir), else None.
    """
    import json

    from fedfraud.training.anomaly.federated.task import RunSettings
    from fedfraud.training.registry import ModelRegistry

    registry = work / f"registry-{tag}"
    result = registry / "checkpoints" / "anomaly-federated" / "result.json"
    if not result.exists():
        return None
    try:
        version = ModelRegistry(registry).get("anomaly", "latest")
    except Exception:  # noqa: BLE001 - no or unreadable model: train again
        return None
    wanted = RunSettings.from_flat({**flat, "data-dir": str(data)}).config_dump()
    have = {k: v for k, v in version.config.items() if k in wanted}
    if json.loads(json.dumps(have, default=str)) != json.loads(json.dumps(wanted, default=str)):
        return None
    logger.info("adversary_bench reuse=%s", registry)
    return registry, float(json.loads(result.read_text(encoding="utf-8"))["wall_seconds"])


@dataclass
class SecAggCost:
    """Wall seconds per round of the same federation with and without SecAgg+ (legacy path both times)."""

    source: str
    settings: dict[str, Any]
    banks: int
    plain: list[float]
    secure: list[float]
    max_difference: float
    load: tuple[str, str] = ("", "")

    def to_markdown(self) -> str:
        s = self.settings

        def row(name: str, xs: list[float]) -> tuple[str, str, str]:
            return name, ", ".join(f"{x:.1f}" for x in xs), f"{sum(xs) / len(xs):.1f}"

        ratio = (sum(self.secure) / len(self.secure)) / (sum(self.plain) / len(self.plain))
        return "\n".join(
            [
                "## SecAgg+ for the anomaly model: cost per round (`fedfraud bench secagg`)",
                "",
                f"{machine_line()} Data: `{self.source}`, {self.banks} banks, all in every round; the model of the "
                "adversary bench "
                f"(pooling `{s.get('pooling')}`, {s.get('encoder-merchant-buckets'):,} merchant buckets), "
                f"{s.get('local-epochs')} local epoch × {s.get('samples-per-epoch')} transitions per round. Both runs "
                "on Flower's legacy path (SecAgg+ exists only there in flwr 1.41), same seeds; a round is timed "
                "from configure_fit to the end of aggregate_fit. Load average at start / end: "
                f"{self.load[0]} / {self.load[1]}.",
                "",
                *table(["path", "wall s per round", "mean"], [row("plain (server sees each bank's model)", self.plain),
                                                              row("SecAgg+ (server sees only the sum)", self.secure)],
                       "llr"),
                "",
                f"SecAgg+ / plain: ×{ratio:.2f}. Largest difference between the two final global models: "
                f"{self.max_difference:.2e} (SecAgg+'s quantization; the same local training otherwise).",
                "",
            ]
        )


def run_secagg_cost(
    csv: Path | None, work: Path, rounds: int = 2, overrides: dict[str, Any] | None = None, data: Path | None = None
) -> SecAggCost:
    """Time ``rounds`` rounds of the federation with and without SecAgg+ on the ingested data under ``work``."""
    import numpy as np

    from fedfraud.training.federated.secagg import run_secagg
    from fedfraud.training.anomaly.federated.task import RunSettings

    work = Path(work)
    data = Path(data) if data is not None else ingested(Path(str(csv)), work)
    flat = {
        **RunSettings.defaults(), **DETECTION_SETTINGS, **ADVERSARY_SETTINGS, "local-epochs": 1, **(overrides or {}),
        "rounds": rounds, "data-dir": str(data), "out-dir": str(work / "secagg"), "cache-dir": str(work / "cache"),
        "publish": False,
    }
    settings = RunSettings.from_flat(flat)
    start = loads_now()
    plain = run_secagg(settings, secagg=False)
    secure = run_secagg(settings, secagg=True)
    end = loads_now()
    diff = max(float(np.abs(a - b).max()) for a, b in zip(plain.final, secure.final, strict=True))
    return SecAggCost(str(csv or data), flat, plain.banks, plain.seconds_per_round, secure.seconds_per_round, diff,
                      (start, end))

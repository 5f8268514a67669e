"""The main job end to end on embedded defaults: what ``make demo`` / ``fedfraud demo`` runs.

Each stage is a small function that calls the product's public APIs and
returns a :class:`StageResult`; :func:`run_demo` runs them in order, keeps
their numbers and writes ``summary.json`` plus an HTML report with plots.
Nothing here implements product logic: if a stage needs a helper, the
helper belongs in the product package.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedfraud.config import FedfraudConfig

__all__ = ["DemoArgs", "DemoReport", "LiveConsole", "StageResult", "console_commands", "open_live_console",
           "run_demo"]

log = logging.getLogger(__name__)

#: the port the demo's console asks for first (``fedfraud console``'s default too)
CONSOLE_PORT = 8600


@dataclass(frozen=True)
class DemoArgs:
    """Sizes of the demo run; defaults keep the whole job under 10 minutes on 2 cores."""

    out: Path
    cardholders: int = 800
    days: int = 30
    banks: int = 5
    seed: int = 7
    holdout_days: float = 7.0
    rounds: int = 8
    stream_rate: float = 250.0
    retrain_cron: str = "* * * * *"  # the demo's schedule: the next minute (production: retrain.schedule)
    label_delay_days: float = 1.0
    policy_min_frauds: int = 5
    #: serve the analyst's console on the stream stage's broker while the stream runs (:func:`open_live_console`)
    console: bool = True
    #: its port on 127.0.0.1; taken (or 0): a free one
    console_port: int = CONSOLE_PORT
    #: keep the console and the embedded broker up after the demo until Ctrl-C (``fedfraud demo --hold-console``)
    hold_console: bool = False

    def __post_init__(self) -> None:
        if self.cardholders < 10 or self.days < 3 or self.banks < 2:
            raise ValueError("demo needs at least 10 cardholders, 3 days and 2 banks")
        if not 0 < self.holdout_days < self.days:
            raise ValueError("--holdout-days must be positive and shorter than --days")
        if not 0 <= self.console_port <= 65535:
            raise ValueError("--console-port must be between 0 and 65535")
        if self.hold_console and not self.console:
            raise ValueError("--hold-console needs the console (drop --no-console)")


@dataclass
class StageResult:
    """What one stage did: its wall time and the figures worth showing."""

    name: str
    seconds: float
    summary: dict[str, Any]
    plots: dict[str, Any] = field(default_factory=dict)


@dataclass
class DemoReport:
    """All stage results plus where the artifacts went."""

    out: Path
    stages: list[StageResult] = field(default_factory=list)
    #: the machine's 1-minute load average before and after each stage, by stage name
    load_avg_1m: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: how to open the analyst's console on the demo's models (:func:`console_commands`)
    console: list[str] = field(default_factory=list)
    #: the console still serving the demo's broker after the run (``hold_console``); the caller holds and closes it
    live: LiveConsole | None = None

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.stages)

    def to_json(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
            "seconds": round(self.seconds, 2),
            "cpus": os.cpu_count(),
            "load_avg_1m": {k: [round(a, 2), round(b, 2)] for k, (a, b) in self.load_avg_1m.items()},
            "stages": [{"name": s.name, "seconds": round(s.seconds, 2), **s.summary} for s in self.stages],
        }

    def extra(self) -> dict[str, Any]:
        """The stages' raw arrays the summary does not keep (:func:`fedfraud.report.render_report`'s ``extra``)."""
        out: dict[str, Any] = {}
        for s in self.stages:
            out.update(s.plots)
        return out


# ---------------------------------------------------------------------------- stages


def _stage_generate(cfg: FedfraudConfig, args: DemoArgs, ctx: dict[str, Any]) -> StageResult:
    from fedfraud.config import update_section
    from fedfraud.training.data.synthetic import generate_dataset

    cfg = update_section(
        cfg, "generate", banks=args.banks, cardholders=args.cardholders, days=args.days, seed=args.seed
    )
    out = args.out / "data"
    report = generate_dataset(out, cfg.generate, raw_csv=True, progress=False, banks_layout=cfg.banks)
    ctx["data"] = out
    ctx["raw_csv"] = report.raw_csv
    return StageResult(
        "generate",
        report.seconds,
        {
            "transactions": report.transactions,
            "fraud": report.fraud,
            "banks": len(report.per_bank),
            "scenarios": report.scenarios,
        },
        plots={"scenarios": report.scenarios, "per_bank": report.per_bank},
    )


def _stage_ingest(cfg: FedfraudConfig, args: DemoArgs, ctx: dict[str, Any]) -> StageResult:
    """Re-ingest the raw Sparkov CSV with a few corrupt lines appended, to show rejects keep reasons."""
    import shutil

    from fedfraud.config import update_section
    from fedfraud.training.data.ingest import ingest_csv

    raw: Path = ctx["raw_csv"]
    dirty = args.out / "raw_with_bad_rows.csv"
    shutil.copyfile(raw, dirty)
    header = raw.open(encoding="utf-8").readline().rstrip("\n").split("|")
    good = dict(zip(header, raw.open(encoding="utf-8").readlines()[1].rstrip("\n").split("|"), strict=False))
    bad_rows = []
    for field_name, value in (("amt", "-12.50"), ("merch_lat", "123.4"), ("trans_date", "not-a-date"), ("amt", "nan")):
        row = dict(good)
        row[field_name] = value
        row["trans_num"] = f"bad-{field_name}-{len(bad_rows)}"
        bad_rows.append(row)
    bad_rows.append(dict(good))  # duplicate transaction id
    with dirty.open("a", encoding="utf-8") as fh:
        for row in bad_rows:
            fh.write("|".join(row.get(h, "") for h in header) + "\n")
    t0 = time.perf_counter()
    ingest_cfg = update_section(cfg, "ingest", banks=args.banks).ingest
    report = ingest_csv(dirty, args.out / "ingested", ingest_cfg, progress=False)
    return StageResult(
        "ingest",
        time.perf_counter() - t0,
        {
            "accepted": report.accepted,
            "rejected": report.rejected,
            "rejects_by_reason": report.rejects_by_reason,
            "rows_per_s": round(report.rows_per_s),
        },
    )


def _stage_features(cfg: FedfraudConfig, args: DemoArgs, ctx: dict[str, Any]) -> StageResult:
    """Each bank computes its private features with its own secret; report the thesis's μ-GDP heuristic."""
    from fedfraud.feature_store.privacy import PrivateFeaturizer, mu_gdp
    from fedfraud.feature_store.layout import list_banks, read_bank

    t0 = time.perf_counter()
    per_bank: dict[str, Any] = {}
    vectors = 0
    for bank in list_banks(ctx["data"]):
        frame = read_bank(ctx["data"], bank)
        featurizer = PrivateFeaturizer.for_bank(cfg.encoder, cfg.privacy, bank)
        feats = featurizer.transform(frame)
        vectors += 2 * len(feats)
        eps = featurizer.epsilon(frame["cardholder_id"].drop_duplicates())
        # the thesis's shuffle figure, not a guarantee (its premises do not hold here; docs: issue 15)
        per_bank[f"bank_{bank}"] = {"rows": len(feats),
                                    "mu_gdp_heuristic": round(mu_gdp(eps, cfg.privacy.delta), 4)}
    seconds = time.perf_counter() - t0
    return StageResult(
        "private features", seconds, {"vectors": vectors, "vectors_per_s": round(vectors / seconds), "banks": per_bank}
    )


def _stage_holdout(cfg: FedfraudConfig, args: DemoArgs, ctx: dict[str, Any]) -> StageResult:
    """Cut every bank in time: models and the feature store see the history, the stream replays the tail."""
    from fedfraud.training.data.holdout import time_holdout

    t0 = time.perf_counter()
    split = time_holdout(ctx["data"], args.out / "history", args.holdout_days)
    ctx["split"] = split
    live = split.live[cfg.serving.bank_id]
    return StageResult(
        "hold out",
        time.perf_counter() - t0,
        {
            "cutoff": split.cutoff.isoformat(),
            "live_bank": cfg.serving.bank_id,
            "live_transactions": len(live),
            "live_fraud": int(live["is_fraud"].fillna(False).sum()),
        },
    )


def _stage_train_anomaly(cfg: FedfraudConfig, args: DemoArgs, ctx: dict[str, Any]) -> StageResult:
    """Federated anomaly GNN: one Flower SuperNode per bank on Ray, FedProx, published to the registry."""
    from fedfraud.config import update_section
    from fedfraud.training.anomaly.federated.task import RunSettings
    from fedfraud.training.anomaly.federated.trainer import run_federated

    from fedfraud.bench.detection import evaluate_published

    cfg = update_section(cfg, "federated", rounds=args.rounds)
    settings = RunSettings.from_config(cfg, ctx["split"].history, ctx["registry"])
    result = run_federated(settings)
    _make_champion(ctx["registry"], "anomaly", str(result.version))
    # label-free score against the labels of held-out test cardholders, with label-free baselines beside it
    quality = evaluate_published(ctx["split"].history, ctx["registry"], cfg.privacy, labels_from=ctx["data"])
    summary: dict[str, Any] = {
        "model": result.version,
        "rounds": result.rounds,
        "banks": result.banks,
        "readout": cfg.anomaly.readout,
        "pooling": cfg.anomaly.pooling,
        "fraud_roc_auc_95ci": str(quality["roc_auc"]),
        "fraud_pr_auc_95ci": str(quality["pr_auc"]),
        "test_frauds": quality["frauds"],
        "baselines_roc_auc": {k: round(v.value, 3) for k, v in quality["baselines"].items()},
        "score_cpu_ms_per_tx": round(quality["score_ms_per_tx"], 3),
        "seconds_per_round": [round(x, 1) for x in result.seconds_per_round],
    }
    if "per_scenario" in quality:
        summary["roc_auc_by_scenario"] = {k: round(v["roc_auc"], 3) for k, v in quality["per_scenario"].items()}
    return StageResult(
        "train anomaly",
        result.wall_seconds,
        summary,
        plots={"seconds_per_round": list(result.seconds_per_round)},
    )


def _stage_train_fraud(cfg: FedfraudConfig, args: DemoArgs, ctx: dict[str, Any]) -> StageResult:
    """Histogram-federated XGBoost fraud model with the anomaly score as a feature; FL vs Local for the live bank."""
    from fedfraud.training.fraud.pipeline import train_and_publish

    t0 = time.perf_counter()
    version, metrics = train_and_publish(cfg, ctx["split"].history, ctx["registry"], bank=cfg.serving.bank_id,
                                         labels_root=ctx["data"])
    _make_champion(ctx["registry"], "fraud", version.tag)
    return StageResult(
        "train fraud",
        time.perf_counter() - t0,
        {"model": version.tag, **{k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()
                                   if isinstance(v, float | int) and not isinstance(v, bool)}},
    )


def _make_champion(registry: Path, kind: str, tag: str) -> None:
    """The model this demo run just trained serves: promoted, with a reason, so that a champion left in the
    folder by an earlier run (or pinned by its retrain cycle) is not served instead; that run's retrain records
    and challenger are cleared too (a cycle on the same data would otherwise return its recorded result).
    """
    import shutil

    from fedfraud.training.registry import ModelRef, ModelRegistry

    reg = ModelRegistry(registry)
    # an earlier run's cycles are done for this same data: the demo's scheduled cycle must run again
    shutil.rmtree(Path(registry) / "retrain", ignore_errors=True)
    reg.promote(kind, ModelRef.parse(tag).version, actor="demo", reason="trained by this demo run")
    if reg.aliases(kind).get("challenger") is not None:
        reg.set_alias(kind, "challenger", None, actor="demo", reason="an earlier run's challenger; a new run starts")


def _fresh_serving_state(cfg: FedfraudConfig) -> None:
    """Drop serving's own state of an earlier demo in this folder (score and decision rings, counters).

    The online store was just rebuilt from the history; rings of a previous
    run would make the same live transactions look like redeliveries.
    """
    location = cfg.serving.fraud_state_path
    if location.startswith(("redis://", "rediss://")):
        return  # a shared production store is never wiped by the demo
    path = Path(location)
    path = path if path.is_absolute() else Path(cfg.features.repo_dir) / path
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _stage_feature_store(cfg: FedfraudConfig, args: DemoArgs, ctx: dict[str, Any]) -> StageResult:
    """Offline features of the serving bank's history → ``feast apply`` → materialize the online store."""
    from fedfraud.feature_store.feast_store import apply_repo, materialize_repo, open_store
    from fedfraud.feature_store.offline import write_offline
    from fedfraud.serving.warm import warm_fraud_state

    t0 = time.perf_counter()
    store = open_store(cfg.features)
    report = write_offline(
        ctx["split"].history,
        Path(store.repo_path),
        cfg.encoder,
        cfg.privacy,
        cfg.egograph,
        cfg.features.location_cell_deg,
        banks=[cfg.serving.bank_id],
        progress=False,
    )
    objects = apply_repo(store)
    materialize_repo(store)
    _fresh_serving_state(cfg)
    warmed = warm_fraud_state(cfg, ctx["split"].history)
    return StageResult(
        "feature store",
        time.perf_counter() - t0,
        {
            "profile": cfg.features.profile,
            "feast_objects": len(objects),
            "rows": report.rows,
            "cardholders": report.cardholders,
            "fraud_states_warmed": warmed,
        },
    )


def _stage_merchant_risk(cfg: FedfraudConfig, args: DemoArgs, ctx: dict[str, Any]) -> StageResult:
    """The daily merchant-risk job on the history's last day: every bank's private release summed, each bank's
    ``merchant_risk`` rows in the online store (the fraud model's merchant columns), the merchants it flags.
    """
    import json

    from fedfraud.feature_store.online import OnlineStateClient
    from fedfraud.training.merchant_risk.publish import publish_release

    t0 = time.perf_counter()
    client = OnlineStateClient.open(cfg.features, cfg.egograph)
    # the banks' noise comes from a fresh secret seed, kept for this run only: the heterogeneous-banks stage writes
    # the same release (same noise) to its bank's store, so the demo makes one release per day, not two
    ctx["merchant_risk_seed"] = secrets.randbits(128)
    done = publish_release(cfg, ctx["split"].history, client, rng=np.random.default_rng(ctx["merchant_risk_seed"]),
                           top=5, progress=False)
    manifest = json.loads((Path(ctx["data"]) / "manifest.json").read_text(encoding="utf-8"))
    breached = set(manifest.get("generator", {}).get("breached_merchants", []))
    flagged = done.flagged.drop_duplicates("merchant_id")
    card = done.card
    return StageResult(
        "merchant risk",
        time.perf_counter() - t0,
        {
            "release_day": done.date,
            "rows_per_bank": done.rows,
            "guarantee": (f"per cardholder (ε, δ) = ({card['epsilon_per_release']}, {card['delta']}) per daily "
                          f"release, ε = {card['epsilon_period']} over {card['period_days']} releases "
                          "(Skellam noise in each bank, SecAgg+ sum)"),
            "flagged_merchants": [f"bank {r.bank}: {r.merchant_id} ({r.fed_frauds:.1f} frauds, averaged)"
                                  for r in flagged.head(5).itertuples()],
            # what a flag is worth: the noise std of one averaged value (all banks summed), against its frauds
            "noise_std_of_averaged_value": round(
                float(card["noise_std"]) * (args.banks / float(card["min_banks_summed"])) ** 0.5
                / cfg.merchant_risk.release_average ** 0.5, 2),
            "breached_by_generator": sorted(breached),
            "breached_flagged": sorted(breached & set(flagged["merchant_id"])),
        },
    )


def _stage_heterogeneous(cfg: FedfraudConfig, args: DemoArgs, ctx: dict[str, Any]) -> StageResult:
    """Banks that hold different columns (``banks.<k>.private_features``): FED-SPFD trained over all of them, and
    one bank holding demographics serving its live tail with its own model through the replica's hot path.

    The hot path runs in this process (the class a Ray Serve replica runs, on its own Feast repository with the
    bank's ``cardholder_demographics`` view), not through Kafka: the stream stage serves the champion.
    """
    from contextlib import ExitStack

    from fedfraud.config import update_section
    from fedfraud.feature_store.feast_store import apply_repo, materialize_repo, open_store
    from fedfraud.feature_store.offline import write_offline
    from fedfraud.serving.config import ScorerConfig
    from fedfraud.serving.hotpath import HotPath
    from fedfraud.serving.warm import warm_fraud_state
    from fedfraud.training.fraud.metrics import classification_metrics
    from fedfraud.training.fraud.pipeline import load_fraud_banks
    from fedfraud.training.fraud.spfd.publish import train_and_publish_spfd
    from fedfraud.training.registry import ModelRef, ModelRegistry

    t0 = time.perf_counter()
    layout = cfg.banks.layout(sorted(ctx["split"].live))
    schemas = sorted({tuple(v) for v in layout.values()})
    holders = [b for b, sets in layout.items() if "demographics" in sets] or [b for b, v in layout.items() if v]
    if not holders:
        return StageResult("heterogeneous banks", time.perf_counter() - t0,
                           {"skipped": "every bank holds the shared columns only (banks.<k>.private_features)"})
    bank = holders[0]
    spfd = cfg.fraud.spfd.model_copy(update={"engine": "loopback"})  # the Flower apps in this process: no 2nd Ray
    cfg = update_section(cfg, "fraud", variant="fed-spfd", spfd=spfd)
    with ExitStack() as stack:
        banks, info = load_fraud_banks(cfg, ctx["split"].history, ctx["registry"], "latest", stack,
                                       require_labels=True)
        version, metrics = train_and_publish_spfd(cfg, banks, info, ctx["registry"], bank)
    ModelRegistry(ctx["registry"]).promote("fraud-spfd", ModelRef.parse(version.tag).version, actor="demo",
                                           reason="trained by this demo run")
    trained = time.perf_counter() - t0
    cfg = update_section(cfg, "features", repo_dir=str(args.out / f"feature_repo_bank{bank}"))
    cfg = update_section(cfg, "serving", bank_id=bank, registry_root=str(ctx["registry"]))
    store = open_store(cfg.features)
    write_offline(ctx["split"].history, Path(store.repo_path), cfg.encoder, cfg.privacy, cfg.egograph,
                  cfg.features.location_cell_deg, banks=[bank], progress=False)
    apply_repo(store)
    materialize_repo(store)
    _fresh_serving_state(cfg)
    warm_fraud_state(cfg, ctx["split"].history, bank)
    if cfg.fraud.merchant_risk_features and "merchant_risk_seed" in ctx:  # the model reads the merchant columns
        from fedfraud.feature_store.online import OnlineStateClient
        from fedfraud.training.merchant_risk.publish import publish_release

        publish_release(cfg, ctx["split"].history, OnlineStateClient.open(cfg.features, cfg.egograph),
                        rng=np.random.default_rng(ctx["merchant_risk_seed"]), top=0, progress=False)
    live = ctx["split"].live[bank]
    hot = HotPath(ScorerConfig.of(cfg), None, "fedfraud.serving.anomaly_stage:load_anomaly_scorer")
    records: list[dict[str, Any]] = []
    cpu0 = time.process_time()
    try:
        for lo in range(0, len(live), 64):
            rows = live.iloc[lo: lo + 64].reset_index(drop=True)
            records += hot.score(rows, np.arange(lo + 1, lo + len(rows) + 1, dtype=np.int64))
        served_by = hot.models()["fraud"]
    finally:
        hot.close()
    cpu_ms = (time.process_time() - cpu0) * 1e3 / max(1, len(records))
    label = live["is_fraud"].fillna(False).to_numpy(dtype=bool)
    scores = np.array([r["score"] for r in records], dtype=np.float64)
    m = classification_metrics(label, scores, float(metrics["threshold"]), cfg.fraud.fpr_target)
    return StageResult(
        "heterogeneous banks",
        time.perf_counter() - t0,
        {
            "schemas": {f"bank {b}": "+".join(v) or "shared only" for b, v in layout.items()},
            "distinct_schemas": len(schemas),
            "model": version.tag,
            "trained_s": round(trained, 1),
            "test_pr_auc_all_banks": round(float(metrics["test_pr_auc"]), 4),
            f"test_pr_auc_bank{bank}": round(float(metrics[f"bank{bank}_pr_auc"]), 4),
            "served_bank": bank,
            "served_by": served_by,
            "served": len(records),
            "live_frauds": int(label.sum()),
            "flagged": int(sum(r["decision"] == "fraud" for r in records)),
            "served_pr_auc": round(m.pr_auc, 4) if label.any() else None,
            "served_cpu_ms_per_tx": round(cpu_ms, 3),
        },
    )


def _stage_stream(cfg: FedfraudConfig, args: DemoArgs, ctx: dict[str, Any]) -> StageResult:
    """The live tail through the whole loop: the champion serves the first half while labels come back a day
    late; the scheduled retrain makes a challenger; it shadows the second half; the policy decides.
    """
    import ray

    from fedfraud.config import update_section
    from fedfraud.feature_store.outcomes import OUTCOMES_FILE, OutcomeStore
    from fedfraud.serving.labels import LabelJoiner
    from fedfraud.serving.replay import LabelFeed
    from fedfraud.serving.runtime import start
    from fedfraud.training.data.holdout import write_records
    from fedfraud.feature_store.layout import bank_dir
    from fedfraud.training.retrain.policy import decide_promotion
    from fedfraud.training.retrain.schedule import RetrainScheduler

    bank = cfg.serving.bank_id
    live = ctx["split"].live[bank]
    mid = live["timestamp"].iloc[0] + (live["timestamp"].iloc[-1] - live["timestamp"].iloc[0]) / 2
    first, second = live[live["timestamp"] <= mid], live[live["timestamp"] > mid]
    records = args.out / "offline"  # each bank's system of record; the serving bank's live labels come back late
    write_records(ctx["split"].history, records, ctx["split"].live, until=mid, unlabelled={bank})
    outcomes = bank_dir(records, bank) / OUTCOMES_FILE
    outcomes.unlink(missing_ok=True)
    cfg = update_section(cfg, "retrain", schedule=args.retrain_cron, rounds=args.rounds)
    feed = LabelFeed(cfg.serving.topics.labels, args.label_delay_days * 86_400.0, flush=False)
    poison = [(None, b"{not json"), (None, b'{"transaction_id": "poison-1", "amount": -5}')]
    t0 = time.perf_counter()
    runtime = start(cfg, apply_features=False, replay_source=True)
    started = time.perf_counter() - t0
    store = OutcomeStore(outcomes)
    joiner = LabelJoiner(runtime.bootstrap_servers, store, cfg.serving.topics, cfg.serving.producer,
                         security=cfg.serving.kafka_security)
    stop = threading.Event()
    joining = threading.Thread(target=joiner.run, args=(stop,), name="label-joiner", daemon=True)
    joining.start()
    scheduler = RetrainScheduler(cfg, records, ctx["registry"], outcomes, policy=False)
    live_console = None
    if args.console:  # before the first transaction, so that the queue fills while the stream runs
        live_console = open_live_console(cfg, runtime.bootstrap_servers, args.out, args.console_port,
                                         progress=ctx.get("progress"))
        if live_console is not None:
            ctx["console_url"] = live_console.url
    loop: dict[str, Any] = {}
    try:
        # 1. the champion serves; labels flow back a (replayed) day late
        def split() -> dict[str, dict[str, float]]:  # the replica's pickup split since the last call
            return next(iter(runtime.handle.latency_split.remote(reset=True).result().values()), {})

        split()
        part_a = runtime.replay(first, rate=args.stream_rate, timeout_s=300.0, extra=poison, labels=feed)
        loop["split_a"] = split()
        loop["drift_after_champion"] = _drift(runtime.url, runtime.headers)
        # 2. the cron schedule starts a federated retrain cycle (a child process); it registers the challenger
        scheduler.start()
        loop["cron"] = args.retrain_cron
        loop["cycle_starts_at"] = str(scheduler.next_run())
        if not scheduler.wait_for_cycles(1, timeout_s=900):
            raise RuntimeError("the scheduled retrain cycle did not finish within 15 minutes")
        scheduler.shutdown()  # one scheduled cycle is the demo's; production keeps the scheduler running
        loop["cycle"] = scheduler.events[-1].detail
        if "error" in loop["cycle"]:
            raise RuntimeError(f"the scheduled retrain cycle failed: {loop['cycle']['error']}")
        challenger = loop["cycle"]["fraud"]
        _wait_for(lambda: f'challenger="{challenger}"' in _metrics(runtime.url, runtime.headers), 60,
                  "serving to shadow the challenger")
        # 3. the challenger shadows the second half; its labels all come back
        split()
        part_b = runtime.replay(second, rate=args.stream_rate, timeout_s=300.0,
                                labels=LabelFeed(feed.topic, feed.delay_s, flush=True))
        counters = runtime.wait_idle()
        loop["split_b"] = split()
        expected = int(live["is_fraud"].notna().sum()) - _not_yet_due(first, feed.delay_s)
        _wait_for(lambda: store.count("labels") >= expected, 120, "the labels to be joined")
        loop["shadow_scored"] = _metric_value(_metrics(runtime.url, runtime.headers), "fedfraud_shadow_scored_total")
        loop["drift_after_loop"] = _drift(runtime.url, runtime.headers)
        # 4. the promotion policy on the labelled transactions both models scored
        decision = decide_promotion(ctx["registry"], outcomes, update_section(
            cfg, "retrain", min_frauds=args.policy_min_frauds).retrain, actor="demo")
        loop["policy"] = {"action": decision.action, "reason": decision.reason,
                          "evidence": _policy_evidence(decision.evidence)}
        loop["drift_psi_threshold"] = cfg.retrain.drift_psi_threshold
        if decision.action == "promote":
            champion = decision.challenger
            _wait_for(lambda: f'tag="{champion}"' in _metrics(runtime.url, runtime.headers), 60,
                      "the promoted model to serve")
    finally:
        stop.set()
        joining.join(timeout=30)
        joiner.close()
        scheduler.shutdown(wait=False)
        if live_console is not None:
            if args.hold_console:  # the broker outlives the scorer: run_demo's caller stops both on Ctrl-C
                live_console.broker, runtime.broker = runtime.broker, None
                ctx["live_console"] = live_console
            else:
                live_console.close()  # before its broker stops, so that its readers close cleanly
        runtime.stop()
        ray.shutdown()
    loop["labels_joined"] = store.count("labels")
    loop["labels_duplicate"] = store.counters().get("duplicate_labels", 0)
    store.close()
    decisions = part_a.decisions + part_b.decisions
    first_seen: dict[str, dict[str, Any]] = {}
    for d in decisions:
        first_seen.setdefault(d["transaction_id"], d)
    summary, stream_labels, stream_scores = _decision_quality(cfg, live, first_seen)
    latency = np.concatenate([part_a.latencies_ms, part_b.latencies_ms])
    missing = part_a.missing | part_b.missing
    seconds = time.perf_counter() - t0
    return StageResult(
        "serve + loop",
        seconds,
        {
            "serve_start_s": round(started, 1),
            "produced": len(live),
            "decided": len(first_seen),
            "missing": len(missing),
            "dead_lettered": len(part_a.dead_letters),
            "dlq_reasons": sorted({str(d.get("reason")) for d in part_a.dead_letters}),
            "dlq_by_reason": dict(sorted(Counter(str(d.get("reason")) for d in part_a.dead_letters).items())),
            "offered_tx_per_s": args.stream_rate,
            "achieved_tx_per_s": round((part_a.stats.sent + part_b.stats.sent)
                                       / (part_a.stats.seconds + part_b.stats.seconds), 1),
            "latency_p50_ms": round(float(np.percentile(latency, 50)), 1) if len(latency) else None,
            "latency_p99_ms": round(float(np.percentile(latency, 99)), 1) if len(latency) else None,
            "latency_by_part": {"champion alone": _latency_figures(part_a.latencies_ms, loop.pop("split_a", {})),
                                "challenger shadowing": _latency_figures(part_b.latencies_ms,
                                                                         loop.pop("split_b", {}))},
            **summary,
            "consumed": counters.get("consumed"),
            "decided_by": sorted({f'{d["models"]["anomaly"]}+{d["models"]["fraud"]}' for d in first_seen.values()}),
            "labels_sent": part_a.stats.labels_sent + part_b.stats.labels_sent,
            **loop,
        },
        plots={"latency_ms": {"champion alone": part_a.latencies_ms, "challenger shadowing": part_b.latencies_ms},
               "stream_labels": stream_labels, "stream_scores": stream_scores},
    )


def _decision_quality(cfg: FedfraudConfig, live: pd.DataFrame, first: dict[str, dict[str, Any]]
                      ) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """Precision, recall, F1, PR-AUC and the confusion counts of the streamed decisions against the live tail's
    labels, and the labels and scores themselves (for the report's curves).
    """
    from fedfraud.training.fraud.metrics import classification_metrics

    labels = live.set_index("transaction_id")["is_fraud"].astype("boolean")
    decided = [tid for tid in live["transaction_id"] if tid in first]
    y = np.array([bool(labels[t]) if labels[t] is not pd.NA else False for t in decided])
    score = np.array([float(first[t]["score"]) for t in decided])
    flagged = np.array([first[t]["decision"] == "fraud" for t in decided])
    threshold = float(np.min(score[flagged])) if flagged.any() else float(np.max(score) + 1e-9)
    quality = classification_metrics(y, score, threshold, cfg.fraud.fpr_target)
    pred = score >= threshold  # as classification_metrics counts, so the matrix agrees with precision and recall
    confusion = {"tp": int((y & pred).sum()), "fp": int((~y & pred).sum()), "fn": int((y & ~pred).sum()),
                 "tn": int((~y & ~pred).sum())}
    return ({"frauds_streamed": int(y.sum()), "flagged": int(flagged.sum()), "precision": round(quality.precision, 4),
             "recall": round(quality.recall, 4), "f1": round(quality.f1, 4), "pr_auc": round(quality.pr_auc, 4),
             "confusion": confusion}, y, score)


def _policy_evidence(evidence: dict[str, Any]) -> dict[str, Any]:
    """The policy's figures (point values, the difference and its 95% interval per metric), rounded for the summary."""
    out: dict[str, Any] = {k: evidence[k] for k in ("transactions", "frauds") if k in evidence}
    for metric in ("pr_auc", "recall_at_fpr"):
        if isinstance(evidence.get(metric), dict):
            f = evidence[metric]
            out[metric] = {"champion": round(float(f["champion"]), 4), "challenger": round(float(f["challenger"]), 4),
                           "difference": round(float(f["difference"]), 4),
                           "difference_95ci": [round(float(x), 4) for x in f["difference_95ci"]]}
    return out


def _not_yet_due(frame: pd.DataFrame, delay_s: float) -> int:
    """Labels of ``frame`` not sent by a non-flushing feed (due after its last event time)."""
    known = frame[frame["is_fraud"].notna()]
    last = frame["timestamp"].iloc[-1]
    return int((known["timestamp"] + pd.Timedelta(seconds=delay_s) > last).sum())


def _metrics(url: str, headers: dict[str, str]) -> str:
    import httpx

    response = httpx.get(f"{url}/metrics", headers=headers, timeout=30)
    response.raise_for_status()
    return response.text


def _metric_value(text: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def _drift(url: str, headers: dict[str, str]) -> dict[str, Any]:
    """The drift gauges of the serving replica: the largest PSI, the window, and the three largest inputs."""
    from prometheus_client.parser import text_string_to_metric_families

    psi = {s.labels["feature"]: s.value for f in text_string_to_metric_families(_metrics(url, headers))
           for s in f.samples if s.name == "fedfraud_drift_psi"}
    top = sorted(psi.items(), key=lambda kv: -kv[1])[:3]
    return {"features": len(psi), "max_psi": round(top[0][1], 3) if top else None,
            "top": {k: round(v, 3) for k, v in top}}


def _wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.5)


Stage = Callable[[FedfraudConfig, DemoArgs, dict[str, Any]], StageResult]

STAGES: list[Stage] = [
    _stage_generate,
    _stage_ingest,
    _stage_holdout,
    _stage_features,
    _stage_train_anomaly,
    _stage_train_fraud,
    _stage_feature_store,
    _stage_merchant_risk,
    _stage_heterogeneous,
    _stage_stream,
]


def run_demo(cfg: FedfraudConfig, args: DemoArgs, progress: Callable[[str], None] | None = None) -> DemoReport:
    """Run every stage in order and write ``summary.json`` and ``report.html`` under ``args.out``."""
    from fedfraud.report import render_report

    from fedfraud.config import update_section
    from fedfraud.feature_store.privacy import per_run_secret
    from fedfraud.serving.auth import per_run_token

    args.out.mkdir(parents=True, exist_ok=True)
    registry = args.out / "registry"
    cfg = update_section(cfg, "features", repo_dir=str(args.out / "feature_repo"))
    auth = per_run_token(cfg.serving.auth, args.out)  # no token configured: a random one for this run
    secret_file = per_run_secret(cfg.privacy, args.out)  # no bank secret set: a random one for this run
    if progress and secret_file:
        progress(f"no bank secret set: this run's random simulation secret is in {secret_file}")
    cfg = update_section(cfg, "serving", registry_root=str(registry), auth=auth)
    if progress and auth.token_file:
        progress(f"API token (/score, /metrics, /tokenizer/*): in {auth.token_file}; send it as "
                 f"'Authorization: Bearer <token>'")
    report = DemoReport(out=args.out)
    report.console = console_commands(args.out, cfg.serving.bank_id, secret_file,
                                      Path(auth.token_file) if auth.token_file else None)
    ctx: dict[str, Any] = {"registry": registry, "progress": progress}
    try:
        for stage in STAGES:
            name = stage.__name__.removeprefix("_stage_")
            if progress:
                progress(f"[{len(report.stages) + 1}/{len(STAGES)}] {name} ...")
            t0, load0 = time.perf_counter(), os.getloadavg()[0]
            result = stage(cfg, args, ctx)
            log.info("demo stage=%s seconds=%.2f", result.name, time.perf_counter() - t0)
            report.stages.append(result)
            report.load_avg_1m[result.name] = (load0, os.getloadavg()[0])
        summary = report.to_json()
        (args.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
        render_report(summary, args.out / "report.html", extra=report.extra())
    except BaseException:
        held = ctx.get("live_console")
        if held is not None:  # a held console is the caller's only once the run returns
            held.close()
        raise
    report.live = ctx.get("live_console")
    if report.live is not None:
        report.console = [f"console: still serving this demo's stream at {report.live.url} (its broker is kept "
                          "up; the scorer has stopped); Ctrl-C stops both"]
    elif ctx.get("console_url"):
        report.console.insert(0, f"console: {ctx['console_url']} showed this demo's stream while it ran and stopped "
                                 "with it (fedfraud demo --hold-console keeps it up)")
    return report


@dataclass
class LiveConsole:
    """The analyst's console serving the demo's own broker and registry, in the demo's process.

    Why in-process: the stream stage's embedded broker keeps its topics in memory, so only a console started
    beside it while it runs can show that stream (issue 40: "the console shows the demo's stream live").
    ``broker`` is set only when the console is held after the run (``--hold-console``): it then owns the
    embedded broker and stops it in :meth:`close`.
    """

    server: Any  # fedfraud.console.runtime.ConsoleServer
    parts: Any  # fedfraud.console.web.Console
    broker: Any = None  # fedfraud.serving.kafka.broker.EmbeddedBroker, once handed over by the stream stage
    _closed: bool = field(default=False, repr=False)

    @property
    def url(self) -> str:
        return f"{self.server.url}/"

    def hold(self, stop: threading.Event | None = None) -> None:
        """Serve until Ctrl-C (or until ``stop`` is set), then :meth:`close`."""
        stop = stop if stop is not None else threading.Event()
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            log.info("console: Ctrl-C, stopping")
        finally:
            self.close()

    def close(self) -> None:
        """Stop the HTTP server, the console's Kafka readers and writer, then the broker it was handed."""
        if self._closed:
            return
        self._closed = True
        from fedfraud.console.runtime import close_console

        self.server.stop()
        close_console(self.parts)
        if self.broker is not None:
            self.broker.stop()
        log.info("console at %s stopped", self.url)


def _console_port(wanted: int) -> int:
    """``wanted`` when it can be bound on loopback now, else a free port (0: a free port)."""
    import socket

    from fedfraud.core.net import LOOPBACK, free_port

    if wanted:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((LOOPBACK, wanted))
                return wanted
            except OSError:
                log.info("console: port %d is taken; using a free one", wanted)
    return free_port()


def open_live_console(cfg: FedfraudConfig, bootstrap_servers: str, out: Path, port: int = CONSOLE_PORT,
                      progress: Callable[[str], None] | None = None, wait_s: float = 5.0) -> LiveConsole | None:
    """Start ``fedfraud console`` in this process on ``bootstrap_servers`` (the stream stage's broker), the run's
    registry and feature repo (``cfg``'s), on 127.0.0.1 with the run's API token, and print its URL.

    The console is an extra of the demo: when it cannot start (a port, a broker or a store error) the demo goes
    on without it, after one line saying why, rather than losing a ten-minute run. ``wait_s``: how long the
    index may take to catch up with what the topics hold (nothing yet, at the stream stage's start).
    """
    from fedfraud.console.runtime import ConsoleServer, close_console, open_console
    from fedfraud.core.net import LOOPBACK

    say = progress or (lambda line: log.info("%s", line))
    try:
        parts = open_console(cfg, bootstrap_servers, out / "console" / "audit.jsonl", wait_s=wait_s)
    except Exception as exc:  # noqa: BLE001 - the demo's stream matters more than its console
        log.debug("console did not start", exc_info=True)
        say(f"console: not started ({exc.__class__.__name__}: {exc}); the demo goes on without it")
        return None
    try:
        server = ConsoleServer(parts, host=LOOPBACK, port=_console_port(port)).start()
    except Exception as exc:  # noqa: BLE001 - as above; its Kafka clients are closed first
        close_console(parts)
        log.debug("console did not listen", exc_info=True)
        say(f"console: not started ({exc.__class__.__name__}: {exc}); the demo goes on without it")
        return None
    live = LiveConsole(server, parts)
    token_file = cfg.serving.auth.token_file
    token = f"the API token in {token_file}" if token_file else "the API token ($FEDFRAUD_API_TOKEN)"
    say(f"console: {live.url} shows this demo's stream live; log in with {token}")
    return live


def console_commands(out: Path, bank: int, secret_file: Path | None, token_file: Path | None) -> list[str]:
    """How to open ``fedfraud console`` on the demo's models, for the terminal after the run.

    Why commands and not a URL: the stream stage's embedded broker keeps its topics in memory and stops with the
    stage, so no console can read the demo's decisions once it returns, and ``make demo`` leaves nothing running.
    The lines serve the demo's registry and feature repo on a fresh broker, stream the bank's transactions into
    it and start the console beside it. ``secret_file`` / ``token_file``: this run's random secret and API token
    (None when the caller had set their own, which the commands then read as the demo did).
    """
    from shlex import quote

    env = [f'{name}="$(cat {quote(str(path))})"' for name, path in
           (("FEDFRAUD_SIMULATION_SECRET", secret_file), ("FEDFRAUD_API_TOKEN", token_file)) if path is not None]
    registry, repo = quote(str(out / "registry")), quote(str(out / "feature_repo"))
    lines = ["console: the demo's broker stopped with its stream (embedded, memory only); to review its models' "
             "declines in the analyst's console, run in three terminals:"]
    if env:
        lines.append(f"  export {' '.join(env)}   # in each terminal")
    lines += [f"  fedfraud --set features.repo_dir={repo} serve --registry {registry}   # prints \"embedded Tansu "
              "broker at HOST:PORT\"",
              f"  fedfraud stream --data {quote(str(out / 'data'))} --bank {bank} --rate 100 "
              "--bootstrap-servers HOST:PORT",
              f"  fedfraud console --bootstrap-servers HOST:PORT --registry {registry} --repo {repo}",
              "  then open http://127.0.0.1:8600/ and log in with the API token (docs/console.md)"]
    return lines


def summary_lines(report: DemoReport) -> list[str]:
    """One line per stage, ``name (Ns): key=value ...``, for the terminal."""
    lines = []
    for s in report.stages:
        parts = []
        for key, value in s.summary.items():
            if isinstance(value, dict):
                value = ", ".join(f"{k}={v}" for k, v in value.items())
                parts.append(f"{key}=[{value}]")
            else:
                parts.append(f"{key}={value}")
        lines.append(f"{s.name:>16} ({s.seconds:5.1f}s): " + " ".join(parts))
    return lines


def _latency_figures(latency_ms: np.ndarray, split: dict[str, dict[str, float]]) -> dict[str, Any]:
    """p50 / p99 / max of one part of the stream, where in it (share of the way through) the slowest were, and the
    replica's split of produce → decision at pickup (:meth:`fedfraud.serving.app.StreamScorer.latency_split`).
    """
    if not len(latency_ms):
        return {}
    slowest = np.argsort(latency_ms)[::-1][:5]
    return {"n": len(latency_ms), "p50_ms": round(float(np.percentile(latency_ms, 50)), 1),
            "p99_ms": round(float(np.percentile(latency_ms, 99)), 1), "max_ms": round(float(latency_ms.max()), 1),
            "slowest_at": [round(float(i) / len(latency_ms), 3) for i in slowest],
            **{f"{name.removeprefix('latency.')}_p99_ms": round(v["p99_ms"], 1) for name, v in split.items()}}

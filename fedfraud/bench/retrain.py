"""``fedfraud bench retrain``: what the retraining loop costs and how soon it can decide.

One run, demo-sized data (the project's generator, 5 banks):

1. **Cycle wall time.** Two real federated cycles run as the scheduler runs them
   (``python -m fedfraud retrain run``, a child process): the first on the
   history makes the champion (promoted at once), the second on the history plus
   the first live days, with those days' labels, makes the challenger. The
   second cycle's wall time, by step, is the figure.
2. **Shadow cost.** Serving (embedded broker, Ray Serve) replays the rest of the
   live tail at a fixed rate in alternating blocks, challenger off / on / off /
   on; p50/p99 of produce → decision of each mode and their ratio, from the same
   run, plus the CPU ms per transaction of the shadow sections.
3. **Labelled frauds to decide.** The shadowed transactions' labels are joined
   (the label joiner on the real topics) and the policy's comparison is rerun on
   the first k labelled frauds in arrival order: the smallest k at which the
   paired bootstrap interval of the PR-AUC difference excludes zero, and the
   policy's verdict on all of them.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedfraud.training.registry import ModelRef

if TYPE_CHECKING:
    from fedfraud.serving.config import KafkaSecurity

__all__ = ["RetrainBenchResult", "run_retrain_bench"]

log = logging.getLogger(__name__)


@dataclass
class RetrainBenchResult:
    """Figures of one ``fedfraud bench retrain`` run."""

    cardholders: int
    banks: int
    days: int
    rounds: int
    rows: int
    cycle: dict[str, Any]
    shadow: list[dict[str, Any]] = field(default_factory=list)
    shadow_cpu_ms_per_tx: dict[str, float] = field(default_factory=dict)
    decide: dict[str, Any] = field(default_factory=dict)
    load_avg: float = 0.0
    cpus: int = 0

    def to_markdown(self) -> str:
        c = self.cycle
        lines = [
            "### Retraining loop (`fedfraud bench retrain`)",
            "",
            f"Generator data: {self.banks} banks, {self.cardholders} cardholders, {self.days} days; {self.rounds} "
            f"federated rounds; {self.cpus} CPUs, load average {self.load_avg:.1f} at start.",
            "",
            "| measure | value |",
            "|---|---|",
            f"| one federated retrain cycle, wall (child process, {c['rows']:,} window rows) | {c['wall_s']:.1f} s |",
            f"| … window / anomaly GNN (Flower) / fraud model (federated XGBoost) | "
            f"{c['seconds'].get('window', 0):.1f} / {c['seconds'].get('anomaly', 0):.1f} / "
            f"{c['seconds'].get('fraud', 0):.1f} s |",
        ]
        by_mode: dict[str, list[dict[str, Any]]] = {}
        for row in self.shadow:
            by_mode.setdefault(row["mode"], []).append(row)
        if by_mode:
            med = {m: {k: float(np.median([r[k] for r in rows])) for k in ("p50_ms", "p99_ms", "achieved")}
                   for m, rows in by_mode.items()}
            rate = self.shadow[0]["offered"]
            for mode in ("champion only", "with shadow"):
                if mode in med:
                    lines.append(f"| p50 / p99 at {rate:,.0f} tx/s offered, {mode} (median of "
                                 f"{len(by_mode[mode])} blocks) | {med[mode]['p50_ms']:.1f} / "
                                 f"{med[mode]['p99_ms']:.1f} ms |")
            if len(med) == 2:
                lines.append(f"| p99 ratio, shadow / champion only | "
                             f"{med['with shadow']['p99_ms'] / med['champion only']['p99_ms']:.2f} |")
        for name, ms in self.shadow_cpu_ms_per_tx.items():
            lines.append(f"| CPU of `{name}` per shadowed transaction | {ms:.3f} ms |")
        d = self.decide
        if d:
            first = d.get("first_decisive_frauds")
            reached = first if first is not None else f"not reached ({d['frauds']} available)"
            lines += [
                f"| labelled transactions shadowed / frauds among them | {d['transactions']:,} / {d['frauds']} |",
                f"| labelled frauds from which the PR-AUC difference's 95% interval excluded zero at every "
                f"later checkpoint | {reached} |",
                "| the difference (challenger − champion PR-AUC) as labelled frauds arrived | " + "; ".join(
                    f"{p['frauds']}: {p['difference']:+.3f} [{p['ci'][0]:+.3f}, {p['ci'][1]:+.3f}]"
                    for p in d.get("path", [])) + " |",
                f"| policy verdict on all of them | {d['action']}: {d['reason']} |",
            ]
        lines += ["", "Blocks in run order: " + ", ".join(
            f"{r['mode']} p99 {r['p99_ms']:.0f} ms" for r in self.shadow)]
        return "\n".join(lines) + "\n"


def _cycle(cfg_file: Path, data: Path, registry: Path, trigger: str) -> tuple[dict[str, Any], float]:
    """One cycle as the scheduler runs it; returns its result and wall seconds."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "fedfraud", "--config", str(cfg_file), "retrain", "run", "--data",
                           str(data), "--registry", str(registry), "--trigger", trigger, "--json"],
                          capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"retrain cycle failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall


def _set_shadow(registry: Any, challenger: dict[str, str] | None, url: str, headers: dict[str, str],
                timeout_s: float = 60.0) -> None:
    """Register (or remove) the challenger pair and wait until serving shadows (or stops)."""
    import httpx

    for kind in ("anomaly", "fraud"):
        version = None if challenger is None else ModelRef.parse(challenger[kind]).version
        registry.set_alias(kind, "challenger", version, actor="bench", reason="shadow cost A/B")
    want = None if challenger is None else f'challenger="{challenger["fraud"]}"'
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = httpx.get(f"{url}/metrics", headers=headers, timeout=30).text
        shadowing = "fedfraud_shadow_scored_total{" in text
        if (want is None and not shadowing) or (want is not None and want in text):
            return
        time.sleep(0.3)
    raise RuntimeError("serving did not follow the challenger alias in time")


def run_retrain_bench(config: Any = None, cardholders: int = 800, banks: int = 5, days: int = 30, rounds: int = 8,
                      rate: float = 250.0, block_s: float = 4.0, blocks: int = 2) -> RetrainBenchResult:
    """Run the three measurements (see the module docstring) in one process."""
    import yaml

    from fedfraud.config import FedfraudConfig, update_section
    from fedfraud.feature_store.feast_store import apply_repo, materialize_repo, open_store
    from fedfraud.feature_store.offline import write_offline
    from fedfraud.bench.serving import load_block
    from fedfraud.feature_store.outcomes import OutcomeStore
    from fedfraud.serving.labels import LabelJoiner
    from fedfraud.serving.auth import per_run_token
    from fedfraud.serving.runtime import start
    from fedfraud.serving.warm import warm_fraud_state
    from fedfraud.training.data.config import GeneratorConfig
    from fedfraud.training.data.holdout import time_holdout, write_records
    from fedfraud.training.data.synthetic import generate_dataset
    from fedfraud.training.registry import ModelRegistry

    cfg: FedfraudConfig = config or FedfraudConfig()
    tmp = Path(tempfile.mkdtemp(prefix="fedfraud-bench-retrain-"))
    load_avg = os.getloadavg()[0]
    generate_dataset(tmp / "data", GeneratorConfig(banks=banks, cardholders=cardholders, days=days, seed=7),
                     raw_csv=False, progress=False)
    # a long live tail: the first third goes into the challenger's window, the rest is streamed
    split = time_holdout(tmp / "data", tmp / "history", holdout_days=days * 0.45)
    live = split.live[cfg.serving.bank_id]
    first_cut = live["timestamp"].iloc[len(live) // 3]
    registry = tmp / "registry"
    cfg = update_section(cfg, "retrain", rounds=rounds)
    cfg = update_section(cfg, "serving", registry_root=str(registry), bootstrap_servers=None,
                         auth=per_run_token(cfg.serving.auth, tmp))
    cfg = update_section(cfg, "features", repo_dir=str(tmp / "repo"))
    cfg_file = tmp / "fedfraud.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg.model_dump(mode="json")), encoding="utf-8")
    reg = ModelRegistry(registry)

    champion, _ = _cycle(cfg_file, split.history, registry, "bench-champion")
    for kind in ("anomaly", "fraud"):
        reg.promote(kind, ModelRef.parse(champion[kind]).version, actor="bench", reason="the bench's champion")
    records = write_records(split.history, tmp / "offline", split.live, until=first_cut)
    challenger, wall = _cycle(cfg_file, records, registry, "bench")
    for kind in ("anomaly", "fraud"):
        reg.set_alias(kind, "challenger", None, actor="bench", reason="the bench toggles it")
    log.info("retrain cycle wall=%.1fs steps=%s", wall, challenger["seconds"])

    store = open_store(cfg.features)
    write_offline(split.history, Path(store.repo_path), cfg.encoder, cfg.privacy, cfg.egograph,
                  cfg.features.location_cell_deg, banks=[cfg.serving.bank_id], progress=False)
    apply_repo(store)
    materialize_repo(store)
    warm_fraud_state(cfg, split.history)
    stream = live[live["timestamp"] > first_cut].reset_index(drop=True)
    rows: list[dict[str, Any]] = []
    cpu: dict[str, float] = {}
    outcomes = tmp / "outcomes.sqlite"
    rt = start(cfg)
    try:
        cursor = 0
        warm = stream.iloc[:200]
        rt.replay(warm, rate=0)  # first calls import and compile
        cursor += len(warm)
        n = int(rate * block_s)
        shadowed_ids: list[str] = []
        for _ in range(blocks):
            for mode in ("champion only", "with shadow"):
                _set_shadow(reg, None if mode == "champion only" else challenger, rt.url, rt.headers)
                chunk = stream.iloc[cursor:cursor + n].reset_index(drop=True)
                cursor += len(chunk)
                if chunk.empty:
                    break
                row, profile = load_block(rt, chunk, rate, timeout_s=300)
                prof = next(iter(profile.values()), {})
                rows.append({"mode": mode, **row})
                log.info("%s p50=%.1fms p99=%.1fms", mode, rows[-1]["p50_ms"], rows[-1]["p99_ms"])
                if mode == "with shadow":
                    shadowed_ids += chunk["transaction_id"].astype(str).tolist()
                    for name in ("shadow.anomaly", "shadow.fraud"):
                        if name in prof:
                            cpu[name] = cpu.get(name, 0.0) + prof[name]["cpu_s"] * 1e3
        shadowed = stream[stream["transaction_id"].astype(str).isin(set(shadowed_ids))]
        for name in cpu:
            cpu[name] /= max(len(shadowed), 1)
        # 3. the shadowed transactions' labels come back; join them and replay the policy's comparison
        _send_labels(rt.bootstrap_servers, cfg.serving.topics.labels, shadowed, cfg.serving.kafka_security)
        with OutcomeStore(outcomes) as out:
            joiner = LabelJoiner(rt.bootstrap_servers, out, cfg.serving.topics, security=cfg.serving.kafka_security)
            try:
                joiner.run(idle_s=3)
            finally:
                joiner.close()
            pairs = out.labelled_pairs(champion["fraud"], challenger["fraud"])
    finally:
        rt.stop()
    order = {t: i for i, t in enumerate(shadowed["transaction_id"].astype(str))}
    pairs = pairs.assign(_arrival=pairs["transaction_id"].map(order)).sort_values("_arrival")
    decide = _frauds_to_decide(pairs, cfg.retrain)
    return RetrainBenchResult(cardholders, banks, days, rounds, int(challenger["rows"]),
                              {"wall_s": wall, "rows": int(challenger["rows"]), "seconds": challenger["seconds"]},
                              rows, cpu, decide, load_avg, os.cpu_count() or 0)


def _send_labels(bootstrap: str, topic: str, frame: Any, security: KafkaSecurity) -> None:
    """Each transaction's label, as the bank's case system sends it (with the deployment's ``kafka_security``)."""
    from fedfraud.serving.config import ProducerSettings
    from fedfraud.serving.kafka import confirm_sent, make_producer
    from fedfraud.serving.labels import label_message

    producer = make_producer(bootstrap, ProducerSettings(), security=security)
    try:
        known = frame[frame["is_fraud"].notna()]
        confirm_sent(producer, [producer.send(topic, key=str(t).encode(), value=label_message(
            str(t), bool(f), str(ts), "bench")) for t, f, ts in zip(known["transaction_id"], known["is_fraud"],
                                                                     known["timestamp"], strict=True)])
    finally:
        producer.close()


def _frauds_to_decide(pairs: Any, retrain_cfg: Any) -> dict[str, Any]:
    """The smallest k (labelled frauds, in arrival order) at which the PR-AUC difference's interval excludes 0,
    and the policy's verdict on every pair.
    """
    from fedfraud.training.retrain.policy import compare, verdict

    if pairs.empty or not pairs["is_fraud"].any():
        return {"transactions": int(len(pairs)), "frauds": 0, "first_decisive_frauds": None, "action": "wait",
                "reason": "no labelled fraud among the shadowed transactions"}
    y = pairs["is_fraud"].to_numpy(bool)
    fraud_rank = np.cumsum(y)
    path: list[dict[str, Any]] = []
    for k in [*range(5, int(y.sum()), 5), int(y.sum())]:
        upto = pairs.iloc[: int(np.searchsorted(fraud_rank, k)) + 1]
        pr = compare(upto, retrain_cfg)["pr_auc"]
        path.append({"frauds": k, "difference": pr["difference"], "ci": pr["difference_95ci"]})
    # decisive from k on: the interval excludes zero at k and at every later checkpoint (not a lucky peek)
    excludes = [p["ci"][0] > 0 or p["ci"][1] < 0 for p in path]
    first = next((path[i]["frauds"] for i in range(len(path)) if all(excludes[i:])), None)
    action, reason = verdict(compare(pairs, retrain_cfg))
    return {"transactions": int(len(pairs)), "frauds": int(y.sum()), "first_decisive_frauds": first,
            "action": action, "reason": reason, "path": path}

"""``fedfraud bench serving --merchant-risk-ab``: what reading merchant risk costs the stream, same run A/B.

A: the replica serves a fraud model without merchant-risk columns (it reads no ``merchant_risk`` row). B: the
same data, a fraud model trained with them, the bank's ``merchant_risk`` rows in the online store, so every
micro-batch reads its merchants' rows with the cardholder states (``OnlineStateClient.read_batch``) and the fraud
stage builds the columns. The two deployments alternate, A B A B ..., on the same machine and broker software
within one process; each block replays the same rows at each offered load. Run-to-run noise is the spread of
one variant's blocks.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedfraud.bench.harness import blocks, table

__all__ = ["MerchantRiskAB", "run_merchant_risk_ab"]

log = logging.getLogger(__name__)

VARIANTS = ("A: no merchant risk", "B: merchant risk read")


@dataclass
class MerchantRiskAB:
    """p50 / p99 per variant, offered load and block."""

    blocks: list[dict[str, Any]] = field(default_factory=list)
    load_avg: tuple[float, float] = (0.0, 0.0)
    store: str = "sqlite"

    def to_markdown(self) -> str:
        loads = sorted({b["offered"] for b in self.blocks})
        cells = [(load, v, [b for b in self.blocks if b["offered"] == load and b["variant"] == v])
                 for load in loads for v in VARIANTS]
        rows = [(f"{load:,.0f}", v, ", ".join(f"{b['p99_ms']:.1f}" for b in mine),
                 f"{np.median([b['p50_ms'] for b in mine]):.1f} / {np.median([b['p99_ms'] for b in mine]):.1f}")
                for load, v, mine in cells if mine]
        start, end = self.load_avg
        return blocks("### Merchant risk on the hot path, same run A/B "
                      "(`fedfraud bench serving --merchant-risk-ab`)",
                      f"Online store {self.store}; load average {start:.1f} at start, {end:.1f} at end. Each "
                      "cell: p99 of every block (ms), then the median p50 / p99.",
                      table(["offered tx/s", "variant", "p99 per block", "median p50 / p99"], rows))


def _merchant_model(reg: Any, train: Any, cfg: Any) -> None:
    """Publish a fraud model whose row ends with the merchant columns (clear release of the training rows)."""
    from fedfraud.feature_store.privacy import PrivateFeaturizer
    from fedfraud.training.fraud.config import FraudConfig
    from fedfraud.training.fraud.features import build_features, fit_transitions
    from fedfraud.training.fraud.model import fit_model
    from fedfraud.training.merchant_risk.features import bank_activity, training_columns, with_merchant_columns

    fcfg = FraudConfig(nthread=1)
    private = PrivateFeaturizer.for_bank(cfg.encoder, cfg.privacy, 0).transform(train)
    table = fit_transitions(train, private.cardholder, np.ones(len(train), dtype=bool))
    feats = build_features(train, private, fcfg, transitions=table)
    risk = cfg.merchant_risk
    cols = training_columns({0: bank_activity(train, 0, cfg.encoder, cfg.privacy, risk)}, risk)[0]
    feats = with_merchant_columns(feats, cols, risk)
    fit_model(feats, feats, True, fcfg, "centralized").publish(
        reg, config={"fraud": fcfg.model_dump(), "merchant_risk": risk.model_dump(mode="json")}, metrics={})


def _push_rows(cfg: Any, train: Any) -> int:
    """The bank's ``merchant_risk`` rows of the last training day (clear release: one bank) in the online store."""
    from fedfraud.feature_store.online import OnlineStateClient
    from fedfraud.training.merchant_risk.features import bank_activity, table_rows
    from fedfraud.training.merchant_risk.stats import release_vector

    risk = cfg.merchant_risk
    activity = bank_activity(train, 0, cfg.encoder, cfg.privacy, risk)
    day = int(activity.day[-1])
    recent = [release_vector(activity, r, risk) for r in range(day - risk.release_average + 1, day + 1)]
    table = table_rows(activity, day, recent, risk)
    client = OnlineStateClient.open(cfg.features, cfg.egograph)
    client.push_merchant_risk(0, day, table.buckets.tolist(), table.own, table.fed)
    return int(table.buckets.size)


def run_merchant_risk_ab(config: Any = None, rounds: int = 2, loads: tuple[float, ...] = (250.0, 1000.0),
                         seconds: float = 8.0) -> MerchantRiskAB:
    """Alternate A and B ``rounds`` times; each block warms up, then replays ``seconds`` at each offered load."""
    import os

    from fedfraud.bench.serving import bench_frame, load_block, publish_bench_models
    from fedfraud.config import FedfraudConfig
    from fedfraud.serving.auth import per_run_token
    from fedfraud.serving.runtime import start
    from fedfraud.training.registry import ModelRegistry

    cfg: FedfraudConfig = config or FedfraudConfig()
    tmp = Path(tempfile.mkdtemp(prefix="fedfraud-bench-merchant-ab-"))
    per_block = 300 + int(sum(loads) * seconds)
    need = 2000 + per_block
    frame = bench_frame(need)
    train = frame.head(2000)
    registries = {v: ModelRegistry(tmp / f"registry-{k}") for k, v in enumerate(VARIANTS)}
    _merchant_model(registries[VARIANTS[1]], train, cfg)
    for reg in registries.values():
        publish_bench_models(reg, train, cfg)
    out = MerchantRiskAB(load_avg=(os.getloadavg()[0], 0.0), store=cfg.features.profile)
    for r in range(rounds):
        for k, variant in enumerate(VARIANTS):
            serving = cfg.serving.model_copy(update={"registry_root": str(registries[variant].root),
                                                     "bootstrap_servers": None,
                                                     "auth": per_run_token(cfg.serving.auth, tmp)})
            features = cfg.features.model_copy(update={"repo_dir": str(tmp / f"repo-{r}-{k}")})
            run_cfg = cfg.model_copy(update={"serving": serving, "features": features})
            rt = start(run_cfg, replay_source=True)
            try:
                if k == 1:
                    log.info("merchant_ab rows=%d", _push_rows(run_cfg, train))
                cursor = 2000
                rt.replay(frame.iloc[cursor:cursor + 300].reset_index(drop=True), rate=0)  # warm-up
                cursor += 300
                for rate in loads:
                    n = int(rate * seconds)
                    row, _ = load_block(rt, frame.iloc[cursor:cursor + n].reset_index(drop=True), rate)
                    cursor += n
                    out.blocks.append({"variant": variant, "round": r, "offered": rate, "p50_ms": row["p50_ms"],
                                       "p99_ms": row["p99_ms"], "achieved": row["achieved"]})
                    log.info("merchant_ab round=%d variant=%s load=%.0f p50=%.1f p99=%.1f", r, variant, rate,
                             row["p50_ms"], row["p99_ms"])
            finally:
                rt.stop()
    out.load_avg = (out.load_avg[0], os.getloadavg()[0])
    return out

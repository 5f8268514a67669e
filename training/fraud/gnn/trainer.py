"""Run federated GNN jobs (FedAvg-GNN, FedRPDA, its ablations) over the banks' graphs in one Flower session.

``engine="simulation"``: Flower's simulation engine on Ray, one SuperNode per bank (what ``fedfraud train fraud``
uses). ``engine="loopback"``: the same ServerApp and ClientApp in this process (:mod:`.loopback`). Both run
:func:`~fedfraud.training.fraud.gnn.server_app.run_jobs`: one scaler query, then every job in turn, so a study
pays the start-up once.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path


from fedfraud.training.fraud.config import FraudConfig
from fedfraud.training.fraud.features import ANOMALY_FEATURE
from fedfraud.training.fraud.gnn.artifact import GnnFraudModel
from fedfraud.training.fraud.gnn.graph import TransactionGraph
from fedfraud.training.fraud.gnn.server_app import GnnJobResult, build_server_app, run_jobs
from fedfraud.training.fraud.gnn.task import GnnJob, bank_graph_file, write_index

__all__ = ["VARIANT_JOBS", "gnn_used_features", "train_gnn_jobs", "variant_job"]

logger = logging.getLogger(__name__)

#: Variant → (risk-aware aggregation, diversified-risk augmentation).
VARIANT_JOBS: dict[str, tuple[bool, bool]] = {
    "fedavg-gnn": (False, False),
    "fedrpda": (True, True),
    "fedrpda-no-ra": (False, True),
    "fedrpda-no-dra": (True, False),
}


def variant_job(variant: str, seed: int = 0, overrides: Sequence[tuple[str, float]] = (),
                name: str | None = None) -> GnnJob:
    """The job of a named variant (an unknown name lists the known ones)."""
    if variant not in VARIANT_JOBS:
        raise ValueError(f"unknown GNN variant {variant!r}; choose from {', '.join(VARIANT_JOBS)}")
    ra, dra = VARIANT_JOBS[variant]
    return GnnJob(name or f"{variant}#{seed}", ra, dra, seed, tuple(overrides))


def gnn_used_features(names: Sequence[str], use_anomaly_score: bool) -> tuple[str, ...]:
    """The columns the GNN reads: every feature, minus the anomaly score when it is not used."""
    return tuple(n for n in names if use_anomaly_score or n != ANOMALY_FEATURE)


def train_gnn_jobs(graphs: dict[int, TransactionGraph], cfg: FraudConfig, jobs: Sequence[GnnJob],
                   use_anomaly_score: bool | None = None, engine: str | None = None) -> dict[str, GnnFraudModel]:
    """Train every job over the banks' graphs; one :class:`GnnFraudModel` per job name.

    Args:
        graphs: bank → its transaction graph (:func:`~fedfraud.training.fraud.gnn.graph.build_graph`).
        cfg: the fraud settings (``cfg.gnn`` is the base every job starts from).
        jobs: the jobs, distinct names.
        use_anomaly_score: whether the anomaly-score column is an input (default ``cfg.use_anomaly_score``).
        engine: ``simulation`` or ``loopback`` (default ``cfg.gnn.engine``).
    """
    if len(graphs) < 2:
        raise ValueError("federated training needs at least 2 banks")
    if len({j.name for j in jobs}) != len(jobs):
        raise ValueError("job names must be distinct")
    engine = engine or cfg.gnn.engine
    if engine not in ("simulation", "loopback"):
        raise ValueError(f"engine {engine!r}: choose simulation or loopback")
    order = sorted(graphs)
    names = tuple(graphs[order[0]].features.names)
    if any(tuple(graphs[b].features.names) != names for b in order):
        raise ValueError("the banks' feature rows differ in layout")
    used = gnn_used_features(names, cfg.use_anomaly_score if use_anomaly_score is None else use_anomaly_score)
    results: dict[str, GnnJobResult] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fedfraud-gnn-") as tmp:
        folder = Path(tmp)
        for b in order:
            graphs[b].save(bank_graph_file(folder, b))
        write_index(folder, order)
        settings = {
            "features-dir": str(folder), "names": json.dumps(list(names)), "used": json.dumps(list(used)),
            "gnn-config": cfg.gnn.model_dump_json(), "jobs": json.dumps([json.loads(j.to_json()) for j in jobs]),
            "num-supernodes": len(order), "threshold-bins": cfg.threshold_bins,
        }

        def keep(result: GnnJobResult) -> None:
            results[result.job.name] = result

        from fedfraud.training.fraud.gnn.client_app import app as client_app
        from fedfraud.training.fraud.gnn.loopback import run_federated

        run_federated(engine, client_app, run_jobs, build_server_app, settings, keep, len(order),
                      cfg.gnn.torch_threads)
    wall = time.perf_counter() - started
    models: dict[str, GnnFraudModel] = {}
    for job in jobs:
        if job.name not in results:
            raise RuntimeError(f"the GNN ServerApp produced no model for job {job.name!r} (see the log above)")
        r = results[job.name]
        variant = next((v for v, flags in VARIANT_JOBS.items() if flags == (job.risk_aware, job.diversified)),
                       "fedrpda")
        models[job.name] = GnnFraudModel(
            r.arrays, names, used, job.config(cfg.gnn), r.threshold, variant,
            {"banks": order, "rounds": r.rounds, "seed": job.seed, "valid_f1": r.valid_f1,
             "valid_pr_auc": r.valid_pr_auc, "seconds": r.seconds, "engine": engine,
             "overrides": dict(job.overrides), "round_weights": [h["weights"] for h in r.history],
             "round_loss_p": [h["loss_p"] for h in r.history],
             "risk_intensity": r.history[-1]["risk"] if r.history else [], "client_dp": r.client_dp})
    logger.info("gnn_federated banks=%d jobs=%d engine=%s wall_s=%.1f", len(order), len(jobs), engine, wall)
    return models

"""Run FED-SPFD jobs (and the FedAvg / FedPer baselines on the same network) over the banks in one Flower session.

``engine="simulation"``: Flower's simulation engine on Ray, one SuperNode per bank (``fedfraud train fraud``).
``engine="loopback"``: the same ServerApp and ClientApp in this process, over the GNN variants' loopback grid
(:mod:`fedfraud.training.fraud.gnn.loopback`). The temporary folder plays each bank's disk: a bank reads its table
from it and writes its trained model (with its private autoencoder) back to it, and each bank's
:class:`~.artifact.SpfdFraudModel` is assembled from that file.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from fedfraud.training.fraud.config import FraudConfig
from fedfraud.training.fraud.features import FraudFeatures
from fedfraud.training.fraud.gnn.task import write_index
from fedfraud.training.fraud.spfd.artifact import SpfdFraudModel
from fedfraud.training.fraud.spfd.columns import shared_columns
from fedfraud.training.fraud.spfd.server_app import SpfdJobResult, build_server_app, run_jobs
from fedfraud.training.fraud.spfd.task import SpfdJob, bank_model_file, save_bank

__all__ = ["SPFD_JOBS", "spfd_job", "train_spfd_jobs"]

logger = logging.getLogger(__name__)

#: Variant → (alignment, private autoencoder, local head).
SPFD_JOBS: dict[str, tuple[bool, bool, bool]] = {
    "fed-spfd": (True, True, False),
    "fedavg": (False, False, False),
    "fedper": (False, False, True),
    "fed-spfd-no-alg": (False, True, False),
}


def spfd_job(variant: str, seed: int = 0, overrides: Sequence[tuple[str, float]] = (),
             name: str | None = None) -> SpfdJob:
    """The job of a named variant (an unknown name lists the known ones)."""
    if variant not in SPFD_JOBS:
        raise ValueError(f"unknown FED-SPFD variant {variant!r}; choose from {', '.join(SPFD_JOBS)}")
    align, private, local_head = SPFD_JOBS[variant]
    return SpfdJob(name or f"{variant}#{seed}", align, private, local_head, seed, tuple(overrides))


def train_spfd_jobs(tables: Mapping[int, FraudFeatures], private: Mapping[int, tuple[str, ...]], cfg: FraudConfig,
                    jobs: Sequence[SpfdJob], use_anomaly_score: bool | None = None, engine: str | None = None
                    ) -> dict[str, dict[int, SpfdFraudModel]]:
    """Train every job over the banks; ``job name → bank → that bank's model``.

    Args:
        tables: bank → its rows (:func:`~.columns.bank_table`: the fraud feature row plus its demographics).
        private: bank → its private columns (:func:`~.columns.private_columns`).
        cfg: the fraud settings (``cfg.spfd`` is the base every job starts from).
        jobs: distinct names.
        use_anomaly_score: whether the anomaly score is a shared column (default ``cfg.use_anomaly_score``).
        engine: ``simulation`` or ``loopback`` (default ``cfg.spfd.engine``).
    """
    if len(tables) < 2:
        raise ValueError("federated training needs at least 2 banks")
    if len({j.name for j in jobs}) != len(jobs):
        raise ValueError("job names must be distinct")
    engine = engine or cfg.spfd.engine
    if engine not in ("simulation", "loopback"):
        raise ValueError(f"engine {engine!r}: choose simulation or loopback")
    order = sorted(tables)
    shared = shared_columns(tables[order[0]].names, cfg.use_anomaly_score if use_anomaly_score is None
                            else use_anomaly_score)
    for b in order:
        missing = [c for c in (*shared, *private.get(b, ())) if c not in tables[b].names]
        if missing:
            raise ValueError(f"bank {b}'s table lacks the columns {missing}")
    results: dict[str, SpfdJobResult] = {}
    models: dict[str, dict[int, SpfdFraudModel]] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fedfraud-spfd-") as tmp:
        folder = Path(tmp)
        for b in order:
            save_bank(folder, b, tables[b], tuple(private.get(b, ())))
        write_index(folder, order)
        settings = {
            "features-dir": str(folder), "shared": json.dumps(list(shared)),
            "spfd-config": cfg.spfd.model_dump_json(), "jobs": json.dumps([json.loads(j.to_json()) for j in jobs]),
            "num-supernodes": len(order), "threshold-bins": cfg.threshold_bins,
        }

        def keep(result: SpfdJobResult) -> None:
            results[result.job.name] = result

        from fedfraud.training.fraud.spfd.client_app import app as client_app
        from fedfraud.training.fraud.gnn.loopback import run_federated

        run_federated(engine, client_app, run_jobs, build_server_app, settings, keep, len(order),
                      cfg.spfd.torch_threads)
        for job in jobs:
            if job.name not in results:
                raise RuntimeError(f"the FED-SPFD ServerApp produced no model for job {job.name!r} (see the log)")
            r = results[job.name]
            variant = next((v for v, f in SPFD_JOBS.items() if f == (job.align, job.private, job.local_head)),
                           "fed-spfd")
            models[job.name] = {}
            for b in order:  # each bank's own file: the global parts plus what it kept
                with np.load(bank_model_file(folder, b, job.name), allow_pickle=False) as z:
                    arrays = {k: z[k] for k in z.files}
                own = tuple(private.get(b, ())) if job.private else ()
                if not job.private:
                    arrays = {k: v for k, v in arrays.items() if not k.startswith("private")}
                models[job.name][b] = SpfdFraudModel(
                    arrays, shared, own, job.config(cfg.spfd), r.threshold, variant, b, job.private,
                    {"banks": order, "seed": job.seed, "valid_f1": r.valid_f1, "valid_pr_auc": r.valid_pr_auc,
                     "seconds": r.seconds, "engine": engine, "overrides": dict(job.overrides),
                     "rounds": job.config(cfg.spfd).rounds, "history": r.history, "client_dp": r.client_dp},
                    tables[b].transitions)
    logger.info("spfd_federated banks=%d jobs=%d engine=%s wall_s=%.1f", len(order), len(jobs), engine,
                time.perf_counter() - started)
    return models

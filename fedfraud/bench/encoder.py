"""Wall time per graph-embedding call of the anomaly encoder: sparse PyG path vs dense inference path.

``fedfraud bench encoder`` (``--csv ../shared/data/sparkov_dev_1000cards_2022H1.csv.gz``
for Sparkov ego graphs) runs :func:`run_encoder_bench` and prints
:meth:`EncoderBench.to_markdown`.

Protocol: ego graphs G_t built by the serving code (``EgoGraphState`` via
:func:`~fedfraud.feature_store.egograph.build_snapshot_pairs`) from the
generator's or the CSV's first rows; the configured anomaly model (random
weights: the cost does not depend on their values); for each batch size the
same random batches go through ``embed_graphs`` (collate + forward, what
``AnomalyScorer.embed`` calls) on both paths, the two paths alternating call
by call so they share the machine's load; torch ops per call are counted at
the dispatcher. Medians and p99 in ms.
"""

from __future__ import annotations

import logging
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from fedfraud.bench.harness import load_average, table

__all__ = ["EncoderBench", "PathTiming", "count_torch_ops", "run_encoder_bench"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PathTiming:
    """One (threads, batch size) cell: both paths' p50/p99 ms per call and torch ops per call."""

    threads: int
    graphs: int
    sparse_p50: float
    sparse_p99: float
    dense_p50: float
    dense_p99: float
    sparse_ops: int
    dense_ops: int
    max_abs_diff: float


@dataclass
class EncoderBench:
    """Every cell of the run, the load averages around it, and where the graphs came from."""

    source: str
    model: str
    calls: int
    dense_max: int = 0
    rows: list[PathTiming] = field(default_factory=list)
    loadavg: list[str] = field(default_factory=list)

    def to_markdown(self) -> str:
        lines = [
            "## Anomaly encoder: sparse PyG path vs dense inference path (`fedfraud bench encoder`)",
            "",
            f"{self.model}; ego graphs from {self.source}; {self.calls} calls of `embed_graphs` per cell and path, "
            f"alternating; {platform.processor() or platform.machine()}, torch threads as listed. The encoder takes "
            f"the dense path up to {self.dense_max} graphs per call (`GraphEncoder.DENSE_MAX_GRAPHS`); "
            "above it this table times the dense path anyway.",
            "",
            *table(["threads", "graphs/call", "sparse p50 ms", "sparse p99 ms", "dense p50 ms", "dense p99 ms",
                    "p50 ratio", "p99 ratio", "torch ops sparse → dense", "max abs diff"],
                   ([r.threads, r.graphs, f"{r.sparse_p50:.2f}", f"{r.sparse_p99:.2f}", f"{r.dense_p50:.2f}",
                     f"{r.dense_p99:.2f}", f"{r.sparse_p50 / r.dense_p50:.1f}×", f"{r.sparse_p99 / r.dense_p99:.1f}×",
                     f"{r.sparse_ops} → {r.dense_ops}", f"{r.max_abs_diff:.1e}"] for r in self.rows), "rrrrrrrrlr"),
        ]
        lines += ["", "Load average (`/proc/loadavg`): " + "; ".join(self.loadavg)]
        return "\n".join(lines)


def _frame(csv: Path | None, work: Path, rows: int) -> tuple[Any, str]:
    """Canonical rows: bank 0 of the ingested CSV, or the seeded generator's."""
    if csv is not None:
        from fedfraud.bench.detection import ingested
        from fedfraud.feature_store.layout import read_bank

        return read_bank(ingested(csv, work), 0).head(rows), f"`{csv.name}` (bank 0, first {rows:,} rows)"
    from fedfraud.training.data.config import GeneratorConfig
    from fedfraud.training.data.synthetic import generate_frame

    frame, _ = generate_frame(GeneratorConfig(banks=1, cardholders=300, days=30, seed=5))
    frame = frame.sort_values(["timestamp", "transaction_id"]).reset_index(drop=True)
    return frame.head(rows), f"the generator (seed 5, first {rows:,} rows)"


def count_torch_ops(fn: Any) -> int:
    """Torch ops one call dispatches (every op that reaches the dispatcher below autograd)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            Count.calls += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.calls


def run_encoder_bench(
    config: Any = None,
    sizes: tuple[int, ...] = (1, 4, 16, 128),
    calls: int = 300,
    threads: tuple[int, ...] = (1,),
    csv: Path | None = None,
    work: Path | None = None,
    rows: int = 20_000,
) -> EncoderBench:
    """Time ``embed_graphs`` on both paths for each thread count and batch size (see the module docstring)."""
    import tempfile

    import torch

    from fedfraud.config import FedfraudConfig
    from fedfraud.feature_store.egograph import build_snapshot_pairs
    from fedfraud.feature_store.privacy import PrivateFeaturizer
    from fedfraud.training.anomaly.model import AnomalyModel, embed_graphs

    cfg: FedfraudConfig = config or FedfraudConfig()
    work = work or Path(tempfile.mkdtemp(prefix="fedfraud-bench-encoder-"))
    frame, source = _frame(csv, work, rows)
    featurizer = PrivateFeaturizer(cfg.encoder, cfg.privacy, b"encoder-bench")
    graphs = [p.current for p in build_snapshot_pairs(frame, featurizer, cfg.egograph, min_transactions_per_month=0)]
    nodes = np.array([g.num_nodes for g in graphs])
    source += f": {len(graphs):,} graphs, nodes p50 {np.median(nodes):.0f} / max {nodes.max()}"
    torch.manual_seed(0)
    model = AnomalyModel(cfg.anomaly, cfg.encoder, cfg.egograph.max_nodes).eval()
    bench = EncoderBench(source, repr(model), calls, model.encoder.DENSE_MAX_GRAPHS,
                         loadavg=[f"before: {load_average()}"])
    rng = np.random.default_rng(0)
    before = torch.get_num_threads()
    model.encoder.DENSE_MAX_GRAPHS = max(sizes)  # time the dense path itself at every size, above its limit too
    try:
        for n_threads in threads:
            torch.set_num_threads(n_threads)
            for size in sizes:
                bench.rows.append(_cell(model, embed_graphs, graphs, size, calls, n_threads, rng))
                log.info("encoder bench %s", bench.rows[-1])
    finally:
        torch.set_num_threads(before)
        model.encoder.allow_dense = True
        del model.encoder.DENSE_MAX_GRAPHS
    bench.loadavg.append(f"after: {load_average()}")
    return bench


def _cell(model: Any, embed: Any, graphs: list[Any], size: int, calls: int, threads: int,
          rng: np.random.Generator) -> PathTiming:
    """One batch size: alternate sparse and dense calls on the same batches; ms percentiles and op counts."""
    batches = [[graphs[i] for i in rng.choice(len(graphs), size, replace=False)] for _ in range(calls)]
    times: dict[bool, list[float]] = {False: [], True: []}
    diff = 0.0
    for i, batch in enumerate([*batches[:10], *batches]):  # the first 10: warm-up, not timed
        out = {}
        for dense in (False, True) if i % 2 else (True, False):
            model.encoder.allow_dense = dense
            start = time.perf_counter()
            out[dense] = embed(model, batch)
            if i >= 10:
                times[dense].append((time.perf_counter() - start) * 1e3)
        diff = max(diff, float((out[True] - out[False]).abs().max()))
    ops = {}
    for dense in (False, True):
        model.encoder.allow_dense = dense
        ops[dense] = count_torch_ops(lambda: embed(model, batches[0]))
    model.encoder.allow_dense = True
    p = {d: np.percentile(times[d], [50, 99]) for d in times}
    (s50, s99), (d50, d99) = (map(float, p[False])), (map(float, p[True]))
    return PathTiming(threads, size, s50, s99, d50, d99, ops[False], ops[True], diff)

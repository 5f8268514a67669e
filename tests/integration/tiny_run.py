"""The one test-sized anomaly run of the integration suite: a tiny model and budget, 2 Ray CPUs.

Each test adds what it is about (pooling, rounds, DP, aggregation, an attack) to a copy of :data:`TINY_RUN`.
"""

from __future__ import annotations

from typing import Any

TINY_RUN: dict[str, Any] = {
    "pooling": "topk",
    "hidden": 32,
    "disc-hidden": 16,
    "encoder-dim": 32,
    "encoder-merchant-buckets": 512,
    "local-epochs": 2,
    "samples-per-epoch": 48,
    "batch-size": 24,
    "max-train-pairs": 200,
    "max-test-pairs": 40,
    "max-eval-normal": 60,
    "lr": 0.003,
    "client-cpus": 1.0,
    "ray-cpus": 2,
}

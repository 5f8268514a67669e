"""The files of a numpy-weighted fraud model (the GNN and FED-SPFD variants): weights in ``.npz``, the rest in JSON.

The weights are loaded with ``allow_pickle=False``, so nothing in a published version can run code; the JSON holds
the layout, the settings, the threshold, the provenance and the bank's category-transition table (what serving
computes ``mcc_transition_surprise`` with). One place for what both artifacts write and read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fedfraud.training.fraud.features import CategoryTransitions
from fedfraud.training.registry import ModelRegistry, ModelVersion

__all__ = ["load_files", "published", "save_files"]

_TABLE = "category_transitions"


def save_files(folder: Path, weights: str, meta_file: str, arrays: dict[str, np.ndarray], meta: dict[str, Any],
               transitions: CategoryTransitions | None) -> None:
    """Write ``arrays`` to ``folder/weights`` and ``meta`` (plus the transition table) to ``folder/meta_file``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / weights, **arrays)
    if transitions is not None:
        meta = {**meta, _TABLE: transitions.to_json()}
    (folder / meta_file).write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")


def load_files(folder: Path, weights: str, meta_file: str
               ) -> tuple[dict[str, np.ndarray], dict[str, Any], CategoryTransitions | None]:
    """The arrays, the metadata and the transition table (None: none saved) that :func:`save_files` wrote."""
    folder = Path(folder)
    meta = json.loads((folder / meta_file).read_text(encoding="utf-8"))
    with np.load(folder / weights, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    table = meta.pop(_TABLE, None)
    return arrays, meta, None if table is None else CategoryTransitions.from_json(table)


def published(registry: ModelRegistry | Path | str, kind: str, version: int | str, weights: str) -> ModelVersion:
    """The registry version of ``kind`` (its weights file checked present): what ``from_registry`` loads."""
    reg = registry if isinstance(registry, ModelRegistry) else ModelRegistry(registry)
    found = reg.get(kind, version)
    found.file(weights)
    return found

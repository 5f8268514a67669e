"""Graph pooling operators behind one signature, resolved by name (``pooling: asap`` in the config).

Learned operators (PyG): ``topk``, ``sag``, ``asap``, ``diffpool``. Non-learned
clustering baselines: ``{kmeans,agglo,spectral}-{max,avg}``. Each operator class
names itself (``class TopKPool(PyGSelectPooling, name="topk")``) and joins the
registry in :mod:`fedfraud.training.anomaly.pool.base` when its module is imported; every
module in this package is imported here, so a new operator is one class in one file.
"""

from __future__ import annotations

import importlib
import pkgutil

from fedfraud.training.anomaly.pool.base import GraphPooling, PoolResult, pooling_names, resolve_pooling

__all__ = ["GraphPooling", "PoolResult", "pooling_names", "resolve_pooling"]

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

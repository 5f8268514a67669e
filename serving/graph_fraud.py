"""Deciding with a GNN fraud model (``fraud.variant: fedavg-gnn | fedrpda``, kind ``fraud-gnn``) in the hot path.

The GNN reads a transaction's feature row *and* the k latest earlier transactions of its cardholder and of its
merchant (:mod:`fedfraud.training.fraud.gnn.online`). Serving keeps those neighbourhoods in the replica's KV
store, next to the fraud-feature state: table ``gnn_card`` by cardholder token, ``gnn_merchant`` by keyed
merchant. Per micro-batch: one read of each table for the batch's keys, the scorer restored from them, the
decisions (:meth:`OnlineGraphScorer.decide`, the code batch scoring runs), and the rows to write, which the hot
path writes with the fraud states in its one KV round trip.

With several replicas, cardholders are partitioned but merchants are not: two replicas deciding at one merchant
in the same instant each append to the neighbourhood they read, and the later write wins, so the merchant's
list misses one neighbour until it rolls over (k newer transactions). The cardholder relation is exact.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fedfraud.serving.kvstore import KVStore

if TYPE_CHECKING:
    from fedfraud.training.fraud.gnn.artifact import GnnFraudModel
    from fedfraud.training.fraud.gnn.online import OnlineGraphScorer
    from fedfraud.training.fraud.model import FraudDecision

__all__ = ["GNN_TABLES", "GNN_VARIANTS", "SPFD_VARIANTS", "GraphDecisions", "for_bank", "fraud_kind",
           "reads_neighbours"]

log = logging.getLogger(__name__)

#: KV tables of the neighbourhoods, in relation order (``card``, ``merchant``).
GNN_TABLES: tuple[str, ...] = ("gnn_card", "gnn_merchant")
#: ``fraud.variant`` values that decide with the GNN (registry kind ``fraud-gnn``).
GNN_VARIANTS: tuple[str, ...] = ("fedavg-gnn", "fedrpda")


#: ``fraud.variant`` values whose model is a per-bank FED-SPFD model (kind ``fraud-spfd``, issue 39): it reads
#: only its row, so it decides like XGBoost (``predict_batch``), never through the neighbourhoods below.
SPFD_VARIANTS: tuple[str, ...] = ("fed-spfd",)


def fraud_kind(variant: str) -> str:
    """The registry kind a replica deployed with ``fraud.variant`` decides with."""
    if variant in SPFD_VARIANTS:
        return "fraud-spfd"
    return "fraud-gnn" if variant in GNN_VARIANTS else "fraud"


def for_bank(loaded: tuple[Any, str], bank: int) -> tuple[Any, str]:
    """``loaded`` (a model and its tag) unless it is another bank's per-bank model: a FED-SPFD model holds one
    bank's private autoencoder and reads that bank's private columns, so only that bank's replicas decide with it.
    """
    model, tag = loaded
    owner = getattr(model, "bank", None)
    if owner is not None and int(owner) != int(bank):
        raise ValueError(f"{tag} is bank {owner}'s FED-SPFD model; this replica serves bank {bank} (serving.bank_id): "
                         f"follow a registry of bank {bank}'s versions or pin serving.fraud_version to one")
    return loaded


def reads_neighbours(model: Any) -> bool:
    """Whether ``model`` is a GNN fraud model (it needs its transactions' neighbourhoods, not only their rows)."""
    return getattr(model, "kind", None) == "fraud-gnn"


class GraphDecisions:
    """The GNN's decisions of micro-batches, with the neighbourhoods read from and written to ``kv``."""

    def __init__(self, kv: KVStore) -> None:
        self.kv = kv
        self._scorer: OnlineGraphScorer | None = None

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.kv!r})"

    def decide(self, model: GnnFraudModel, tag: str, rows: np.ndarray, cardholders: Sequence[str],
               merchants: Sequence[str], top_k: int, reasons_for: str
               ) -> tuple[list[FraudDecision], list[tuple[str, list[tuple[str, bytes]]]]]:
        """Decisions of ``rows`` (full feature rows in arrival order) and the KV rows that hold the new state."""
        scorer = self._scorer_for(model)
        keys = [list(dict.fromkeys(str(c) for c in cardholders)), list(dict.fromkeys(str(m) for m in merchants))]
        for relation, table in enumerate(GNN_TABLES):
            for key, blob in zip(keys[relation], self.kv.get_many(table, keys[relation]), strict=True):
                try:
                    scorer.restore(relation, key, blob, tag)
                except ValueError as exc:  # a damaged row costs that key its neighbours, never the batch
                    log.warning("corrupt_gnn_state table=%s reason=%s; rebuilt empty", table, exc)
        decisions = scorer.decide(rows, [str(c) for c in cardholders], [str(m) for m in merchants], top_k,
                                  reasons_for)
        writes = [(table, [(k, scorer.dump(relation, k, tag)) for k in keys[relation]])
                  for relation, table in enumerate(GNN_TABLES)]
        return decisions, writes

    def _scorer_for(self, model: GnnFraudModel) -> OnlineGraphScorer:
        """One scorer per model (its input groups are built once); emptied for each batch."""
        from fedfraud.training.fraud.gnn.online import OnlineGraphScorer

        if self._scorer is None or self._scorer.model is not model:
            self._scorer = OnlineGraphScorer(model)
        self._scorer.recent = [{} for _ in GNN_TABLES]
        return self._scorer

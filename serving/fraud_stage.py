"""The fraud stage: fraud features + the fraud model's decision per transaction (one instance per scorer replica).

The model is XGBoost (kind ``fraud``), or a GNN (kind ``fraud-gnn``) for a replica deployed with
``fraud.variant: fedavg-gnn | fedrpda``, which also reads its transactions' neighbourhoods
(:mod:`fedfraud.serving.graph_fraud`); both give the same decision record.

A plain class: the hot path (:mod:`fedfraud.serving.hotpath`) runs it, benchmarks and
tests call it. Per micro-batch, it takes the anomaly stage's
:class:`fedfraud.serving.scored.ScoredBatch`::

    fraud-feature state per cardholder (one batched KV read) + AS ──> XGBoost
    ──> ``anomaly-scores`` and ``fraud-decisions`` (score, decision, top reasons,
        both model versions), sent together and flushed once per micro-batch
    ──> states and decision rings (one batched KV write)

Sections are timed with :class:`fedfraud.serving.metrics.StageClock`.

Idempotence (at-least-once delivery means redelivery): the stage keeps the
last decisions per cardholder next to its fraud-feature state
(:func:`pack_fraud_state`) and re-emits a redelivered transaction's decision
identically (``redelivered: true``) instead of updating the fraud features
twice. Decisions are therefore *re-emitted, never suppressed*: a consumer sees
every transaction decided at least once, with identical content.

The fraud model is loaded with :func:`load_fraud_model`, and its feature
settings come from its registry config (:func:`fraud_config_for`), so the
feature row serving builds is the one the model was trained on. The states
build every feature (the previous-transaction columns included) and each model
reads its own ``input_names`` of that row, so a model trained before those
columns still decides, shadows and is swapped without a restart; the
category-transition surprise uses the model's own table (``model.transitions``).
"""

from __future__ import annotations

import logging
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from fedfraud.serving.graph_fraud import GraphDecisions, reads_neighbours
from fedfraud.serving.kafka import confirm_sent, json_bytes, json_value, now_us
from fedfraud.serving.kvstore import KVStore
from fedfraud.serving.metrics import StageClock
from fedfraud.serving.scored import ScoredBatch
from fedfraud.serving.side_work import guarded

if TYPE_CHECKING:
    from fedfraud.serving.kafka.producer import Producer
    from fedfraud.training.fraud.model import FraudModel
    from fedfraud.training.merchant_risk.config import MerchantRiskConfig
    from fedfraud.training.registry import ModelRegistry
    from fedfraud.training.retrain.drift import DriftMonitor

__all__ = [
    "Decided",
    "FraudStage",
    "fraud_config_for",
    "load_fraud_model",
    "merchant_risk_for",
    "pack_fraud_state",
    "reads_demographics",
    "unpack_fraud_state",
]

log = logging.getLogger(__name__)


@dataclass
class Decided:
    """One micro-batch's decisions before they are sent: records in row order (None: none for that row), the
    ``fraud`` KV rows to write first, and the challenger's shadow records.
    """

    records: list[dict[str, Any] | None]
    writes: list[tuple[str, bytes]]
    shadow: list[dict[str, Any]]
    #: Other KV tables' rows written in the same round trip (a GNN fraud model's neighbourhoods).
    tables: list[tuple[str, list[tuple[str, bytes]]]] = field(default_factory=list)

    def kv_writes(self) -> list[tuple[str, list[tuple[str, bytes]]]]:
        """Every KV row of the batch by table: the ``fraud`` states and decision rings first."""
        return [("fraud", self.writes), *self.tables]


def load_fraud_model(registry: ModelRegistry, version: str = "latest", kind: str = "fraud") -> tuple[Any, str]:
    """The fraud model of ``version`` and its registry tag: XGBoost (kind ``fraud``), a GNN (``fraud-gnn``) or a
    bank's FED-SPFD model (``fraud-spfd``), by :func:`fedfraud.serving.graph_fraud.fraud_kind`.
    """
    found = registry.get(kind, version)
    if kind == "fraud-spfd":  # FED-SPFD (issue 39): the serving bank's model, FraudModel's interface
        from fedfraud.training.fraud.spfd.artifact import SpfdFraudModel

        return SpfdFraudModel.from_registry(registry, str(found.version)), found.tag
    if kind == "fraud-gnn":
        from fedfraud.training.fraud.gnn.artifact import GnnFraudModel

        return GnnFraudModel.from_registry(registry, str(found.version)), found.tag
    from fedfraud.training.fraud.model import FraudModel

    return FraudModel.from_registry(registry, str(found.version)), found.tag


def fraud_config_for(version_config: dict[str, Any], fallback: Any) -> Any:
    """The FraudConfig the model was trained with (its registry config), else ``fallback``.

    A model trained before the previous-transaction features has no ``previous_transaction_features`` key:
    its feature row is built without them, so it still scores.
    """
    from pydantic import ValidationError

    from fedfraud.training.fraud.config import FraudConfig

    for candidate in (version_config.get("fraud"), version_config):
        if isinstance(candidate, dict):
            fields = {k: v for k, v in candidate.items() if k in FraudConfig.model_fields}
            if fields:
                fields.setdefault("previous_transaction_features", False)
            try:
                found = FraudConfig.model_validate(fields)
            except ValidationError:
                continue
            return found
    return fallback if fallback is not None else FraudConfig()


def merchant_risk_for(version_config: dict[str, Any]) -> MerchantRiskConfig | None:
    """The merchant-risk settings the model's merchant columns were computed with (its registry config), None for
    a model without merchant columns: the replica then reads no ``merchant_risk`` row.
    """
    from fedfraud.training.merchant_risk.config import MerchantRiskConfig

    raw = version_config.get("merchant_risk")
    return MerchantRiskConfig.model_validate(raw) if isinstance(raw, dict) else None


_LEN = struct.Struct("<I")


def pack_fraud_state(state_bytes: bytes, ring: list[dict[str, Any]]) -> bytes:
    """One KV value per cardholder: its fraud-feature state and its ring of recent decisions."""
    return _LEN.pack(len(state_bytes)) + state_bytes + json_bytes(ring)


def unpack_fraud_state(blob: bytes) -> tuple[bytes, list[dict[str, Any]]]:
    (n,) = _LEN.unpack_from(blob)
    return blob[_LEN.size : _LEN.size + n], json_value(blob[_LEN.size + n :])


class FraudStage:
    """Fraud features + XGBoost decision per transaction (one instance per fraud replica).

    With a producer it also emits the batch's ``anomaly-scores`` (``scores_topic``)
    next to the decisions (``topic``) and flushes both once: the gateway commits
    after :meth:`decide` returns, so both topics are covered by at-least-once.
    """

    def __init__(
        self,
        kv: KVStore,
        model: FraudModel,
        model_tag: str,
        fraud_cfg: Any,
        dim: int,
        ring: int,
        top_k: int = 3,
        producer: Producer | None = None,
        topic: str | None = None,
        scores_topic: str | None = None,
        clock: StageClock | None = None,
        reasons_for: str = "fraud",
        risk: MerchantRiskConfig | None = None,
    ) -> None:
        self.kv = kv
        self.graph = GraphDecisions(kv)  # a GNN fraud model's neighbourhoods (unused with XGBoost)
        self.risk = risk  # the merchant-risk columns the row ends with (None: the row has none)
        self.model = model
        self.model_tag = model_tag
        self.fraud_cfg = fraud_cfg
        # the states build every feature this code knows; each model reads its own columns of that row, so a
        # model trained before the previous-transaction features serves (and shadows, and swaps) next to a newer one
        self.row_cfg = fraud_cfg.model_copy(update={"previous_transaction_features": True})
        self.dim = dim
        self.ring = ring
        self.top_k = top_k
        self.reasons_for = reasons_for
        self.producer = producer
        self.topic = topic
        self.scores_topic = scores_topic
        self.clock = clock or StageClock()
        self._columns = self._columns_of(model)
        self._shadow_columns = self._columns
        self.shadow: tuple[FraudModel, str] | None = None  # the challenger fraud model while one shadows
        self.shadow_topic: str | None = None
        self.shadow_scored = 0  # transactions the challenger scored (for /metrics)
        self.shadow_agreed = 0  # ... of which its decision equalled the champion's
        self.drift: DriftMonitor | None = None  # PSI of inputs and score vs the champion's training reference

    def check_layout(self, model: FraudModel) -> None:
        """Raise unless ``model`` reads features this stage builds."""
        self._columns_of(model)

    def _columns_of(self, model: FraudModel) -> np.ndarray:
        """Where each of ``model.input_names`` sits in the row this stage builds (the model's own feature list)."""
        from fedfraud.training.fraud.features import feature_names

        names = self.row_names = (feature_names(self.row_cfg) + self._merchant_names() + _embedding_names(model)
                                  + _demographic_names(model))
        missing = [n for n in model.input_names if n not in names]
        if missing:
            raise ValueError(
                f"fraud model expects features {missing} that the serving config does not give (it gives {list(names)})"
            )
        return np.asarray([names.index(n) for n in model.input_names], dtype=np.int64)

    def _merchant_names(self) -> tuple[str, ...]:
        if self.risk is None:
            return ()
        from fedfraud.training.merchant_risk.features import merchant_names

        return merchant_names(self.risk)

    def swap(self, model: FraudModel, tag: str) -> None:
        """Use ``model`` from the next micro-batch on (callers swap between batches)."""
        columns = self._columns_of(model)
        self.model, self.model_tag, self._columns = model, tag, columns

    def set_shadow(self, shadow: tuple[FraudModel, str] | None) -> None:
        """Score every fresh transaction with this challenger too (None stops shadowing); it never decides.

        A GNN (champion or challenger) is not shadowed: its neighbourhoods would need a state of their own.
        """
        if shadow is not None and (reads_neighbours(shadow[0]) or reads_neighbours(self.model)):
            raise ValueError("shadowing is not supported with a GNN fraud model (fraud-gnn)")
        if shadow is not None:
            self._shadow_columns = self._columns_of(shadow[0])
        self.shadow = shadow
        self.shadow_scored = self.shadow_agreed = 0  # the counters are per challenger

    def decide(self, scored: ScoredBatch) -> Decided:
        """Decision records of ``scored`` (in its order) and the fraud states to write; nothing written or sent
        (:class:`fedfraud.serving.hotpath.HotPath` writes the batch's state once, then calls :meth:`emit`).
        """
        from fedfraud.training.fraud.features import FraudInput

        model, tag, columns, clock = self.model, self.model_tag, self._columns, self.clock
        with clock.section("fraud.state_read"):
            states, rings = self._read(list(dict.fromkeys(scored.cardholder)), scored.fraud_blobs)
        with clock.section("fraud.features"):
            records: list[dict[str, Any] | None] = [None] * len(scored)
            fresh_rows: list[int] = []
            features: list[np.ndarray] = []
            for i, tx in enumerate(scored.transaction_id):
                holder = scored.cardholder[i]
                previous = next((r for r in rings[holder] if r["transaction_id"] == tx), None)
                if previous is not None:
                    content = scored.content[i] if scored.content else None
                    if content is not None and previous.get("content", content) != content:
                        records[i] = {"transaction_id": tx, "cardholder": holder, "decision": "rejected",
                                      "reject_reason": "conflicting_duplicate"}
                    else:
                        records[i] = {**previous, "redelivered": True}
                    continue
                features.append(
                    states[holder].update(
                        FraudInput(
                            ts_us=scored.ts_us[i],
                            amount=scored.amount[i],
                            mcc=scored.mcc[i],
                            merchant=int(scored.merchant[i]),
                            location=scored.location[i],
                            time=scored.time[i],
                            anomaly_score=float(scored.anomaly_score[i]),
                        ),
                        model.transitions,  # the table the model was trained with (category-transition surprise)
                    )
                )
                fresh_rows.append(i)
        shadow_out: list[dict[str, Any]] = []
        tables: list[tuple[str, list[tuple[str, bytes]]]] = []
        if fresh_rows:
            full = np.stack(features)
            if self.risk is not None:  # the merchant's risk row, read with the states (training's columns)
                from fedfraud.training.merchant_risk.features import row_columns

                rows = scored.merchant_risk or [None] * len(scored)
                full = np.hstack([full, row_columns([rows[i] for i in fresh_rows], self.risk)])
            if scored.hin2vec is not None:  # G-HIN2Vec columns, as training's with_embeddings appends them
                full = np.hstack([full, scored.hin2vec[fresh_rows]])
            if _demographic_names(model):  # the bank's private demographics (FED-SPFD), the age at the transaction
                from fedfraud.feature_store.demographics import demographic_columns, stored_fields

                rows = scored.demographics or [None] * len(scored)
                full = np.hstack([full, demographic_columns([scored.ts_us[i] for i in fresh_rows],
                                                            stored_fields([rows[i] for i in fresh_rows]))])
            X = full[:, columns]  # the champion's own feature list
            with clock.section("fraud.model"):
                if reads_neighbours(model):  # a GNN: the rows and their cardholders' and merchants' past
                    decisions, tables = self.graph.decide(
                        model, tag, X, [scored.cardholder[i] for i in fresh_rows],
                        _merchant_keys(scored, fresh_rows), self.top_k, self.reasons_for)
                else:
                    decisions = model.predict_batch(X, top_k=self.top_k, reasons_for=self.reasons_for)
            with clock.section("fraud.records"):
                self._records(scored, fresh_rows, decisions, tag, rings, records)
            # monitoring and shadowing never fail a decision: an error costs this batch's figures, not its records
            if self.drift is not None:
                with clock.section("fraud.drift"):
                    guarded("drift", lambda: self.drift.observe(np.column_stack([X, [d.score for d in decisions]])))
            if self.shadow is not None:
                with clock.section("shadow.fraud"):
                    shadow_out = guarded("shadow", lambda: self._shadow_records(scored, fresh_rows, full, decisions,
                                                                                  tag)) or []
        touched = {scored.cardholder[i] for i in fresh_rows}
        writes = [(h, pack_fraud_state(states[h].to_bytes(), rings[h])) for h in touched]
        return Decided(records, writes, shadow_out, tables)

    def emit(self, scored: ScoredBatch, decided: Decided, sends: list[Any] | None = None) -> list[dict[str, Any]]:
        """Send the decisions with the anomaly scores (and shadow scores), once the batch's state is written.

        Without ``sends`` the records are acknowledged by the broker before
        this returns; with it the send futures are appended to ``sends`` for
        the caller to confirm before it commits (the consumer's async acks).
        """
        stamp = now_us()
        out = [{**_public(r), "decided_us": stamp} for r in decided.records if r is not None]
        futures = self._emit(scored, out, decided.shadow)
        if sends is None:
            with self.clock.section("kafka.flush"):
                if futures:
                    confirm_sent(self.producer, futures)
        else:
            sends += futures
        return out

    def _shadow_records(self, scored: ScoredBatch, rows: list[int], X: np.ndarray, decisions: Sequence[Any],
                        tag: str) -> list[dict[str, Any]]:
        """The challenger's score of each fresh row, with the champion's beside it (``shadow-scores`` records).

        ``X``: the full rows the stage built. The challenger reads its own columns of them, with its anomaly
        score in its ``anomaly_score`` column (the AS is the only model-made input) and the category-transition
        surprise from its own table.
        """
        from fedfraud.training.fraud.features import ANOMALY_FEATURE, with_transitions

        assert self.shadow is not None
        challenger, c_tag = self.shadow
        as_rows = scored.shadow_anomaly_score if scored.shadow_anomaly_score is not None else scored.anomaly_score
        a_tag = scored.shadow_anomaly_model or scored.anomaly_model
        Xs = X[:, self._shadow_columns]  # a copy
        if challenger.transitions != self.model.transitions:
            Xs = with_transitions(Xs, challenger.input_names, challenger.transitions)
        Xs[:, challenger.input_names.index(ANOMALY_FEATURE)] = np.asarray(as_rows, dtype=np.float32)[rows]
        c_scores = challenger.scores(Xs)
        out = []
        for k, i in enumerate(rows):
            c_fraud = bool(c_scores[k] >= challenger.threshold)
            self.shadow_agreed += int(c_fraud == bool(decisions[k].decision))
            out.append({
                "transaction_id": scored.transaction_id[i], "cardholder": scored.cardholder[i],
                "champion": {"fraud_model": tag, "anomaly_model": scored.anomaly_model,
                             "score": float(decisions[k].score), "anomaly_score": _finite(scored.anomaly_score[i])},
                "challenger": {"fraud_model": c_tag, "anomaly_model": a_tag, "score": float(c_scores[k]),
                               "anomaly_score": _finite(float(Xs[k, -1])), "decision": "fraud" if c_fraud else "legit"},
                "scored_us": now_us(),
            })
        self.shadow_scored += len(out)
        return out

    def _read(self, holders: list[str], prefetched: dict[str, bytes | None] | None = None
              ) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
        """Fraud-feature states and decision rings of ``holders`` (``prefetched`` blobs, one batched read of the
        rest; corrupt → empty).
        """
        from fedfraud.training.fraud.features import CorruptFraudStateError, FraudFeatureState

        blobs = dict(prefetched or {})
        missing = [h for h in holders if h not in blobs]
        if missing:
            blobs.update(zip(missing, self.kv.get_many("fraud", missing), strict=True))
        states: dict[str, FraudFeatureState] = {}
        rings: dict[str, list[dict[str, Any]]] = {}
        for holder in holders:
            blob = blobs[holder]
            state, ring = FraudFeatureState(self.row_cfg, self.dim), []
            if blob:
                raw, ring = unpack_fraud_state(blob)
                try:
                    state = FraudFeatureState.from_bytes(raw, self.row_cfg, self.dim)
                except CorruptFraudStateError as exc:
                    log.warning("corrupt_fraud_state cardholder=%s reason=%s; rebuilt empty", holder, exc)
            states[holder], rings[holder] = state, ring
        return states, rings

    def _records(self, scored: ScoredBatch, rows: list[int], decisions: Sequence[Any], tag: str,
                 rings: dict[str, list[dict[str, Any]]], records: list[dict[str, Any] | None]) -> None:
        """Decision records of the fresh ``rows`` into ``records``, remembered in the cardholders' rings."""
        for i, d in zip(rows, decisions, strict=True):
            a_s = float(scored.anomaly_score[i])
            record = {
                "transaction_id": scored.transaction_id[i],
                "cardholder": scored.cardholder[i],
                "score": d.score,
                "decision": "fraud" if d.decision else "legit",
                "anomaly_score": None if math.isnan(a_s) else a_s,
                "top_reasons": [
                    {"feature": r.feature, "value": _finite(r.value), "contribution": r.contribution}
                    for r in d.top_reasons
                ],
                "models": {"anomaly": scored.anomaly_model, "fraud": tag},
                "produced_us": int(scored.produced_us[i]),
                "redelivered": False,
            }
            ring = rings[scored.cardholder[i]]
            ring.append({**record, "content": scored.content[i]} if scored.content else record)
            del ring[: max(len(ring) - self.ring, 0)]
            records[i] = record

    def _emit(self, scored: ScoredBatch, records: list[dict[str, Any]],
              shadow: Sequence[dict[str, Any]] = ()) -> list[Any]:
        """Send the batch's anomaly scores, decisions and shadow scores; returns the send futures.

        At-least-once: the input offsets are committed only after every one of
        these futures is acknowledged (:func:`fedfraud.serving.kafka.confirm_sent`, or the
        consumer's :class:`fedfraud.serving.acks.AckWindow`; a ``flush``
        alone does not report failed sends). Rejected rows (``decision:
        rejected``) are the caller's to dead-letter, not decisions.
        """
        if self.producer is None or not len(scored):
            return []
        send = self.producer.send
        futures: list[Any] = []
        rejected = {i for i, r in enumerate(records) if r["decision"] == "rejected"}  # records align with rows
        with self.clock.section("kafka.produce"):
            if self.scores_topic is not None:
                for i, tx in enumerate(scored.transaction_id):
                    if i in rejected:
                        continue
                    value = {
                        "transaction_id": tx,
                        "cardholder": scored.cardholder[i],
                        "anomaly_score": float(scored.anomaly_score[i]),
                        "model": scored.anomaly_model,
                        "redelivered": bool(scored.redelivered[i]),
                        "scored_us": scored.scored_us,
                    }
                    futures.append(send(self.scores_topic, key=scored.cardholder[i].encode(), value=json_bytes(value)))
            if self.topic is not None:
                for r in records:
                    if r["decision"] != "rejected":
                        futures.append(send(self.topic, key=r["cardholder"].encode(), value=json_bytes(r)))
            if self.shadow_topic is not None:
                for r in shadow:
                    futures.append(send(self.shadow_topic, key=r["cardholder"].encode(), value=json_bytes(r)))
        return futures


def _merchant_keys(scored: ScoredBatch, rows: list[int]) -> list[str]:
    """The keyed merchant hash of each row (a GNN's merchant neighbourhood); the bucket if the batch has none."""
    from fedfraud.feature_store.cardholder import merchant_key

    keys = scored.merchant if scored.merchant_hash is None else scored.merchant_hash
    return [merchant_key(int(keys[i])) for i in rows]


def _public(record: dict[str, Any]) -> dict[str, Any]:
    """A ring entry without its private bookkeeping (the content hash stays in the bank's state)."""
    return {k: v for k, v in record.items() if k != "content"} if "content" in record else record


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def _demographic_names(model: Any) -> tuple[str, ...]:
    """The demographic columns that end the row when ``model`` reads them (a FED-SPFD model of a bank holding
    demographics, issue 39; the anomaly stage then reads ``ScoredBatch.demographics``), else none.
    """
    from fedfraud.feature_store.demographics import DEMOGRAPHIC_FEATURES

    return DEMOGRAPHIC_FEATURES if any(n in DEMOGRAPHIC_FEATURES for n in model.input_names) else ()


def reads_demographics(model: Any) -> bool:
    """Whether the replica must read each cardholder's ``cardholder_demographics`` row for ``model``."""
    return bool(_demographic_names(model))


def _embedding_names(model: Any) -> tuple[str, ...]:
    """The G-HIN2Vec columns that end the row (``ScoredBatch.hin2vec``, in training's ``with_embeddings`` order):
    as many as ``model`` reads, none for a model trained without ``--features +hin2vec``.
    """
    from fedfraud.training.embeddings.embed import embedding_dim_of, embedding_names

    return embedding_names(embedding_dim_of(model.input_names))

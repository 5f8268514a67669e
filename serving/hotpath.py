"""The scoring hot path of one replica, in one process: no actor hops between the stages.

    frame ──> AnomalyStage (serving/anomaly_stage.py: one batched read of the online store, one of the KV store
                            for both stages, ego-graph updates, one GNN forward)
          ──> ScoredBatch  (serving/scored.py)
          ──> FraudStage   (serving/fraud_stage.py: fraud features, XGBoost, decisions)
          ──> one KV write (score rings, fraud states, decision rings), one online-store push
          ──> FraudStage.emit (decisions + anomaly scores produced and confirmed)

The Kafka consumer thread (:mod:`fedfraud.serving.consumer`) and ``POST /score`` both
call :meth:`HotPath.score`; a lock makes them take turns, so one cardholder's
transactions are applied in arrival order within the replica (Kafka keys a
cardholder to one partition, hence to one replica). Models are swapped
between micro-batches by :meth:`HotPath.watch_registry`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedfraud.serving.follow import moved
from fedfraud.serving.metrics import StageClock

if TYPE_CHECKING:
    from fedfraud.serving.anomaly_stage import GraphScorer
    from fedfraud.serving.config import ScorerConfig
    from fedfraud.training.embeddings.publish import Hin2VecModel
    from fedfraud.training.fraud.model import FraudModel

__all__ = ["HotPath"]

log = logging.getLogger(__name__)


class HotPath:
    """Anomaly + fraud stages of one replica, with their model versions and state stores."""

    def __init__(self, cfg: ScorerConfig, bootstrap_servers: str | None, anomaly_loader: str) -> None:
        from fedfraud.feature_store.online import OnlineStateClient
        from fedfraud.feature_store.privacy import PrivateFeaturizer
        from fedfraud.serving.anomaly_stage import AnomalyStage
        from fedfraud.serving.fraud_stage import FraudStage, fraud_config_for, load_fraud_model, merchant_risk_for
        from fedfraud.serving.graph_fraud import for_bank, fraud_kind
        from fedfraud.serving.kafka import make_producer
        from fedfraud.serving.kvstore import open_kv
        from fedfraud.training.registry import ModelRegistry

        s = cfg.serving
        self.serving = s
        self.registry = ModelRegistry(s.registry_root)
        loader: Callable[[ModelRegistry, str], GraphScorer] = _resolve(anomaly_loader)
        self._load_anomaly: Callable[[str], GraphScorer] = lambda v: loader(self.registry, v)
        self.fraud_kind = fraud_kind(cfg.fraud.variant)  # XGBoost ("fraud"), a GNN ("fraud-gnn"), FED-SPFD
        self._load_fraud: Callable[[str], tuple[FraudModel, str]] = lambda v: for_bank(
            load_fraud_model(self.registry, v, self.fraud_kind), s.bank_id)
        self.clock = StageClock()
        self.privacy = cfg.privacy
        kv = open_kv(s.fraud_state_path, Path(cfg.features.repo_dir), s.fraud_state_password_env,
                     s.fraud_state_ca_file)
        client = OnlineStateClient.open(cfg.features, cfg.egograph)
        featurizer = PrivateFeaturizer.for_bank(cfg.encoder, cfg.privacy, s.bank_id)
        anomaly_model = self._load_anomaly(s.anomaly_version)
        self._check_features("anomaly", anomaly_model.tag)
        model, tag = self._load_fraud(s.fraud_version)
        self._check_features("fraud", tag)
        trained = self.registry.get_ref(tag).config
        fraud_cfg = fraud_config_for(trained, cfg.fraud)
        risk = merchant_risk_for(trained)
        self.anomaly = AnomalyStage(client, featurizer, kv, anomaly_model, s.bank_id,
                                    cfg.features.location_cell_deg, cfg.egograph.dedupe_ring, self.clock,
                                    max_nodes=s.max_nodes_per_batch, risk_buckets=risk.buckets if risk else 0)
        producer = (make_producer(bootstrap_servers, s.producer, client_id="fedfraud-scorer", security=s.kafka_security)
                    if bootstrap_servers else None)
        self.fraud = FraudStage(kv, model, tag, fraud_cfg, cfg.encoder.dim, s.decision_ring,
                                getattr(fraud_cfg, "top_reasons", 3), producer, s.topics.decisions,
                                s.topics.anomaly_scores, self.clock, s.reasons_for, risk)
        self.fraud.shadow_topic = s.topics.shadow_scores if producer is not None else None
        self.anomaly_on = s.anomaly_stage
        if not self.anomaly_on:  # the GNN-off peer of the serving bench: no anomaly-scores records to send
            if risk is not None:
                raise ValueError("serving.anomaly_stage=false reads no online store, so it cannot serve a fraud "
                                 f"model with merchant-risk columns ({tag})")
            self.fraud.scores_topic = None
            log.warning("anomaly stage switched off (serving.anomaly_stage=false): no graph, no GNN, NaN anomaly "
                        "score")
        self.retrain = cfg.retrain
        self.fraud.drift = self._drift_monitor(tag)
        self.encoder_dim = cfg.encoder.dim
        self.anomaly.hin2vec = self._load_hin2vec(trained)  # None (no cost) unless the fraud model reads hin2vec
        self.anomaly.demographics = self._reads_demographics(model, tag)
        self._shadow_tags: tuple[str, str] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        log.info("hot path ready anomaly=%s fraud=%s", self.anomaly.model.tag, tag)

    def score(self, frame: Any, produced_us: np.ndarray, content: list[str] | None = None,
              source: str = "kafka", sends: list[Any] | None = None) -> list[dict[str, Any]]:
        """One record per row of ``frame`` (event-time ordered, validated), produced.

        Confirmed by the broker before returning, unless ``sends`` is given: then
        the send futures are appended to it for the caller to confirm before it
        commits (:class:`fedfraud.serving.acks.AckWindow`).
        """
        with self._lock:
            if not self.anomaly_on:
                return self._score_without_anomaly(frame, produced_us, content, source, sends)
            work, scored = self.anomaly.score(frame, produced_us, source)
            scored.content = list(content or [])
            decided = self.fraud.decide(scored)
            # the batch's state, written once: both stages' KV rows in one round trip, then the online-store push
            self.anomaly.write(work, also=decided.kv_writes())
            return self.fraud.emit(scored, decided, sends)

    def _score_without_anomaly(self, frame: Any, produced_us: np.ndarray, content: list[str] | None, source: str,
                               sends: list[Any] | None) -> list[dict[str, Any]]:
        """:meth:`score` with the anomaly stage off: fraud stage on a NaN anomaly score, its KV rows written once."""
        scored = self.anomaly.skip(frame, produced_us, source)
        scored.content = list(content or [])
        decided = self.fraud.decide(scored)
        with self.clock.section("state.kv_write"):
            self.anomaly.kv.put_tables(decided.kv_writes())
        return self.fraud.emit(scored, decided, sends)

    def _reads_demographics(self, model: Any, tag: str) -> bool:
        """Whether the replica reads the ``cardholder_demographics`` row with each state, for ``model``."""
        from fedfraud.serving.fraud_stage import reads_demographics

        if not reads_demographics(model):
            return False
        if not self.anomaly_on:
            raise ValueError("serving.anomaly_stage=false reads no online store, so it cannot serve a fraud model "
                             f"with demographic columns ({tag})")
        return True

    def _load_hin2vec(self, trained: dict[str, Any]) -> Hin2VecModel | None:
        """The G-HIN2Vec encoder a fraud model's columns come from (the exact version its registry config pins),
        None for a model without them.
        """
        from fedfraud.training.embeddings.features import pinned_hin2vec

        h2v = pinned_hin2vec(self.registry.root, trained, self.encoder_dim)
        if h2v is None:
            return None
        if not self.anomaly_on:
            raise ValueError("serving.anomaly_stage=false keeps no ego graph, so it cannot serve a fraud model with "
                             f"hin2vec columns ({h2v.tag})")
        self._check_features("hin2vec", h2v.tag)
        log.info("hin2vec columns from %s (dim %d)", h2v.tag, h2v.cfg.dim)
        return h2v

    def _check_features(self, kind: str, tag: str) -> None:
        """The model's card must name this replica's feature mechanism (L′/T′ differ between them)."""
        from fedfraud.feature_store.privacy import check_feature_mechanism
        from fedfraud.training.registry import ModelRef

        ref = ModelRef.maybe(tag)
        if ref is not None:  # a registry model (a custom anomaly loader may serve something else)
            check_feature_mechanism(tag, self.registry.get_ref(ref).privacy, self.privacy)

    def ready(self) -> None:
        """One read of each state store (Feast online store, scores/decisions KV); raises if one is down."""
        self.anomaly.client.read_states(["__readyz__"])
        self.anomaly.kv.get_many("scores", ["__readyz__"])

    def models(self) -> dict[str, str]:
        """The tags in use: the champion pair, and the challenger pair while one shadows."""
        from fedfraud.serving.anomaly_stage import OFF_TAG

        out = {"anomaly": self.anomaly.model.tag if self.anomaly_on else OFF_TAG, "fraud": self.fraud.model_tag}
        if self._shadow_tags is not None:
            out["challenger_anomaly"], out["challenger_fraud"] = self._shadow_tags
        return out

    def loop_figures(self) -> Any:
        """Drift PSI and shadow counts for ``/metrics`` (:class:`fedfraud.serving.metrics.LoopFigures`)."""
        from fedfraud.serving.metrics import LoopFigures
        from fedfraud.serving.side_work import SIDE_ERRORS

        drift, f = self.fraud.drift, self.fraud
        return LoopFigures(drift.psi() if drift else {}, drift.rows if drift else 0, f.shadow_scored,
                           f.shadow_agreed, f.shadow[1] if f.shadow else None, dict(SIDE_ERRORS))

    def _drift_monitor(self, fraud_tag: str) -> Any:
        """A fresh drift window against the training reference of ``fraud_tag`` (None if it has none)."""
        import json

        from fedfraud.training.retrain.drift import DRIFT_FILE, DriftMonitor, DriftReference

        path = self.registry.get_ref(fraud_tag).path / DRIFT_FILE
        if not path.exists():
            log.info("fraud model %s has no drift reference; drift gauges stay empty", fraud_tag)
            return None
        reference = DriftReference.from_json(json.loads(path.read_text(encoding="utf-8")))
        r = self.retrain
        return DriftMonitor(reference, r.drift_window_rows, r.drift_min_rows)

    # ------------------------------------------------------------------ hot swap
    def watch_registry(self, poll_s: float) -> None:
        """Follow ``champion`` (or ``latest``) in a background thread: a promotion or a rollback is swapped in
        between micro-batches. Pinned versions (``v3``) are left alone.
        """
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, args=(poll_s,), name="fedfraud-registry",
                                             daemon=True)
            self._watcher.start()

    def _watch(self, poll_s: float) -> None:
        while not self._stop.wait(poll_s):
            self._follow_champions()
            self._maybe_shadow()

    def _follow_champions(self) -> None:
        """Swap in what the followed names (``champion`` or ``latest``) point at, both kinds in one critical
        section: a promotion moves the anomaly and fraud models together, so no micro-batch pairs the new GNN with
        the old fraud model. Loading happens outside the lock; if either load fails, the old pair stays.
        """
        s = self.serving
        current = {"anomaly": self.anomaly.model.tag, "fraud": self.fraud.model_tag}
        follow = {"anomaly": s.anomaly_version, "fraud": s.fraud_version}
        try:
            changed = moved(self.registry, follow, current, {"fraud": self.fraud_kind})
            if not changed:
                return
            loaded: dict[str, Any] = {}
            if "anomaly" in changed:
                loaded["anomaly"] = self._load_anomaly(str(changed["anomaly"].version))
                self._check_features("anomaly", loaded["anomaly"].tag)
            if "fraud" in changed:
                model, tag = self._load_fraud(str(changed["fraud"].version))
                self._check_features("fraud", tag)
                self.fraud.check_layout(model)
                loaded["fraud"] = (model, tag, self._drift_monitor(tag))
                loaded["hin2vec"] = self._load_hin2vec(self.registry.get_ref(tag).config)  # swapped with it
                loaded["demographics"] = self._reads_demographics(model, tag)
        except Exception:  # keep serving the old pair if a new model cannot be read
            log.exception("reload failed; keeping %s", current)
            return
        with self._lock:
            if "anomaly" in loaded:
                self.anomaly.model = loaded["anomaly"]
            if "fraud" in loaded:
                model, tag, drift = loaded["fraud"]
                self.fraud.swap(model, tag)
                self.fraud.drift = drift
                self.anomaly.hin2vec = loaded["hin2vec"]
                self.anomaly.demographics = loaded["demographics"]
        for kind, target in changed.items():
            log.info("hot_swap kind=%s from=%s to=%s (%s)", kind, current[kind], target.tag, follow[kind])

    def _maybe_shadow(self) -> None:
        """Shadow with the registry's ``challenger`` pair while it has one (a kind without a challenger shadows
        with its champion); stop when it is promoted or retired. Both models are loaded and checked before
        either is installed, so a bad challenger leaves the previous shadow state whole.
        """
        if self.fraud_kind != "fraud":  # a GNN or FED-SPFD fraud model is not shadowed (FraudStage.set_shadow)
            return
        try:
            aliases = {k: self.registry.aliases(k).get("challenger") for k in ("anomaly", "fraud")}
            if all(v is None for v in aliases.values()):
                if self._shadow_tags is not None:
                    with self._lock:
                        self.anomaly.shadow, self._shadow_tags = None, None
                        self.anomaly.shadow_fresh.clear()
                        self.fraud.set_shadow(None)
                    log.info("shadow stopped (no challenger)")
                return
            a = self.registry.get("anomaly", aliases["anomaly"]) if aliases["anomaly"] else None
            f = self.registry.get("fraud", aliases["fraud"]) if aliases["fraud"] else None
            tags = (a.tag if a else self.anomaly.model.tag, f.tag if f else self.fraud.model_tag)
            if tags == self._shadow_tags:
                return
            a_model = self._load_anomaly(str(a.version)) if a else None
            f_model = self._load_fraud(str(f.version)) if f else (self.fraud.model, self.fraud.model_tag)
            for kind, found in (("anomaly", a), ("fraud", f)):
                if found is not None:
                    self._check_features(kind, found.tag)
            self.fraud.check_layout(f_model[0])
            if f is not None and _hin2vec_tag(self.registry, f.config) != _hin2vec_tag(
                    self.registry, self.registry.get_ref(self.fraud.model_tag).config):
                raise ValueError(f"{f.tag} reads another hin2vec encoder than the champion's: its columns are not "
                                 "computed")
        except Exception:  # a challenger that cannot be read never stops the champion
            log.exception("challenger could not be loaded; shadow state unchanged")
            return
        with self._lock:
            self.anomaly.shadow = a_model
            self.anomaly.shadow_fresh.clear()  # the previous challenger's q_t
            self.fraud.set_shadow(f_model)
            self._shadow_tags = tags
        log.info("shadow started anomaly=%s fraud=%s", *tags)

    def close(self) -> None:
        self._stop.set()
        if self.fraud.producer is not None:
            self.fraud.producer.close(timeout=5)


def _hin2vec_tag(registry: Any, trained: dict[str, Any]) -> str | None:
    """The tag of the hin2vec encoder a fraud model's registry config pins (None: the model reads none)."""
    from fedfraud.training.embeddings.features import hin2vec_version_for

    version = hin2vec_version_for(trained)
    return None if version is None else str(registry.get("hin2vec", version).tag)


def _resolve(path: str) -> Any:
    """``module:function`` → the function (where the anomaly-loader seam resolves)."""
    import importlib

    module, _, name = path.partition(":")
    if not module or not name:
        raise ValueError(f"loader {path!r} must look like module:function")
    return getattr(importlib.import_module(module), name)

"""Typed configuration of the streaming scorer (``serving:`` section of ``fedfraud.yaml``).

Kafka client settings live here, each with the reason it has its value, because
they decide the delivery guarantees (``infra/kafka.md`` has the long version).
:class:`ScorerConfig` is the scorer deployment's own typed slice of the whole
config: what the builder binds, so a replica receives nothing it does not read.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedfraud.core.errors import UserError
from fedfraud.feature_store.config import EgoGraphConfig, EncoderConfig, PrivacyConfig
from fedfraud.feature_store.store_config import FeatureStoreConfig
from fedfraud.training.fraud.config import FraudConfig
from fedfraud.training.retrain.config import RetrainConfig

__all__ = ["AuthSettings", "ConsumerSettings", "GuardSettings", "KafkaSecurity", "ProducerSettings", "ScorerConfig",
           "ServingConfig", "TopicNames"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TopicNames(_Section):
    """The topics of the pipeline (DESIGN §2) and of the retraining loop (issue 13)."""

    transactions: str = "transactions"
    anomaly_scores: str = "anomaly-scores"
    decisions: str = "fraud-decisions"
    dlq: str = "transactions-dlq"
    shadow_scores: str = Field("shadow-scores", description="challenger scores while a challenger shadows")
    labels: str = Field("fraud-labels", description="confirmed outcomes keyed by transaction id, days late")
    labels_dlq: str = Field("fraud-labels-dlq", description="label messages that are not valid labels")

    def all(self) -> tuple[str, ...]:
        return (self.transactions, self.anomaly_scores, self.decisions, self.dlq, self.shadow_scores, self.labels,
                self.labels_dlq)


class ConsumerSettings(_Section):
    """Consumer settings of the ingress (librdkafka), chosen by measurement (see ``infra/kafka.md``).

    Group membership (``assignment: group``) lets ingress replicas share
    partitions and take over from a dead one. Measured against the embedded
    Tansu broker, a JoinGroup answers only after about half the member's session
    timeout, so a short ``session_timeout_ms`` keeps start-up to ~3 s and the
    ``request_timeout_ms`` must exceed it (the defaults, 45 s session vs 30 s
    request, time out and loop). A long ``max_poll_interval_ms`` is safe because
    the ingress keeps polling (with partitions paused) while it waits for a
    restarting scorer. ``manual`` assigns every partition to this consumer
    without a group protocol: no join at all, for a single ingress.
    """

    group_id: str = "fedfraud-scorer"
    assignment: str = Field("group", pattern="^(group|manual)$")
    session_timeout_ms: int = Field(6000, ge=1000)
    heartbeat_interval_ms: int = Field(2000, ge=100)
    max_poll_interval_ms: int = Field(30_000, ge=1000)
    request_timeout_ms: int = Field(30_000, ge=1000)
    max_poll_records: int = Field(
        500, ge=1, description="N: a micro-batch closes at this many transactions (a sweep in docs/benchmarks.md)"
    )
    max_batch_wait_ms: int = Field(
        2, ge=0, description="T: ... or when its first transaction has waited this long (0: whatever one poll "
        "gives; a sweep in docs/benchmarks.md)"
    )
    fetch_max_wait_ms: int = Field(5, ge=0, description="broker waits this long for fetch_min_bytes: latency knob")
    auto_offset_reset: str = Field("earliest", pattern="^(earliest|latest)$")
    max_unacked_batches: int = Field(
        8, ge=0, description="micro-batches whose produced decisions may await broker acks while the next ones are "
        "scored (0: wait for every batch's acks before the next, as a synchronous flush)",
    )
    commit_interval_ms: int = Field(
        50, ge=0, description="commit acknowledged offsets at most this often (and always before a rebalance/stop)"
    )

    @model_validator(mode="after")
    def _timeouts(self) -> ConsumerSettings:
        if self.request_timeout_ms <= self.session_timeout_ms:
            raise ValueError("request_timeout_ms must exceed session_timeout_ms (a JoinGroup can take that long)")
        if self.heartbeat_interval_ms * 3 > self.session_timeout_ms:
            raise ValueError("heartbeat_interval_ms must be at most a third of session_timeout_ms")
        return self


class ProducerSettings(_Section):
    """Producer settings: durable (acks=all, idempotent) and batched for throughput."""

    acks: str = Field("all", pattern="^(all|0|1)$")
    enable_idempotence: bool = True
    linger_ms: int = Field(2, ge=0, description="wait this long to fill a batch; bounded latency cost")
    batch_size: int = Field(64 * 1024, ge=1024)
    compression_type: str | None = Field(None, description="none on loopback; lz4/zstd on a real network")
    delivery_timeout_ms: int = Field(
        30_000, ge=1000, description="a record not acknowledged by then fails (librdkafka message.timeout.ms); the "
        "consumer then stops uncommitted and the batch is redelivered")
    max_request_size: int = Field(1 << 20, ge=1024, description="largest record the producer will send")


class GuardSettings(_Section):
    """Limits that keep one bad message or one bad minute from stopping the stream (issue 14)."""

    max_message_bytes: int = Field(1 << 20, ge=1024, description="larger Kafka values are dead-lettered unparsed")
    dlq_payload_bytes: int = Field(
        64 << 10, ge=0, description="masked payload bytes a DLQ record keeps with dlq_raw_capture; the rest is cut "
        "(raw_bytes keeps the size)"
    )
    dlq_raw_capture: bool = Field(
        False, description="opt-in: DLQ records also keep the payload (card numbers masked, base64, up to "
        "dlq_payload_bytes), never for card_number_in_clear/untokenized_card rejects; the DLQ topics keep records "
        "30 days and raw payloads (extra fields, exact coordinates) put them in PCI DSS scope, so turn on only while "
        "debugging a producer"
    )
    max_future_s: float | None = Field(86_400.0, ge=0, description="reject timestamps this far ahead of now")
    max_age_days: float | None = Field(
        None, ge=0, description="reject timestamps older than this; None for replays of historical data"
    )
    stage_max_attempts: int = Field(3, ge=1, description="tries of one micro-batch before it is bisected")
    retry_backoff_s: float = Field(0.2, ge=0, description="first wait between tries; doubles up to 2 s")
    retry_budget_s: float = Field(30.0, gt=0, description="health turns red when a batch has retried this long")
    stall_s: float = Field(30.0, gt=0, description="health turns red after this long with lag and no commit")
    http_max_body_bytes: int = Field(1 << 20, ge=1024, description="POST bodies larger than this get 413")
    http_max_batch: int = Field(1000, ge=1, description="most transactions in one POST /score")


class KafkaSecurity(_Section):
    """How every Kafka client of the project authenticates and encrypts (Kafka's ``security.protocol``).

    One section for all clients (scorer, DLQ, label joiner, replay, admin), so
    no client can be left on plaintext by accident. The SASL password is never
    in the file: it is read from the environment variable named by
    ``sasl_password_env`` when a client is made, and a missing one stops the
    command with a one-line error naming the variable. PLAINTEXT is only for
    the embedded broker and loopback tests.
    """

    security_protocol: str = Field("PLAINTEXT", pattern="^(PLAINTEXT|SSL|SASL_PLAINTEXT|SASL_SSL)$")
    sasl_mechanism: str | None = Field(None, pattern="^(PLAIN|SCRAM-SHA-256|SCRAM-SHA-512)$")
    sasl_username: str | None = None
    sasl_password_env: str = Field("FEDFRAUD_KAFKA_PASSWORD", min_length=1)
    ssl_cafile: str | None = Field(None, description="CA bundle that signed the brokers' certificates")
    ssl_certfile: str | None = Field(None, description="client certificate (mutual TLS)")
    ssl_keyfile: str | None = Field(None, description="client private key (mutual TLS)")

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSecurity:
        sasl = self.security_protocol.startswith("SASL_")
        if sasl and (self.sasl_mechanism is None or not self.sasl_username):
            raise ValueError(f"security_protocol {self.security_protocol} needs sasl_mechanism and sasl_username")
        if not sasl and (self.sasl_mechanism or self.sasl_username):
            raise ValueError(f"sasl_* settings need a SASL_ security_protocol, not {self.security_protocol}")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("ssl_certfile and ssl_keyfile go together (mutual TLS)")
        return self

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    def _password(self) -> str:
        password = os.environ.get(self.sasl_password_env)
        if not password:
            raise UserError(f"Kafka SASL needs the password in ${self.sasl_password_env}")
        return password

    def librdkafka(self) -> dict[str, Any]:
        """The settings as librdkafka properties: the one mapping, for every client (``confluent-kafka``'s
        producer, consumers and ``AdminClient``).
        """
        out: dict[str, Any] = {"security.protocol": self.security_protocol.lower()}
        if self.uses_sasl:
            out.update({"sasl.mechanism": self.sasl_mechanism, "sasl.username": self.sasl_username,
                        "sasl.password": self._password()})
        if self.uses_tls:
            out.update({k: v for k, v in (("ssl.ca.location", self.ssl_cafile),
                                          ("ssl.certificate.location", self.ssl_certfile),
                                          ("ssl.key.location", self.ssl_keyfile)) if v})
        return out


class AuthSettings(_Section):
    """Bearer-token authentication of ``/score``, ``/tokenize``, ``/detokenize`` and ``/metrics`` (issue 17).

    The token is read by each replica when it starts: from ``token_file`` when
    one is named (a mounted Kubernetes Secret, so rotating it is a rollout, not
    a config change), else from ``$FEDFRAUD_API_TOKEN``. It is never in the
    config, and never in the Serve deployment's arguments, which Ray keeps in
    its control store and shows on its dashboard. ``/healthz`` and ``/readyz``
    stay open for the kubelet and the load balancer.
    """

    token_file: str | None = Field(
        None, description="file holding the API token (a mounted Secret); None: $FEDFRAUD_API_TOKEN")
    disabled: bool = Field(
        False, description="local development only: no authentication at all (`fedfraud serve --insecure-no-auth`); "
        "every replica logs a warning")


class ServingConfig(_Section):
    """Streaming scoring: Kafka, micro-batching, Ray Serve and hot-swap knobs."""

    bootstrap_servers: str | None = Field(
        None, description="Kafka bootstrap servers; None starts the embedded Tansu broker"
    )
    topics: TopicNames = Field(default_factory=TopicNames)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    kafka_security: KafkaSecurity = Field(default_factory=KafkaSecurity)
    guards: GuardSettings = Field(default_factory=GuardSettings)
    partitions: int = Field(4, ge=1, description="partitions of the topics the embedded broker creates")
    consumer: ConsumerSettings = Field(default_factory=ConsumerSettings)
    producer: ProducerSettings = Field(default_factory=ProducerSettings)
    registry_root: str = Field("out/registry", description="model registry folder")
    anomaly_version: str = Field(
        "champion", description="'champion' follows promotions (newest version until one is promoted); "
        "'latest' follows every new version; 'v3' pins one")
    fraud_version: str = Field(
        "champion", description="'champion' follows promotions (newest version until one is promoted); "
        "'latest' follows every new version; 'v3' pins one")
    bank_id: int = Field(0, ge=0, description="whose secret pseudonymizes and noises (one bank per deployment)")
    registry_poll_s: float = Field(2.0, gt=0, description="how often the scorer looks for a newer model")
    max_nodes_per_batch: int = Field(
        8192, ge=32, description="graph nodes of one GNN forward; a larger micro-batch is embedded in runs"
    )
    scorer_replicas: int = Field(
        1, ge=1, description="StreamScorer replicas, each one consumer of the group (useful up to `partitions`)"
    )
    fraud_state_path: str = Field(
        "data/fraud_state.db",
        description="SQLite file (relative to the feature repo) for the fraud-feature state and recent decisions; "
        "redis:// (rediss:// for TLS) URL for production, without credentials",
    )
    fraud_state_password_env: str = Field(
        "FEDFRAUD_REDIS_PASSWORD", min_length=1,
        description="environment variable holding the password of the fraud_state_path Redis (unset: no AUTH)")
    fraud_state_ca_file: str | None = Field(
        None, description="CA bundle that signed the fraud_state_path Redis's certificate (rediss:// only)")
    decision_ring: int = Field(16, ge=1, description="recent decisions kept per cardholder to re-emit on redelivery")
    anomaly_stage: bool = Field(
        True, description="False: skip the anomaly stage (no online-store read or push, no ego graph, no GNN) and "
        "decide with the anomaly score absent (NaN, XGBoost's missing value, as for a cardholder's first "
        "transaction); the GNN-off peer of `fedfraud bench serving --peers`, not a production mode")
    reasons_for: Literal["fraud", "all"] = Field(
        "fraud", description="decisions that carry top_reasons: 'fraud' (the declines; a legit decision gets []) or "
        "'all'. Exact TreeSHAP of the 200-tree model costs ~0.2 ms per row, more than the rest of the fraud stage")
    gc_threshold: int = Field(
        50_000,
        ge=0,
        description="generation-0 GC threshold of the serving replicas (0: Python's default 700). The replicas keep "
        "large long-lived caches (L'/T' rows, fresh q_t, Feast protos) that every full collection walks; with "
        "gc.freeze() after start-up and this threshold the scorer used ~30% less CPU per transaction",
    )
    replica_niceness: int = Field(
        0, ge=0, le=19,
        description="niceness the StreamScorer replicas' worker processes add to the Ray node's (Ray's "
        "RAY_worker_niceness, set per actor; 0 when the node runs at normal priority). Ray starts workers at 15 so "
        "that its own daemons win the CPU; for the real-time replicas that default lets any process at normal "
        "priority (a co-located broker, a batch job, the load generator) take the CPU from scoring. 0 is what "
        "Ray's job supervisor uses for itself; a negative value would need CAP_SYS_NICE and is not offered",
    )
    http_host: str = Field(
        "127.0.0.1", min_length=1,
        description="address of the documented HTTP port (/score, /healthz, /readyz, /metrics, /tokenizer): Serve's "
        "proxy binds it, or with direct_ingress the front (serving/front.py). Loopback by default; a node address "
        "or 0.0.0.0 exposes it, and then authentication cannot be disabled")
    http_port: int = Field(8000, ge=0, le=65535, description="the documented HTTP port (docs/serving.md)")
    http_request_timeout_s: float = Field(
        30.0, gt=0, le=3600,
        description="Serve's end-to-end limit of one HTTP request at the proxy (HTTPOptions.request_timeout_s; 408 "
        "past it), so a slow or stuck request cannot hold a replica slot for ever")
    direct_ingress: bool = Field(
        False, description="Ray Serve's direct ingress (alpha in Ray 2.55): each replica also answers HTTP on a port "
        "of its own (30000-30999 by default, bound to loopback, the same routes and bearer token), and a front in "
        "the process that starts the runtime (serving/front.py) holds http_host:http_port and forwards each "
        "connection to a replica's port, so a `POST /score` on the documented port skips Serve's proxy and its hop "
        "to the replica; Serve's proxy moves to internal_proxy_port on loopback. Takes effect when fedfraud starts "
        "Ray itself (the flag must be in the raylet's environment; on a cluster, set it where `ray start` runs)",
    )
    internal_proxy_port: int | None = Field(
        None, ge=1, le=65535,
        description="with direct_ingress: the loopback port Serve's own proxy moves to (the front's fallback, and "
        "the door of /tokenizer); None: a free port chosen at start and logged")
    front_refresh_s: float = Field(
        1.0, gt=0, le=60,
        description="with direct_ingress: how often the front reads the replicas' ports again from Serve (a "
        "restarted replica may get another port; until then a refused connection goes to the next replica or to "
        "Serve's proxy)")
    front_max_connections: int = Field(
        1024, ge=1, le=65536,
        description="with direct_ingress: client connections the front holds at once (each costs two threads and "
        "two file descriptors); one more is reset at once, so a flood of idle connections cannot exhaust the "
        "process")
    ray_host: str = Field(
        "127.0.0.1", min_length=1,
        description="address Ray's GCS, raylet and workers listen on when `fedfraud serve` starts Ray itself: "
        "loopback keeps them off the network (one machine); a node address lets other nodes join, and then Ray "
        "listens on every interface (docs/security.md). On Kubernetes KubeRay starts Ray, not this")

    @model_validator(mode="after")
    def _no_credentials_in_urls(self) -> ServingConfig:
        from urllib.parse import urlsplit

        url = self.fraud_state_path
        if url.startswith(("redis://", "rediss://")) and "@" in urlsplit(url).netloc:
            raise ValueError(f"no credentials in fraud_state_path: the password is read from "
                             f"${self.fraud_state_password_env}")
        return self


class ScorerConfig(_Section):
    """The sections of ``fedfraud.yaml`` a ``StreamScorer`` replica reads, and only those.

    ``fedfraud.serving.app.build_app`` cuts it from the whole config and binds it, so a
    replica is not handed the training, tokenizer or federation settings, and
    what the hot path may read is visible in one type.
    """

    serving: ServingConfig = Field(default_factory=ServingConfig)
    features: FeatureStoreConfig = Field(default_factory=FeatureStoreConfig, description="Feast online store")
    egograph: EgoGraphConfig = Field(default_factory=EgoGraphConfig, description="ego-graph bounds, dedupe ring")
    encoder: EncoderConfig = Field(default_factory=EncoderConfig, description="L'/T' encoders (the featurizer)")
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig, description="the bank's private featurizer")
    fraud: FraudConfig = Field(
        default_factory=FraudConfig, description="fallback fraud features when the model's registry config has none")
    retrain: RetrainConfig = Field(default_factory=RetrainConfig, description="the drift window's size")

    @classmethod
    def of(cls, whole: BaseModel) -> ScorerConfig:
        """This deployment's sections of the whole config (a ``fedfraud.config.FedfraudConfig``), by name."""
        return cls.model_validate({name: getattr(whole, name) for name in cls.model_fields})

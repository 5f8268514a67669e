"""fedfraud feature repo: plain Feast declarations (entities, sources, feature views, services).

Everything here is bank-private derived data: cardholders are keyed by a keyed
pseudonym (blake2b with the bank's secret, never the card number), embeddings
are the LDP-noised L'/T' of :mod:`fedfraud.feature_store.privacy`, and ``ego_state`` is
the compact :class:`fedfraud.feature_store.egograph.EgoGraphState` blob.

Offline rows are written by ``fedfraud features apply`` (:mod:`fedfraud.feature_store.offline`)
to ``data/*.parquet``; streaming writes go through the two PushSources. TTLs are
0 (never expire): the last state of a cardholder stays valid however old.
"""

from datetime import timedelta

from feast import Entity, FeatureService, FeatureView, Field, FileSource, PushSource, ValueType
from feast.types import Array, Bytes, Float32, Float64, Int64, String

# ---------------------------------------------------------------- entities
cardholder = Entity(
    name="cardholder",
    join_keys=["cardholder"],
    value_type=ValueType.STRING,
    description="the card token: ct_ + 128-bit blake2b of the card number keyed with the bank secret, hex",
)
bank = Entity(name="bank", join_keys=["bank"], value_type=ValueType.INT64, description="bank id")
merchant = Entity(
    name="merchant",
    join_keys=["merchant"],
    value_type=ValueType.STRING,
    description="keyed hash of the merchant id (federation key, 16 hex digits), never its name",
)
merchant_bucket = Entity(
    name="merchant_bucket",
    join_keys=["merchant_bucket"],
    value_type=ValueType.INT64,
    description="a merchant's keyed hash (federation key) modulo the merchant-risk domain, the same in every bank",
)

# ---------------------------------------------------------------- sources
cardholder_source = FileSource(
    name="cardholder_transactions",
    path="data/cardholder_transactions.parquet",
    timestamp_field="event_timestamp",
    created_timestamp_column="created",
    description="one row per transaction: features of the cardholder after it; ego_state only on the last row",
)
merchant_source = FileSource(
    name="merchant_transactions",
    path="data/merchant_transactions.parquet",
    timestamp_field="event_timestamp",
    created_timestamp_column="created",
    description="one row per transaction: the noised location embedding of the merchant seen by that bank",
)
merchant_risk_source = FileSource(
    name="merchant_risk_releases",
    path="data/merchant_risk.parquet",
    timestamp_field="event_timestamp",
    created_timestamp_column="created",
    description="one row per bank, bucket and daily release: the bank's own counts and the federation's release",
)
hin2vec_source = FileSource(
    name="cardholder_hin2vec_rows",
    path="data/cardholder_hin2vec.parquet",
    timestamp_field="event_timestamp",
    created_timestamp_column="created",
    description="written online only, by the scorer (empty offline): the latest G-HIN2Vec embedding per cardholder",
)
cardholder_push = PushSource(name="cardholder_push", batch_source=cardholder_source)
merchant_push = PushSource(name="merchant_push", batch_source=merchant_source)
merchant_risk_push = PushSource(name="merchant_risk_push", batch_source=merchant_risk_source)
hin2vec_push = PushSource(name="cardholder_hin2vec_push", batch_source=hin2vec_source)
demographics_source = FileSource(
    name="cardholder_demographics_rows",
    path="data/cardholder_demographics.parquet",
    timestamp_field="event_timestamp",
    created_timestamp_column="created",
    description="one row per cardholder of a bank that holds demographics (issue 39); empty for the others",
)

# ---------------------------------------------------------------- feature views
cardholder_ego_state = FeatureView(
    name="cardholder_ego_state",
    entities=[cardholder],
    ttl=timedelta(0),
    schema=[
        Field(name="cardholder", dtype=String),
        Field(name="ego_state", dtype=Bytes, description="EgoGraphState.to_bytes(): versioned, crc32-checked"),
        Field(name="q_t", dtype=Array(Float32), description="last graph embedding from the scorer; empty if none"),
        Field(name="state_version", dtype=Int64, description="transactions applied to the state (monotonic)"),
    ],
    source=cardholder_push,
    online=True,
    tags={"owner": "feature_store", "privacy": "bank-internal"},
)
cardholder_time = FeatureView(
    name="cardholder_time",
    entities=[cardholder],
    ttl=timedelta(0),
    schema=[
        Field(name="cardholder", dtype=String),
        Field(name="time_embedding", dtype=Array(Float32), description="noised T' of the latest transaction"),
        Field(name="epsilon", dtype=Float64, description="the cardholder's personal LDP budget"),
    ],
    source=cardholder_push,
    online=True,
    tags={"owner": "feature_store", "privacy": "ldp-noised"},
)
cardholder_activity = FeatureView(
    name="cardholder_activity",
    entities=[cardholder],
    ttl=timedelta(0),
    schema=[
        Field(name="cardholder", dtype=String),
        Field(name="tx_count", dtype=Int64),
        Field(name="first_seen_us", dtype=Int64, description="UTC µs since the epoch"),
        Field(name="last_seen_us", dtype=Int64, description="UTC µs since the epoch"),
        Field(name="last_amount", dtype=Float64),
        Field(name="amount_sum", dtype=Float64),
        Field(name="amount_sumsq", dtype=Float64),
        Field(name="amount_max", dtype=Float64),
        Field(name="amount_mean", dtype=Float64),
        Field(name="amount_std", dtype=Float64),
        Field(name="rate_1h", dtype=Float64, description="exponentially decayed count, τ = 1 h, at last_seen"),
        Field(name="rate_24h", dtype=Float64, description="exponentially decayed count, τ = 24 h, at last_seen"),
        Field(name="last_location_cell", dtype=String, description="grid cell 'i:j' of the latest transaction"),
        Field(name="last_mcc", dtype=String),
    ],
    source=cardholder_push,
    online=True,
    tags={"owner": "feature_store", "privacy": "bank-internal"},
)
merchant_location = FeatureView(
    name="merchant_location",
    entities=[bank, merchant],
    ttl=timedelta(0),
    schema=[
        Field(name="bank", dtype=Int64),
        Field(name="merchant", dtype=String),
        Field(name="location_embedding", dtype=Array(Float32), description="noised L' of the latest transaction"),
        Field(name="merchant_bucket", dtype=Int64, description="row of the merchant embedding table"),
    ],
    source=merchant_push,
    online=True,
    tags={"owner": "feature_store", "privacy": "ldp-noised"},
)
merchant_risk = FeatureView(
    name="merchant_risk",
    entities=[bank, merchant_bucket],
    ttl=timedelta(0),
    schema=[
        Field(name="bank", dtype=Int64),
        Field(name="merchant_bucket", dtype=Int64),
        Field(name="release_day", dtype=Int64, description="UTC day index of the release; read by day + 1"),
        Field(name="merchant_bank", dtype=Array(Float32),
              description="the bank's own counts and rates per window (merchant_bank_* features, never shared)"),
        Field(name="merchant_fed", dtype=Array(Float32),
              description="the federation's private release, averaged over the latest releases (merchant_fed_*)"),
    ],
    source=merchant_risk_push,
    online=True,
    tags={"owner": "merchant_risk", "privacy": "bank-internal + DP release (SecAgg+, Skellam)"},
)

cardholder_hin2vec = FeatureView(
    name="cardholder_hin2vec",
    entities=[cardholder],
    ttl=timedelta(0),
    schema=[
        Field(name="cardholder", dtype=String),
        Field(name="hin2vec", dtype=Array(Float32),
              description="G-HIN2Vec h_G of the cardholder's ego graph after its latest transaction"),
        Field(name="hin2vec_model", dtype=String, description="the registry tag of the encoder (hin2vec:vN)"),
        Field(name="state_version", dtype=Int64, description="transactions applied to the ego graph it embeds"),
    ],
    source=hin2vec_push,
    online=True,
    tags={"owner": "serving", "privacy": "bank-internal (embedding of ldp-noised inputs)"},
)

cardholder_demographics = FeatureView(
    name="cardholder_demographics",
    entities=[cardholder],
    ttl=timedelta(0),
    schema=[
        Field(name="cardholder", dtype=String),
        Field(name="birth_day", dtype=Float64, description="birth date, days since 1970-01-01"),
        Field(name="gender_f", dtype=Float64, description="1 female, 0 male"),
        Field(name="city_pop", dtype=Float64, description="population of the cardholder's city"),
        Field(name="job_code", dtype=Float64, description="a stable hash of the job title (the title is not kept)"),
    ],
    source=demographics_source,
    online=True,
    tags={"owner": "feature_store", "privacy": "bank-internal: read by a FED-SPFD model's private part, never sent"},
)

# ---------------------------------------------------------------- services (versioned)
anomaly_scoring_v1 = FeatureService(
    name="anomaly_scoring_v1",
    features=[cardholder_ego_state, cardholder_time],
    description="what the ego-graph anomaly scorer reads per cardholder",
)
fraud_scoring_v1 = FeatureService(
    name="fraud_scoring_v1",
    features=[cardholder_activity, cardholder_ego_state[["q_t"]], merchant_location],
    description="what the fraud model reads: activity, last graph embedding, merchant location",
)
fraud_scoring_v2 = FeatureService(
    name="fraud_scoring_v2",
    features=[cardholder_activity, cardholder_ego_state[["q_t"]], merchant_location, merchant_risk],
    description="fraud_scoring_v1 and the merchant-risk release (federated compromised-merchant signal)",
)

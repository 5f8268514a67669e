"""Offline feature tables: per-bank private features written as the parquet behind the Feast FileSources.

Each bank's rows are featurised *inside that bank* with its own
:class:`~fedfraud.feature_store.privacy.PrivateFeaturizer` (its secret never meets
another bank's data), replayed through :meth:`CardholderState.apply` (the
online path's update) and appended, bank by bank, to

* ``data/cardholder_transactions.parquet``: one row per transaction with the
  cardholder's features *after* it (T', ε, activity, state version); the last
  row of a cardholder also carries the ego-graph blob at the end of history
  and an empty ``q_t``;
* ``data/merchant_transactions.parquet``: one row per transaction with the
  merchant's noised L' as seen by that bank.

``created`` increases with the row order, so when two rows share an event time
Feast's materialisation keeps the later one, exactly like the online path.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, UTC
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from fedfraud.feature_store.activity import ACTIVITY_FEATURES, Activity
from fedfraud.feature_store.cardholder import CardholderState, PreparedBatch, prepare_batch
from fedfraud.feature_store.config import EgoGraphConfig, EncoderConfig, PrivacyConfig
from fedfraud.feature_store.feast_store import DATA_DIR
from fedfraud.feature_store.privacy import PrivateFeaturizer

__all__ = [
    "CARDHOLDER_FILE",
    "MERCHANT_FILE",
    "DEMOGRAPHICS_FILE",
    "HIN2VEC_FILE",
    "HIN2VEC_SCHEMA",
    "MERCHANT_RISK_FILE",
    "BankTables",
    "OfflineReport",
    "bank_tables",
    "embedding_column",
    "write_offline",
]

logger = logging.getLogger(__name__)

CARDHOLDER_FILE = "cardholder_transactions.parquet"
MERCHANT_FILE = "merchant_transactions.parquet"
#: The ``merchant_risk`` view's batch source: the daily job writes the online store only, so it starts (and, in
#: this simulation, stays) empty; Feast's materialisation needs the file with its columns.
MERCHANT_RISK_FILE = "merchant_risk.parquet"
MERCHANT_RISK_SCHEMA = pa.schema([
    ("bank", pa.int64()), ("merchant_bucket", pa.int64()), ("release_day", pa.int64()),
    ("merchant_bank", pa.list_(pa.float32())), ("merchant_fed", pa.list_(pa.float32())),
    ("event_timestamp", pa.timestamp("us", tz="UTC")), ("created", pa.timestamp("us", tz="UTC")),
])
#: The ``cardholder_demographics`` view's batch source: a row per cardholder of a bank holding demographics, timed
#: at its first transaction (so materialisation's window holds it).
DEMOGRAPHICS_FILE = "cardholder_demographics.parquet"
DEMOGRAPHICS_SCHEMA = pa.schema([
    ("cardholder", pa.string()), ("birth_day", pa.float64()), ("gender_f", pa.float64()), ("city_pop", pa.float64()),
    ("job_code", pa.float64()),
    ("event_timestamp", pa.timestamp("us", tz="UTC")), ("created", pa.timestamp("us", tz="UTC")),
])
#: The ``cardholder_hin2vec`` view's batch source: the scorer writes the online store only, so it stays empty.
HIN2VEC_FILE = "cardholder_hin2vec.parquet"
HIN2VEC_SCHEMA = pa.schema([
    ("cardholder", pa.string()), ("hin2vec", pa.list_(pa.float32())), ("hin2vec_model", pa.string()),
    ("state_version", pa.int64()),
    ("event_timestamp", pa.timestamp("us", tz="UTC")), ("created", pa.timestamp("us", tz="UTC")),
])
_TS = pa.timestamp("us", tz="UTC")
_ACTIVITY_TYPES = {int: pa.int64(), float: pa.float64(), str: pa.string()}


def demographics_table(data_dir: Path, bank: int, frame: pd.DataFrame, featurizer: PrivateFeaturizer,
                       created_us: int) -> pa.Table | None:
    """The ``cardholder_demographics`` rows of a bank that holds demographics (keyed by card token, timed at each
    cardholder's first transaction), None for a bank without ``cardholders.parquet``.
    """
    from fedfraud.feature_store.demographics import DEMOGRAPHIC_FIELDS
    from fedfraud.feature_store.layout import read_cardholders

    holders = read_cardholders(data_dir, bank)
    if holders is None or holders.empty:
        return None
    first = frame.groupby(frame["cardholder_id"].astype(str))["timestamp"].min()
    holders = holders.assign(cardholder_id=holders["cardholder_id"].astype(str))
    holders = holders[holders["cardholder_id"].isin(first.index)]
    ts = pd.to_datetime(first.loc[holders["cardholder_id"]].to_numpy(), utc=True)
    columns = {"cardholder": featurizer.pseudonyms(holders["cardholder_id"]),
               **{f: holders[f].to_numpy(dtype=np.float64) for f in DEMOGRAPHIC_FIELDS},
               "event_timestamp": ts, "created": pd.to_datetime(np.full(len(holders), created_us), unit="us", utc=True)}
    return pa.Table.from_pydict({k: list(v) if k == "cardholder" else v for k, v in columns.items()},
                                schema=DEMOGRAPHICS_SCHEMA)


def embedding_column(rows: np.ndarray | list[np.ndarray | None]) -> pa.Array:
    """``list<float32>`` arrow column (Feast ``Array(Float32)``) from a 2-d array or a list of vectors/None."""
    if isinstance(rows, np.ndarray):
        n, d = rows.shape
        offsets = pa.array(np.arange(0, (n + 1) * d, d, dtype=np.int32))
        return pa.ListArray.from_arrays(offsets, pa.array(rows.reshape(-1).astype(np.float32)))
    return pa.array([None if r is None else np.asarray(r, dtype=np.float32) for r in rows], type=pa.list_(pa.float32()))


@dataclass(frozen=True)
class BankTables:
    """One bank's offline rows and the end-of-history state of each of its cardholders."""

    cardholder: pa.Table
    merchant: pa.Table
    states: dict[str, CardholderState]

    def __post_init__(self) -> None:
        if self.cardholder.num_rows != self.merchant.num_rows:
            raise ValueError("cardholder and merchant tables must have one row per applied transaction each")


def bank_tables(
    batch: PreparedBatch, bank: int, ego_cfg: EgoGraphConfig, cell_deg: float, created_base_us: int = 0
) -> BankTables:
    """Replay one bank's prepared transactions through :meth:`CardholderState.apply` and tabulate the result."""
    states: dict[str, CardholderState] = {}
    applied: list[int] = []
    activity_rows: list[tuple[object, ...]] = []
    versions: list[int] = []
    time_rows: list[np.ndarray | None] = []
    last_row: dict[str, int] = {}
    for i, holder in enumerate(batch.cardholder):
        state = states.get(holder)
        if state is None:
            state = states[holder] = CardholderState.empty(holder, ego_cfg)
        if not state.apply(batch, i, cell_deg):
            continue
        last_row[holder] = len(applied)
        applied.append(i)
        act = state.activity
        activity_rows.append(tuple(getattr(act, name) for name in ACTIVITY_FEATURES))
        versions.append(state.version)
        time_rows.append(state.time_embedding)

    n = len(applied)
    idx = np.asarray(applied, dtype=np.int64)
    ts = np.asarray(batch.ts_us, dtype=np.int64)[idx] if n else np.zeros(0, dtype=np.int64)
    created = created_base_us + np.arange(n, dtype=np.int64)
    holders = [batch.cardholder[i] for i in applied]
    blobs: list[bytes | None] = [None] * n
    q_t: list[np.ndarray | None] = [None] * n
    for holder, row in last_row.items():
        blobs[row] = states[holder].ego.to_bytes()
        q_t[row] = states[holder].q_t

    defaults = Activity()
    columns: dict[str, pa.Array] = {
        "cardholder": pa.array(holders, type=pa.string()),
        "event_timestamp": pa.array(ts, type=_TS),
        "created": pa.array(created, type=_TS),
        "time_embedding": embedding_column(time_rows),
        "epsilon": pa.array(batch.features.epsilon[idx], type=pa.float64()),
    }
    for j, name in enumerate(ACTIVITY_FEATURES):
        kind = _ACTIVITY_TYPES[type(getattr(defaults, name))]
        columns[name] = pa.array([r[j] for r in activity_rows], type=kind)
    columns["ego_state"] = pa.array(blobs, type=pa.binary())
    columns["q_t"] = embedding_column(q_t)
    columns["state_version"] = pa.array(versions, type=pa.int64())

    merchant = pa.table(
        {
            "bank": pa.array(np.full(n, bank, dtype=np.int64)),
            "merchant": pa.array([batch.merchant_key(i) for i in applied], type=pa.string()),
            "event_timestamp": pa.array(ts, type=_TS),
            "created": pa.array(created, type=_TS),
            "location_embedding": embedding_column(batch.features.location[idx].reshape(n, -1)),
            "merchant_bucket": pa.array(batch.features.merchant[idx], type=pa.int64()),
        }
    )
    return BankTables(cardholder=pa.table(columns), merchant=merchant, states=states)


@dataclass(frozen=True)
class OfflineReport:
    """What :func:`write_offline` wrote."""

    banks: list[int]
    rows: int
    cardholders: int
    merchants: int
    seconds: float
    paths: list[Path]

    def __post_init__(self) -> None:
        if self.rows < 0 or self.cardholders < 0:
            raise ValueError("counts must be >= 0")


def write_offline(
    data_dir: Path,
    repo_dir: Path,
    encoder_cfg: EncoderConfig,
    privacy_cfg: PrivacyConfig,
    ego_cfg: EgoGraphConfig,
    cell_deg: float,
    banks: list[int] | None = None,
    progress: bool = True,
) -> OfflineReport:
    """Featurise every bank of ``data_dir`` (``bank_<k>/transactions.parquet``) into the repo's offline parquet."""
    from fedfraud.feature_store.layout import list_banks, read_bank

    start = time.perf_counter()
    chosen = banks if banks is not None else list_banks(Path(data_dir))
    out = Path(repo_dir) / DATA_DIR
    out.mkdir(parents=True, exist_ok=True)
    for name, schema in ((MERCHANT_RISK_FILE, MERCHANT_RISK_SCHEMA), (HIN2VEC_FILE, HIN2VEC_SCHEMA)):
        if not (out / name).exists():
            pq.write_table(schema.empty_table(), out / name)
    paths = [out / CARDHOLDER_FILE, out / MERCHANT_FILE, out / DEMOGRAPHICS_FILE]
    writers: list[pq.ParquetWriter | None] = [None, None, pq.ParquetWriter(paths[2], DEMOGRAPHICS_SCHEMA)]
    created_base = int(datetime.now(UTC).timestamp() * 1_000_000)
    rows = holders = 0
    merchants: set[tuple[int, str]] = set()
    try:
        for bank in tqdm(chosen, desc="offline features", disable=not progress):
            featurizer = PrivateFeaturizer.for_bank(encoder_cfg, privacy_cfg, bank)
            frame = read_bank(Path(data_dir), bank)
            batch = prepare_batch(frame, featurizer)
            tables = bank_tables(batch, bank, ego_cfg, cell_deg, created_base + rows)
            demographics = demographics_table(Path(data_dir), bank, frame, featurizer, created_base + rows)
            if demographics is not None:
                writers[2].write_table(demographics)  # type: ignore[union-attr]
            for k, table in enumerate((tables.cardholder, tables.merchant)):
                if writers[k] is None:
                    writers[k] = pq.ParquetWriter(paths[k], table.schema)
                writers[k].write_table(table)  # type: ignore[union-attr]
            rows += tables.cardholder.num_rows
            holders += len(tables.states)
            merchants.update((bank, batch.merchant_key(i)) for i in range(len(batch)))
            logger.info(
                "offline_bank bank=%d rows=%d cardholders=%d", bank, tables.cardholder.num_rows, len(tables.states)
            )
    finally:
        for w in writers:
            if w is not None:
                w.close()
    report = OfflineReport(
        banks=list(chosen),
        rows=rows,
        cardholders=holders,
        merchants=len(merchants),
        seconds=time.perf_counter() - start,
        paths=paths,
    )
    logger.info(
        "offline_written banks=%d rows=%d cardholders=%d merchants=%d seconds=%.1f",
        len(chosen),
        rows,
        holders,
        len(merchants),
        report.seconds,
    )
    return report

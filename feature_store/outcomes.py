"""A bank's outcome store: its decisions, the challenger's shadow scores and the labels that came back.

One SQLite file per bank, next to the bank's offline transactions
(``bank_<k>/outcomes.sqlite``). The label joiner (:mod:`fedfraud.serving.labels`)
writes it; the retrain cycle reads the labels from it and the promotion
policy reads labelled champion/challenger score pairs.

Exactly once per transaction id: every table is keyed by the transaction
id, rows are inserted with ``INSERT OR IGNORE``, and the Kafka positions the
rows came from are written **in the same SQLite transaction** (Kafka's
"store offsets outside Kafka" pattern). A joiner that crashes anywhere
restarts from the stored positions: a message is either fully applied with
its position or not at all, and a label sent twice is counted, not stored twice.

Labels: a ``fraud`` label overrides an earlier ``genuine`` one (an analyst
cleared it, then the chargeback came); the reverse is ignored and counted as a
duplicate, because a confirmed fraud is not un-confirmed by a later message.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["OUTCOMES_FILE", "Applied", "OutcomeStore"]

#: File name of a bank's outcome store inside ``bank_<k>/``.
OUTCOMES_FILE = "outcomes.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS decisions (
    transaction_id TEXT PRIMARY KEY, cardholder TEXT NOT NULL, score REAL, anomaly_score REAL,
    decision TEXT NOT NULL, fraud_model TEXT NOT NULL, anomaly_model TEXT NOT NULL, decided_us INTEGER);
CREATE TABLE IF NOT EXISTS shadow (
    transaction_id TEXT NOT NULL, cardholder TEXT NOT NULL, fraud_model TEXT NOT NULL, anomaly_model TEXT NOT NULL,
    score REAL NOT NULL, anomaly_score REAL, champion_fraud_model TEXT NOT NULL, champion_score REAL NOT NULL,
    scored_us INTEGER, PRIMARY KEY (transaction_id, fraud_model, anomaly_model));
CREATE TABLE IF NOT EXISTS labels (
    transaction_id TEXT PRIMARY KEY, is_fraud INTEGER NOT NULL, labelled_at TEXT, source TEXT,
    received_us INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS positions (
    topic TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL, PRIMARY KEY (topic, partition));
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""

_DECISION_COLS = ("transaction_id", "cardholder", "score", "anomaly_score", "decision", "fraud_model",
                  "anomaly_model", "decided_us")
_SHADOW_COLS = ("transaction_id", "cardholder", "fraud_model", "anomaly_model", "score", "anomaly_score",
                "champion_fraud_model", "champion_score", "scored_us")
_LABEL_COLS = ("transaction_id", "is_fraud", "labelled_at", "source", "received_us")


@dataclass(frozen=True)
class Applied:
    """What one :meth:`OutcomeStore.apply` stored (new rows) and ignored (already stored: redeliveries)."""

    decisions: int = 0
    shadow: int = 0
    labels: int = 0
    duplicate_labels: int = 0


class OutcomeStore:
    """The SQLite outcome store of one bank (WAL, one writer: the label joiner)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> OutcomeStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ writes (one transaction each)
    def apply(self, *, decisions: Sequence[dict[str, Any]] = (), shadow: Sequence[dict[str, Any]] = (),
              labels: Sequence[dict[str, Any]] = (), positions: dict[tuple[str, int], int] | None = None,
              counters: dict[str, int] | None = None) -> Applied:
        """Insert new rows and advance the stored positions atomically; rows already stored are ignored."""
        with self._lock, self._db:
            cur = self._db.cursor()
            n_dec = _insert(cur, "decisions", _DECISION_COLS, decisions)
            n_sh = _insert(cur, "shadow", _SHADOW_COLS, shadow)
            n_lab = _upsert_labels(cur, labels)
            cur.executemany(
                "INSERT INTO positions(topic, partition, next_offset) VALUES (?, ?, ?) "
                "ON CONFLICT(topic, partition) DO UPDATE SET next_offset = max(next_offset, excluded.next_offset)",
                [(t, p, o) for (t, p), o in (positions or {}).items()],
            )
            counts = dict(counters or {})
            if len(labels) > n_lab:
                counts["duplicate_labels"] = counts.get("duplicate_labels", 0) + len(labels) - n_lab
            cur.executemany(
                "INSERT INTO counters(name, value) VALUES (?, ?) "
                "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
                [(k, v) for k, v in counts.items() if v],
            )
        return Applied(n_dec, n_sh, n_lab, len(labels) - n_lab)

    # ------------------------------------------------------------------ reads
    def positions(self) -> dict[tuple[str, int], int]:
        """``{(topic, partition): next offset to read}`` as last stored with the rows."""
        rows = self._db.execute("SELECT topic, partition, next_offset FROM positions").fetchall()
        return {(t, int(p)): int(o) for t, p, o in rows}

    def counters(self) -> dict[str, int]:
        return {k: int(v) for k, v in self._db.execute("SELECT name, value FROM counters").fetchall()}

    def count(self, table: str) -> int:
        if table not in ("decisions", "shadow", "labels"):
            raise ValueError(f"unknown table {table!r}")
        return int(self._db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])

    def labels(self) -> pd.DataFrame:
        """Every label that came back: ``transaction_id``, ``is_fraud`` (bool), ``labelled_at``, ``source``."""
        frame = pd.read_sql_query("SELECT transaction_id, is_fraud, labelled_at, source FROM labels", self._db)
        frame["is_fraud"] = frame["is_fraud"].astype(bool)
        return frame

    def labelled_pairs(self, champion: str, challenger: str, challenger_anomaly: str | None = None,
                       mature_before_us: int | None = None) -> pd.DataFrame:
        """Transactions decided by ``champion`` and shadowed by ``challenger`` (fraud-model tags; with
        ``challenger_anomaly``, only those its GNN scored), with their outcome.

        The outcome is the label that came back; with ``mature_before_us``, a
        transaction scored before then without a label counts as genuine (no
        chargeback came in the maturity window), as the retrain cycle counts it.
        Columns: ``transaction_id``, ``cardholder``, ``is_fraud``, ``champion_score``, ``challenger_score``.
        """
        query = (
            "SELECT s.transaction_id, s.cardholder, "
            "COALESCE(l.is_fraud, CASE WHEN ? IS NOT NULL AND s.scored_us < ? THEN 0 END) AS is_fraud, "
            "s.champion_score, s.score AS challenger_score "
            "FROM shadow s LEFT JOIN labels l USING (transaction_id) "
            "WHERE s.fraud_model = ? AND s.champion_fraud_model = ? AND (? IS NULL OR s.anomaly_model = ?)"
        )
        params = (mature_before_us, mature_before_us, challenger, champion, challenger_anomaly, challenger_anomaly)
        frame = pd.read_sql_query(query, self._db, params=params)
        frame = frame[frame["is_fraud"].notna()].copy()
        frame["is_fraud"] = frame["is_fraud"].astype(bool)
        return frame.drop_duplicates("transaction_id").reset_index(drop=True)

    def joined(self) -> pd.DataFrame:
        """Labels joined to the champion's decisions (left join: a label may come before its decision is read)."""
        return pd.read_sql_query(
            "SELECT l.transaction_id, l.is_fraud, l.labelled_at, l.source, d.cardholder, d.score, d.anomaly_score, "
            "d.decision, d.fraud_model, d.anomaly_model FROM labels l LEFT JOIN decisions d USING (transaction_id)",
            self._db,
        )


def _upsert_labels(cur: sqlite3.Cursor, rows: Sequence[dict[str, Any]]) -> int:
    """Insert new labels; a fraud label replaces a stored genuine one. Returns the rows inserted or replaced."""
    if not rows:
        return 0
    before = cur.connection.total_changes
    cur.executemany(
        f"INSERT INTO labels({', '.join(_LABEL_COLS)}) VALUES ({', '.join('?' * len(_LABEL_COLS))}) "
        "ON CONFLICT(transaction_id) DO UPDATE SET is_fraud = excluded.is_fraud, labelled_at = excluded.labelled_at, "
        "source = excluded.source, received_us = excluded.received_us WHERE excluded.is_fraud > labels.is_fraud",
        [tuple(r.get(c) for c in _LABEL_COLS) for r in rows],
    )
    return cur.connection.total_changes - before


def _insert(cur: sqlite3.Cursor, table: str, cols: Iterable[str], rows: Sequence[dict[str, Any]]) -> int:
    cols = tuple(cols)
    if not rows:
        return 0
    before = cur.connection.total_changes
    cur.executemany(
        f"INSERT OR IGNORE INTO {table}({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
        [tuple(r.get(c) for c in cols) for r in rows],
    )
    return cur.connection.total_changes - before

"""Serving's own per-cardholder blobs: recent anomaly scores and the fraud-feature state.

The Feast online store holds the feature state the models read (ego graph,
q_t, activity). Two things only serving needs live here, behind one tiny
interface with two backends (``sqlite`` path or ``redis://`` URL, STYLE §6):

* ``scores``: the last few (noise key → anomaly score, model tag) of a
  cardholder, written *before* the ego state is pushed, so a transaction whose
  state update already landed (redelivery after a crash) re-emits the score it got;
* ``fraud``: :class:`fedfraud.training.fraud.features.FraudFeatureState` bytes plus the
  last few decisions, so a redelivered transaction re-emits its decision
  identically instead of updating the fraud features twice;
* ``hin2vec``: per merchant node of the ego graph, the category slot and L′ the G-HIN2Vec graph needs
  (:meth:`fedfraud.training.embeddings.graph.HinState.info_bytes`), kept only while the fraud model reads hin2vec
  columns;
* ``counters``: each replica's delivery counters (:mod:`fedfraud.serving.metrics`), so
  totals survive a restart and add up across replicas.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from fedfraud.core.errors import UserError

__all__ = ["REDIS_PASSWORD_ENV", "KVStore", "RedisKV", "SqliteKV", "open_kv"]

#: Default environment variable of the Redis password (the same server as Feast's online store, db 1).
REDIS_PASSWORD_ENV = "FEDFRAUD_REDIS_PASSWORD"

TABLES = ("scores", "fraud", "hin2vec", "counters", "metrics", "gnn_card", "gnn_merchant")


class KVStore(ABC):
    """Batched get/put of bytes by (table, key); last writer wins."""

    @abstractmethod
    def get_many(self, table: str, keys: Sequence[str]) -> list[bytes | None]:
        """Values of ``keys`` in order (None where absent)."""

    @abstractmethod
    def put_many(self, table: str, items: Sequence[tuple[str, bytes]]) -> None:
        """Write all items (one round trip / one transaction)."""

    def get_tables(self, tables: Sequence[str], keys: Sequence[str]) -> list[list[bytes | None]]:
        """The values of ``keys`` in each of ``tables``, in one round trip where the backend allows.

        The hot path reads a micro-batch's anomaly-score rings and fraud states together: one
        round trip to Redis instead of two (issue 12: state I/O in one round trip per batch).
        """
        return [self.get_many(table, keys) for table in tables]

    def put_tables(self, writes: Sequence[tuple[str, Sequence[tuple[str, bytes]]]]) -> None:
        """Write each (table, items) of ``writes`` in one round trip (one transaction) where the backend allows."""
        for table, items in writes:
            self.put_many(table, items)

    @abstractmethod
    def items(self, table: str, prefix: str = "") -> list[tuple[str, bytes]]:
        """Every (key, value) of ``table`` whose key starts with ``prefix`` (small tables only: counters)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""


def _check(table: str) -> str:
    if table not in TABLES:
        raise ValueError(f"unknown table {table!r}; valid: {', '.join(TABLES)}")
    return table


class SqliteKV(KVStore):
    """One SQLite file in WAL mode: embedded default, safe with several processes writing different tables."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(str(self.path), timeout=30, check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        for table in TABLES:
            self._conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (k TEXT PRIMARY KEY, v BLOB NOT NULL)")

    def get_many(self, table: str, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        found: dict[str, bytes] = {}
        with self._lock:
            for start in range(0, len(keys), 500):  # SQLite's bound-parameter limit
                chunk = list(keys[start : start + 500])
                marks = ",".join("?" * len(chunk))
                sql = f"SELECT k, v FROM {_check(table)} WHERE k IN ({marks})"
                found.update(self._conn.execute(sql, chunk).fetchall())
        return [found.get(k) for k in keys]

    def put_many(self, table: str, items: Sequence[tuple[str, bytes]]) -> None:
        self.put_tables([(table, items)])

    def put_tables(self, writes: Sequence[tuple[str, Sequence[tuple[str, bytes]]]]) -> None:
        writes = [(_check(table), items) for table, items in writes if items]
        if not writes:
            return
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for table, items in writes:
                    self._conn.executemany(f"INSERT OR REPLACE INTO {table} (k, v) VALUES (?, ?)", items)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def items(self, table: str, prefix: str = "") -> list[tuple[str, bytes]]:
        with self._lock:
            rows = self._conn.execute(f"SELECT k, v FROM {_check(table)} WHERE substr(k, 1, ?) = ?",
                                      (len(prefix), prefix)).fetchall()
        return [(str(k), bytes(v)) for k, v in rows]

    def close(self) -> None:
        self._conn.close()

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({str(self.path)!r})"


class RedisKV(KVStore):
    """Redis (production): one pipelined MGET / MSET per batch, keys ``fedfraud:<table>:<key>``.

    ``redis://host:port/db`` or ``rediss://`` for TLS (``ssl_ca_certs``: the CA
    that signed the server), which always verifies the certificate and its host
    name. The password comes from ``$password_env``, never from the URL; a
    refused password stops the constructor with one line, and so does a server
    beyond loopback without a password.
    """

    def __init__(self, url: str, prefix: str = "fedfraud", password_env: str = REDIS_PASSWORD_ENV,
                 ssl_ca_certs: str | None = None) -> None:
        import redis

        from fedfraud.feature_store.redis_check import check_redis, require_password

        parts = urlsplit(url)
        options = {k.lower() for k, _ in parse_qsl(parts.query)}
        if parts.password is not None or parts.username is not None or options & {"password", "username"}:
            raise UserError(f"no credentials in the Redis URL {parts.scheme}://...@{parts.hostname}: "
                            f"the password is read from ${password_env}")
        if any(k.startswith("ssl") for k in options):  # URL options win over ours in redis-py: no downgrade there
            raise UserError(f"no ssl options in the Redis URL {parts.scheme}://{parts.hostname}: rediss:// always "
                            "verifies the server's certificate and host name (fraud_state_ca_file names the CA)")
        self.url = url
        self.prefix = prefix
        password = os.environ.get(password_env) or None
        require_password([] if parts.scheme == "unix" else [parts.hostname or "localhost"], password, url,
                         password_env)
        extra: dict[str, object] = {}
        if parts.scheme == "rediss":
            extra = {"ssl_cert_reqs": "required", "ssl_check_hostname": True,
                     **({"ssl_ca_certs": ssl_ca_certs} if ssl_ca_certs else {})}
        self._client = redis.Redis.from_url(url, password=password, **extra)
        check_redis(lambda: self._client, url, password_env)

    def _key(self, table: str, key: str) -> str:
        return f"{self.prefix}:{_check(table)}:{key}"

    def get_many(self, table: str, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        return list(self._client.mget([self._key(table, k) for k in keys]))

    def put_many(self, table: str, items: Sequence[tuple[str, bytes]]) -> None:
        self.put_tables([(table, items)])

    def put_tables(self, writes: Sequence[tuple[str, Sequence[tuple[str, bytes]]]]) -> None:
        values = {self._key(table, k): v for table, items in writes for k, v in items}
        if values:
            self._client.mset(values)  # one MSET: atomic on the server, one round trip

    def get_tables(self, tables: Sequence[str], keys: Sequence[str]) -> list[list[bytes | None]]:
        if not keys:
            return [[] for _ in tables]
        values = self._client.mget([self._key(table, k) for table in tables for k in keys])  # one MGET
        n = len(keys)
        return [list(values[i * n : (i + 1) * n]) for i in range(len(tables))]

    def items(self, table: str, prefix: str = "") -> list[tuple[str, bytes]]:
        head = self._key(table, "")
        keys = list(self._client.scan_iter(match=_glob_escape(head + prefix) + "*", count=1000))
        values = self._client.mget(keys) if keys else []
        return [(k.decode()[len(head):], v) for k, v in zip(keys, values, strict=True) if v is not None]

    def close(self) -> None:
        self._client.close()

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.url!r})"


def _glob_escape(text: str) -> str:
    """``text`` with Redis glob metacharacters escaped (a key prefix is matched literally)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def open_kv(location: str, base_dir: Path | None = None, password_env: str = REDIS_PASSWORD_ENV,
            ssl_ca_certs: str | None = None) -> KVStore:
    """``redis://...`` / ``rediss://...`` → :class:`RedisKV` (password from ``$password_env``); anything else is a
    SQLite path (relative to ``base_dir``).
    """
    if location.startswith(("redis://", "rediss://")):
        return RedisKV(location, password_env=password_env, ssl_ca_certs=ssl_ca_certs)
    path = Path(location)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return SqliteKV(path)

"""Writes a multi-bank dataset in the layout of :mod:`fedfraud.feature_store.layout`.

Chunks arrive unsorted and interleaved across banks, so :class:`DatasetWriter`
spills each (chunk, bank) slice to a small part file and, at
:meth:`DatasetWriter.finish`, sorts each bank once by (timestamp,
transaction_id) into ``bank_<k>/transactions.parquet``. Memory is bounded by
one chunk while streaming and by one bank while finishing. Rejected rows are
appended to ``rejects.jsonl`` as they come, and ``manifest.json`` records the
counts, so no row is ever silently dropped.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, UTC
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from fedfraud.feature_store.schema import ARROW_SCHEMA, CANONICAL_COLUMNS
from fedfraud.feature_store.layout import CARDHOLDERS_FILE, MANIFEST_FILE, REJECTS_FILE, TRANSACTIONS_FILE, bank_dir

__all__ = ["LABELS_FILE", "BankStats", "DatasetSummary", "DatasetWriter", "canonical_table"]

logger = logging.getLogger(__name__)

#: Generator only: ``bank_<k>/labels.parquet`` holds (transaction_id, scenario),
#: row-aligned with that bank's transactions.parquet.
LABELS_FILE = "labels.parquet"
_PARTS_DIR = "_parts"
_OWNED_IN_BANK = (TRANSACTIONS_FILE, LABELS_FILE, CARDHOLDERS_FILE, _PARTS_DIR)


@dataclass(frozen=True)
class BankStats:
    """Counts for one bank's canonical file."""

    bank: int
    rows: int
    cardholders: int
    fraud: int

    def __post_init__(self) -> None:
        if min(self.rows, self.cardholders, self.fraud) < 0 or self.fraud > self.rows:
            raise ValueError(f"inconsistent bank stats {self}")


@dataclass(frozen=True)
class DatasetSummary:
    """What :meth:`DatasetWriter.finish` wrote; also serialised into manifest.json."""

    out: Path
    banks: tuple[BankStats, ...]
    rejects_by_reason: dict[str, int]
    geo_source: dict[str, int]
    seconds: float
    manifest: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def accepted(self) -> int:
        return sum(b.rows for b in self.banks)

    @property
    def rejected(self) -> int:
        return sum(self.rejects_by_reason.values())


def canonical_table(frame: pd.DataFrame) -> pa.Table:
    """Canonical frame → Arrow table with exactly :data:`ARROW_SCHEMA` (column order and types)."""
    return pa.Table.from_pandas(frame[list(CANONICAL_COLUMNS)], schema=ARROW_SCHEMA, preserve_index=False)


def _clear_outputs(out: Path) -> None:
    """Remove files a previous run wrote (and only those), so stale banks cannot linger."""
    for name in (MANIFEST_FILE, REJECTS_FILE):
        (out / name).unlink(missing_ok=True)
    for bank in out.glob("bank_*"):
        if not bank.is_dir():
            continue
        for name in _OWNED_IN_BANK:
            target = bank / name
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
        if not any(bank.iterdir()):
            bank.rmdir()


class DatasetWriter:
    """Streams validated chunks into per-bank parquet files plus rejects and manifest.

    Args:
        out: dataset directory (created; earlier outputs in it are replaced).
        banks: number of banks; every bank gets a file, possibly empty.
    """

    def __init__(self, out: Path, banks: int) -> None:
        if banks < 1:
            raise ValueError("banks must be >= 1")
        self.out = Path(out)
        self.banks = banks
        self._started = time.perf_counter()
        self._parts = [0] * banks
        self._rejects: Counter[str] = Counter()
        self._geo: Counter[str] = Counter()
        self.out.mkdir(parents=True, exist_ok=True)
        _clear_outputs(self.out)
        for k in range(banks):
            (bank_dir(self.out, k) / _PARTS_DIR).mkdir(parents=True, exist_ok=True)
        self._rejects_fh: IO[str] | None = (self.out / REJECTS_FILE).open("w", encoding="utf-8")

    def add(self, accepted: pd.DataFrame, bank: np.ndarray) -> None:
        """Spill validated canonical rows; ``bank[i]`` is the bank of row ``i``."""
        bank = np.asarray(bank, dtype=np.int64)
        if len(bank) != len(accepted):
            raise ValueError("one bank id per accepted row is required")
        if len(bank) and (bank.min() < 0 or bank.max() >= self.banks):
            raise ValueError(f"bank ids must be in [0, {self.banks})")
        if accepted.empty:
            return
        self._geo.update(accepted["geo_source"].value_counts().to_dict())
        table = canonical_table(accepted)
        bank_arr = pa.array(bank)
        for k in np.unique(bank).tolist():
            part = table.filter(pc.equal(bank_arr, k))
            path = bank_dir(self.out, k) / _PARTS_DIR / f"part-{self._parts[k]:06d}.parquet"
            pq.write_table(part, path, compression="zstd")
            self._parts[k] += 1

    def write_cardholders(self, bank: int, frame: pd.DataFrame) -> None:
        """Write bank ``bank``'s private cardholder columns (one row per cardholder, first seen kept)."""
        if not 0 <= bank < self.banks:
            raise ValueError(f"bank ids must be in [0, {self.banks})")
        frame = frame.drop_duplicates("cardholder_id", keep="first").sort_values("cardholder_id")
        pq.write_table(pa.Table.from_pandas(frame.reset_index(drop=True), preserve_index=False),
                       bank_dir(self.out, bank) / CARDHOLDERS_FILE, compression="zstd")

    def add_rejects(self, rejects: pd.DataFrame) -> None:
        """Append rejected rows (``row``, ``reason``, ``detail``) to rejects.jsonl."""
        if rejects.empty:
            return
        if self._rejects_fh is None:
            raise RuntimeError("writer already finished")
        self._rejects.update(rejects["reason"].astype(str).value_counts().to_dict())
        lines = [
            json.dumps({"row": int(r), "reason": reason, "detail": detail})
            for r, reason, detail in zip(rejects["row"].tolist(), rejects["reason"].astype(str).tolist(),
                                         rejects["detail"].astype(str).tolist(), strict=True)
        ]
        self._rejects_fh.write("\n".join(lines) + "\n")

    def _finish_bank(self, k: int) -> BankStats:
        parts_dir = bank_dir(self.out, k) / _PARTS_DIR
        parts = sorted(parts_dir.glob("part-*.parquet"))
        if parts:
            table = pa.concat_tables([pq.read_table(p, schema=ARROW_SCHEMA) for p in parts])
        else:
            table = ARROW_SCHEMA.empty_table()
        table = table.sort_by([("timestamp", "ascending"), ("transaction_id", "ascending")])
        pq.write_table(table, bank_dir(self.out, k) / TRANSACTIONS_FILE, compression="zstd")
        shutil.rmtree(parts_dir)
        fraud = pc.sum(pc.cast(pc.fill_null(table["is_fraud"], False), pa.int64())).as_py() or 0
        return BankStats(bank=k, rows=table.num_rows, cardholders=pc.count_distinct(table["cardholder_id"]).as_py(),
                         fraud=int(fraud))

    def finish(self, meta: Mapping[str, Any]) -> DatasetSummary:
        """Sort and write every bank, then manifest.json (``meta`` adds keys such as format, source)."""
        if self._rejects_fh is not None:
            self._rejects_fh.close()
            self._rejects_fh = None
        stats = tuple(self._finish_bank(k) for k in range(self.banks))
        seconds = time.perf_counter() - self._started
        accepted = sum(b.rows for b in stats)
        manifest: dict[str, Any] = {
            **meta,
            "banks": self.banks,
            "per_bank": {str(b.bank): {"rows": b.rows, "cardholders": b.cardholders, "fraud": b.fraud}
                         for b in stats},
            "total_accepted": accepted,
            "total_rejected": sum(self._rejects.values()),
            "rejects_by_reason": dict(sorted(self._rejects.items())),
            "geo_source": dict(sorted(self._geo.items())),
            "seconds": round(seconds, 3),
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        (self.out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        logger.info("dataset out=%s banks=%d accepted=%d rejected=%d seconds=%.2f", self.out, self.banks,
                    accepted, manifest["total_rejected"], seconds)
        return DatasetSummary(out=self.out, banks=stats, rejects_by_reason=dict(self._rejects),
                              geo_source=dict(self._geo), seconds=seconds, manifest=manifest)

"""On-disk layout of a multi-bank dataset, shared by ``generate``, ``ingest`` and every reader.

::

    DIR/manifest.json              counts per bank, format, partitioning, created_at
    DIR/rejects.jsonl              one JSON object per rejected input row: row, reason, detail
    DIR/bank_<k>/transactions.parquet   canonical rows of bank k (fedfraud.feature_store.schema.ARROW_SCHEMA)
    DIR/bank_<k>/cardholders.parquet    optional: bank k's private cardholder columns (schema.DEMOGRAPHIC_COLUMNS),
                                        only for a bank whose ``banks.<k>.private_features`` holds demographics

A bank's rows are sorted by (timestamp, transaction_id). Train/test membership
is a deterministic function of the cardholder, so every component agrees on it
without storing a split.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from fedfraud.core.errors import UserError

__all__ = [
    "CARDHOLDERS_FILE",
    "MANIFEST_FILE",
    "REJECTS_FILE",
    "TRANSACTIONS_FILE",
    "bank_dir",
    "list_banks",
    "read_bank",
    "read_cardholders",
    "read_manifest",
    "split_of",
]

MANIFEST_FILE = "manifest.json"
REJECTS_FILE = "rejects.jsonl"
TRANSACTIONS_FILE = "transactions.parquet"
CARDHOLDERS_FILE = "cardholders.parquet"


def bank_dir(root: Path, bank: int) -> Path:
    """Folder of bank ``bank`` under dataset ``root``."""
    return Path(root) / f"bank_{bank}"


def list_banks(root: Path) -> list[int]:
    """Bank ids present under ``root``, sorted; raises :class:`UserError` when there are none."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"data directory {root} does not exist")
    banks = sorted(
        int(p.name.split("_", 1)[1])
        for p in root.glob("bank_*")
        if p.is_dir() and p.name.split("_", 1)[1].isdigit() and (p / TRANSACTIONS_FILE).exists()
    )
    if not banks:
        raise UserError(f"{root} holds no bank_<k>/{TRANSACTIONS_FILE}; run `fedfraud generate` or `fedfraud ingest`")
    return banks


def read_bank(root: Path, bank: int, columns: list[str] | None = None) -> pd.DataFrame:
    """Canonical rows of one bank, sorted by (timestamp, transaction_id)."""
    path = bank_dir(root, bank) / TRANSACTIONS_FILE
    if not path.exists():
        raise UserError(f"{path} does not exist")
    frame = pd.read_parquet(path, columns=columns)
    return frame


def read_cardholders(root: Path, bank: int) -> pd.DataFrame | None:
    """Bank ``bank``'s private cardholder columns (one row per cardholder), None when the bank holds none."""
    path = bank_dir(root, bank) / CARDHOLDERS_FILE
    return pd.read_parquet(path) if path.exists() else None


def read_manifest(root: Path) -> dict[str, Any]:
    """The dataset's manifest.json as a dict."""
    path = Path(root) / MANIFEST_FILE
    if not path.exists():
        raise UserError(f"{path} does not exist")
    return json.loads(path.read_text(encoding="utf-8"))


def split_of(
    cardholder_id: str, test_fraction: float = 0.25, salt: str = "fedfraud-split", val_fraction: float = 0.0
) -> Literal["train", "val", "test"]:
    """Deterministic 75/25 (by default) train/test assignment by cardholder (thesis §4.5).

    With ``val_fraction`` > 0 that share of all cardholders is taken from the
    training side as a validation split (settings and early stopping); the
    test cardholders are the same whatever ``val_fraction`` is.
    """
    digest = hashlib.blake2b(f"{salt}:{cardholder_id}".encode(), digest_size=8).digest()
    unit = int.from_bytes(digest, "big") / 2**64
    if unit < test_fraction:
        return "test"
    return "val" if unit < test_fraction + val_fraction else "train"

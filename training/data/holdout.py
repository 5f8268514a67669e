"""Time-based hold-out: history for training and the feature store, a later live tail for streaming.

A stream replayed on top of a store materialised from the same transactions
would apply them twice (the ego graph only remembers its last few keys), and
a model evaluated on transactions it trained on says nothing. So the demo and
the serving benchmark cut each bank at one instant: everything before goes to
``history`` (a dataset in the usual layout), everything from it on is "live".
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from fedfraud.feature_store.layout import CARDHOLDERS_FILE, TRANSACTIONS_FILE, bank_dir, list_banks, read_bank
from fedfraud.training.data.writer import canonical_table

__all__ = ["HoldoutSplit", "time_holdout"]


@dataclass(frozen=True)
class HoldoutSplit:
    """Where the history went and the live tail of every bank (canonical frames, time-ordered)."""

    history: Path
    cutoff: pd.Timestamp
    live: dict[int, pd.DataFrame]

    def __post_init__(self) -> None:
        for bank, frame in self.live.items():
            if len(frame) and frame["timestamp"].min() < self.cutoff:
                raise ValueError(f"bank {bank}: live rows before the cutoff")


def time_holdout(root: Path, out: Path, holdout_days: float) -> HoldoutSplit:
    """Split every bank of ``root`` at ``max(timestamp) - holdout_days``; write the history under ``out``."""
    if holdout_days <= 0:
        raise ValueError("holdout_days must be positive")
    banks = list_banks(root)
    frames = {b: read_bank(root, b) for b in banks}
    end = max(f["timestamp"].max() for f in frames.values() if len(f))
    cutoff = end - pd.Timedelta(days=holdout_days)
    live: dict[int, pd.DataFrame] = {}
    for bank, frame in frames.items():
        past = frame["timestamp"] < cutoff
        target = bank_dir(out, bank)
        target.mkdir(parents=True, exist_ok=True)
        pq.write_table(canonical_table(frame[past].reset_index(drop=True)), target / TRANSACTIONS_FILE)
        if (bank_dir(root, bank) / CARDHOLDERS_FILE).is_file():  # a bank's private cardholder columns stay its own
            shutil.copyfile(bank_dir(root, bank) / CARDHOLDERS_FILE, target / CARDHOLDERS_FILE)
        live[bank] = frame[~past].sort_values(["timestamp", "transaction_id"]).reset_index(drop=True)
    return HoldoutSplit(history=out, cutoff=cutoff, live=live)


def write_records(history: Path, out: Path, live: dict[int, pd.DataFrame], until: pd.Timestamp,
                  unlabelled: set[int] | frozenset[int] = frozenset()) -> Path:
    """Each bank's system of record at ``until``: its history plus the live rows up to then.

    The live rows of the banks in ``unlabelled`` carry no ``is_fraud`` (their
    outcomes are still to come back as labels); what a retrain cycle reads.
    """
    for bank in list_banks(history):
        frame = read_bank(history, bank)
        tail = live.get(bank, frame.iloc[:0])
        tail = tail[tail["timestamp"] <= until].copy()
        if bank in unlabelled:
            tail["is_fraud"] = pd.NA
        target = bank_dir(out, bank)
        target.mkdir(parents=True, exist_ok=True)
        both = pd.concat([frame, tail], ignore_index=True) if len(tail) else frame
        pq.write_table(canonical_table(both.reset_index(drop=True)), target / TRANSACTIONS_FILE)
    return out

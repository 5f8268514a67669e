"""The retrain cycle's window (labels joined, maturity rule) and its lock, without training."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pandas as pd
import pyarrow.parquet as pq
import pytest

from fedfraud.feature_store.outcomes import OUTCOMES_FILE, OutcomeStore
from fedfraud.feature_store.layout import TRANSACTIONS_FILE, bank_dir, read_bank
from fedfraud.training.data.writer import canonical_table
from fedfraud.training.retrain.cycle import RetrainBusy, cycle_lock, window_dataset


def _bank(root, bank: int, days: int, labelled: bool) -> pd.DataFrame:
    ts = pd.date_range("2026-01-01", periods=days * 4, freq="6h", tz="UTC")
    frame = pd.DataFrame({
        "transaction_id": [f"b{bank}-t{i}" for i in range(len(ts))], "cardholder_id": "c1", "merchant_id": "m1",
        "timestamp": ts, "amount": 10.0, "lat": 40.0, "lon": -70.0, "mcc": "5411", "geo_source": "exact",
        "is_fraud": False if labelled else pd.NA,
    })
    bank_dir(root, bank).mkdir(parents=True, exist_ok=True)
    pq.write_table(canonical_table(frame), bank_dir(root, bank) / TRANSACTIONS_FILE)
    return frame


def test_window_takes_labels_that_came_back_and_leaves_out_unripe_rows(tmp_path):
    data = tmp_path / "data"
    _bank(data, 0, 10, labelled=False)
    _bank(data, 1, 10, labelled=True)
    with OutcomeStore(bank_dir(data, 0) / OUTCOMES_FILE) as store:  # two labels of bank 0 came back
        store.apply(labels=[{"transaction_id": "b0-t12", "is_fraud": 1, "received_us": 0},
                            {"transaction_id": "b0-t39", "is_fraud": 0, "received_us": 0}])
    end = pd.Timestamp("2026-01-10T18:00:00Z")
    totals = window_dataset(data, tmp_path / "window", end, window_days=8, maturity_days=2)
    w0 = read_bank(tmp_path / "window", 0).set_index("transaction_id")
    assert bool(w0.loc["b0-t12", "is_fraud"]) is True  # the chargeback
    assert "b0-t39" in w0.index and not w0.loc["b0-t39", "is_fraud"]  # a young row whose label came back
    young = [f"b0-t{i}" for i in range(32, 40) if i != 39]  # unlabelled and younger than 2 days: left out
    assert not set(young) & set(w0.index)
    assert w0["timestamp"].min() > end - pd.Timedelta(days=8)
    assert totals["labels_used"] == 2 and totals["frauds"] == 1 and totals["left_out_unlabelled"] == len(young)
    assert len(read_bank(tmp_path / "window", 1)) == 32  # labelled bank: the whole 8-day window


def test_a_second_cycle_cannot_take_the_lock(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from fedfraud.training.retrain.cycle import cycle_lock
        with cycle_lock(Path({str(tmp_path)!r})):
            print("held", flush=True)
            time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RetrainBusy, match=f"held by pid {holder.pid}"):
            with cycle_lock(tmp_path):
                pass
    finally:
        holder.kill()
        holder.wait()
    with cycle_lock(tmp_path):  # released when its holder died
        pass

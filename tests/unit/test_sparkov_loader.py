"""Sparkov loader: both layouts, chunk boundaries, duplicates across chunks, bad rows, partitioning."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedfraud.core.errors import UserError
from fedfraud.training.data.config import IngestConfig
from fedfraud.training.data.csvio import read_header
from fedfraud.training.data.ingest import detect_format, ingest_csv
from fedfraud.feature_store.layout import REJECTS_FILE, list_banks, read_bank, read_manifest
from fedfraud.feature_store.schema import COORDINATE_DECIMALS
from fedfraud.training.data.partition import state_bank_map
from fedfraud.training.data.sparkov import write_sparkov_csv

STATES = ["NY", "CA", "TX", "IL", "WA", "FL"]


def _frame(n: int, seed: int = 0) -> pd.DataFrame:
    """A small pipe-layout frame with plausible values (cardholder home state rotates over STATES)."""
    rng = np.random.default_rng(seed)
    holder = rng.integers(0, 40, n)
    stamp = pd.Timestamp("2024-01-01", tz="UTC") + pd.to_timedelta(np.sort(rng.integers(0, 30 * 86400, n)), unit="s")
    return pd.DataFrame(
        {
            "cc_num": [f"4{h:015d}" for h in holder],
            "state": [STATES[h % len(STATES)] for h in holder],
            "first": "Ann", "last": "Lee", "gender": "F", "street": "1 Main St", "city": "Somewhere",
            "zip": "10001", "lat": "40.0", "long": "-74.0", "city_pop": "1000", "job": "Engineer, civil",
            "dob": "1980-01-01", "ssn": "123-45-6789", "acct_num": "1", "profile": "adults_2550_female_urban.json",
            "trans_num": [f"{i:032x}" for i in range(n)],
            "trans_date": stamp.strftime("%Y-%m-%d"),
            "trans_time": stamp.strftime("%H:%M:%S"),
            "unix_time": (stamp.asi8 // 10**9).astype(str),
            "category": rng.choice(["grocery_pos", "gas_transport", "shopping_net"], n),
            "amt": np.round(rng.uniform(1, 200, n), 2).astype(str),
            "is_fraud": rng.choice(["0", "1"], n, p=[0.95, 0.05]),
            "merchant": [f"fraud_Merchant {m}" for m in rng.integers(0, 25, n)],
            "merch_lat": np.round(rng.uniform(25, 48, n), 6).astype(str),
            "merch_long": np.round(rng.uniform(-122, -71, n), 6).astype(str),
        }
    )  # fmt: skip


def _all_rows(root: Path) -> pd.DataFrame:
    return pd.concat([read_bank(root, k) for k in list_banks(root)]).sort_values("transaction_id", ignore_index=True)


def _rejects(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / REJECTS_FILE).read_text().splitlines()]


@pytest.mark.parametrize(("layout", "delimiter"), [("pipe", "|"), ("kaggle", ",")])
def test_header_sniffing(tmp_path: Path, layout: str, delimiter: str) -> None:
    path = write_sparkov_csv(_frame(5), tmp_path / "t.csv", layout=layout)
    header = read_header(path)
    assert header.delimiter == delimiter
    assert detect_format(header) == "sparkov"
    if layout == "kaggle":
        assert header.columns[0] == "_index"  # the unnamed leading index column


def test_both_layouts_give_identical_canonical_rows(tmp_path: Path) -> None:
    frame = _frame(300)
    outs = {}
    for layout in ("pipe", "kaggle"):
        path = write_sparkov_csv(frame, tmp_path / f"{layout}.csv", layout=layout)
        report = ingest_csv(path, tmp_path / layout, IngestConfig(banks=3), progress=False)
        assert (report.accepted, report.rejected) == (300, 0)
        outs[layout] = _all_rows(tmp_path / layout)
    pd.testing.assert_frame_equal(outs["pipe"], outs["kaggle"])
    rows = outs["pipe"]
    first = frame.sort_values("trans_num").iloc[0]
    assert rows.loc[0, "cardholder_id"] == first["cc_num"]
    assert rows.loc[0, "merchant_id"] == first["merchant"]
    assert rows.loc[0, "mcc"] == first["category"]
    # rounded to the schema's precision on ingest: no exact coordinate is stored
    assert rows.loc[0, "lat"] == round(float(first["merch_lat"]), COORDINATE_DECIMALS)
    assert rows.loc[0, "lon"] == round(float(first["merch_long"]), COORDINATE_DECIMALS)
    assert rows.loc[0, "timestamp"] == pd.Timestamp(f"{first['trans_date']} {first['trans_time']}", tz="UTC")
    assert set(rows["geo_source"]) == {"exact"}
    assert rows["is_fraud"].sum() == (frame["is_fraud"] == "1").sum()


def test_date_text_wins_over_shifted_unix_time(tmp_path: Path) -> None:
    frame = _frame(3)
    frame["unix_time"] = "1325376018"  # Kaggle's unix_time is years off its own dates
    path = write_sparkov_csv(frame, tmp_path / "k.csv", layout="kaggle")
    ingest_csv(path, tmp_path / "out", IngestConfig(banks=1), progress=False)
    assert (_all_rows(tmp_path / "out")["timestamp"].dt.year == 2024).all()


def test_unix_time_alone_is_enough(tmp_path: Path) -> None:
    frame = _frame(4).drop(columns=["trans_date", "trans_time"])
    path = tmp_path / "u.csv"
    frame.to_csv(path, sep="|", index=False)
    report = ingest_csv(path, tmp_path / "out", IngestConfig(banks=1), progress=False)
    assert report.accepted == 4


def test_chunk_boundaries_and_duplicates_across_chunks(tmp_path: Path) -> None:
    frame = _frame(2500)
    for dup, first in ((1000, 999), (2400, 10), (1001, 1002)):  # across a chunk boundary, two chunks apart, within
        frame.loc[dup, ["trans_num", "cc_num"]] = frame.loc[first, ["trans_num", "cc_num"]].to_numpy()
    # the same id on another card is another transaction (Sparkov reuses trans_num across cards)
    frame.loc[1500, "trans_num"] = frame.loc[20, "trans_num"]
    frame.loc[1500, "cc_num"] = "4000111122223333"
    path = write_sparkov_csv(frame, tmp_path / "d.csv")
    report = ingest_csv(path, tmp_path / "out", IngestConfig(banks=4, chunk_rows=1000), progress=False)
    assert (report.accepted, report.rejected) == (2497, 3)
    assert report.rejects_by_reason == {"duplicate_id": 3}
    assert [(r["row"], r["reason"]) for r in _rejects(tmp_path / "out")] == [
        (1000, "duplicate_id"), (1002, "duplicate_id"), (2400, "duplicate_id")
    ]
    rows = _all_rows(tmp_path / "out")
    assert not rows.duplicated(["cardholder_id", "transaction_id"]).any() and len(rows) == 2497
    assert rows["transaction_id"].duplicated().sum() == 1  # row 1500, on another card
    # Same data in one big chunk gives the same dataset: chunking is invisible.
    ingest_csv(path, tmp_path / "one", IngestConfig(banks=4, chunk_rows=100_000), progress=False)
    pd.testing.assert_frame_equal(rows, _all_rows(tmp_path / "one"))


def test_bad_rows_are_counted_and_written(tmp_path: Path) -> None:
    frame = _frame(12)
    frame.loc[1, "amt"] = "-5.00"
    frame.loc[2, "amt"] = "abc"
    frame.loc[3, "merch_lat"] = "95.1"
    frame.loc[4, "merch_long"] = "-190"
    frame.loc[5, "trans_date"] = "2024-02-30"
    frame.loc[6, "is_fraud"] = "2"
    frame.loc[7, "cc_num"] = ""
    frame.loc[8, "merchant"] = b"caf\xe9".decode("utf-8", errors="surrogateescape")  # a Latin-1 byte in the file
    frame.loc[9, "amt"] = "NaN"
    path = write_sparkov_csv(frame, tmp_path / "bad.csv")
    assert b"caf\xe9" in path.read_bytes()
    report = ingest_csv(path, tmp_path / "out", IngestConfig(banks=2), progress=False)
    assert report.accepted + report.rejected == 12
    expected = {1: "bad_amount", 2: "bad_amount", 3: "lat_out_of_range", 4: "lon_out_of_range",
                5: "bad_timestamp", 6: "bad_label", 7: "missing_field", 8: "invalid_utf8", 9: "bad_amount"}
    assert {r["row"]: r["reason"] for r in _rejects(tmp_path / "out")} == expected
    manifest = read_manifest(tmp_path / "out")
    assert manifest["total_rejected"] == 9 and manifest["total_accepted"] == 3
    assert manifest["rejects_by_reason"]["bad_amount"] == 3


def test_short_line_is_a_missing_field_not_a_crash(tmp_path: Path) -> None:
    path = write_sparkov_csv(_frame(3), tmp_path / "s.csv")
    lines = path.read_text().splitlines()
    lines[2] = "|".join(lines[2].split("|")[:10])  # truncated record
    path.write_text("\n".join(lines) + "\n")
    report = ingest_csv(path, tmp_path / "out", IngestConfig(banks=1), progress=False)
    assert (report.accepted, report.rejects_by_reason) == (2, {"missing_field": 1})


def test_output_sorted_and_partitioned_by_cardholder(tmp_path: Path) -> None:
    path = write_sparkov_csv(_frame(600), tmp_path / "p.csv")
    ingest_csv(path, tmp_path / "hash", IngestConfig(banks=3, partition="hash"), progress=False)
    holders_per_bank = []
    for k in list_banks(tmp_path / "hash"):
        rows = read_bank(tmp_path / "hash", k)
        keys = list(zip(rows["timestamp"], rows["transaction_id"], strict=True))
        assert keys == sorted(keys)
        holders_per_bank.append(set(rows["cardholder_id"]))
    assert sum(len(h) for h in holders_per_bank) == len(set().union(*holders_per_bank))  # disjoint banks
    ingest_csv(path, tmp_path / "region", IngestConfig(banks=5, partition="region"), progress=False)
    mapping = state_bank_map(5)
    frame = _frame(600).set_index("cc_num")["state"].to_dict()
    for k in list_banks(tmp_path / "region"):
        states = {frame[c] for c in read_bank(tmp_path / "region", k)["cardholder_id"]}
        assert {mapping[s] for s in states} <= {k}  # a bank with no home state among STATES is empty
    assert read_manifest(tmp_path / "region")["partition"] == "region"


def test_unrecognised_header_is_a_user_error(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(UserError, match="no recognisable header"):
        ingest_csv(path, tmp_path / "out", IngestConfig(), progress=False)

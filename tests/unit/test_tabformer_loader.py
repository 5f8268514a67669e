"""TabFormer loader on a hand-written sample: ids, amounts, geo treatments, bad rows, home states."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from fedfraud.training.data.config import IngestConfig
from fedfraud.training.data.csvio import read_header
from fedfraud.training.data.geo import US_CENTER, geo_tables
from fedfraud.training.data.ingest import detect_format, ingest_csv
from fedfraud.feature_store.layout import REJECTS_FILE, list_banks, read_bank, read_manifest
from fedfraud.feature_store.schema import COORDINATE_DECIMALS
from fedfraud.training.data.tabformer import home_states

SAMPLE = Path(__file__).parents[1] / "fixtures" / "tabformer_sample.csv"


@pytest.fixture(scope="module")
def ingested(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    out = tmp_path_factory.mktemp("tabformer")
    ingest_csv(SAMPLE, out, IngestConfig(banks=2), progress=False)
    rows = pd.concat([read_bank(out, k) for k in list_banks(out)]).sort_values("timestamp", ignore_index=True)
    return out, rows


def test_detected_by_header() -> None:
    assert detect_format(read_header(SAMPLE)) == "tabformer"


def test_counts_and_reject_reasons(ingested: tuple[Path, pd.DataFrame]) -> None:
    out, rows = ingested
    manifest = read_manifest(out)
    assert manifest["format"] == "tabformer"
    assert (manifest["total_accepted"], manifest["total_rejected"]) == (14, 6)
    rejects = {r["row"]: r["reason"] for r in map(json.loads, (out / REJECTS_FILE).read_text().splitlines())}
    # data rows (0-based): negative refund, blank Time, Feb 30, "$abc", label "Maybe", blank User
    assert rejects == {8: "bad_amount", 13: "missing_field", 14: "bad_timestamp", 15: "bad_amount",
                       16: "bad_label", 18: "missing_field"}
    assert len(rows) == 14


def test_geo_treatments_are_flagged(ingested: tuple[Path, pd.DataFrame]) -> None:
    out, rows = ingested
    assert read_manifest(out)["geo_source"] == {"city": 9, "online": 2, "state_centroid": 1, "unknown": 2}
    states, cities = geo_tables().states, geo_tables().cities

    def grid(v: float) -> float:  # the validator rounds every coordinate to the schema's precision
        return round(v, COORDINATE_DECIMALS)

    def at(cardholder: str, merchant: str) -> pd.Series:
        hit = rows[(rows["cardholder_id"] == cardholder) & (rows["merchant_id"] == merchant)]
        return hit.iloc[0]

    la_verne = at("0-0", "3527213246127876953")
    lat = grid(cities.loc["LA VERNE|CA", "lat"])
    assert (la_verne["geo_source"], la_verne["lat"]) == ("city", lat)
    assert at("0-0", "-727612092139916043")["geo_source"] == "city"  # Monterey Park comes first in time
    smalltown = rows[rows["geo_source"] == "state_centroid"].iloc[0]
    assert (smalltown["lat"], smalltown["lon"]) == (grid(states.loc["CA", "lat"]), grid(states.loc["CA", "lon"]))
    online = rows[rows["geo_source"] == "online"].set_index("cardholder_id")
    # ONLINE rows sit at the cardholder's home-state centroid (0-0 shops in CA, 1-0 in TX).
    assert online.loc["0-0", "lat"] == grid(states.loc["CA", "lat"])
    assert online.loc["1-0", "lon"] == grid(states.loc["TX", "lon"])
    unknown = rows[rows["geo_source"] == "unknown"].set_index("cardholder_id")
    assert unknown.loc["0-0", "lat"] == grid(states.loc["CA", "lat"])  # Rome, Italy → home state
    assert (unknown.loc["3-0", "lat"], unknown.loc["3-0", "lon"]) == tuple(map(grid, US_CENTER))  # no US purchase
    assert not ((rows["lat"] == 0) & (rows["lon"] == 0)).any()


def test_amounts_labels_times_and_ids(ingested: tuple[Path, pd.DataFrame]) -> None:
    _, rows = ingested
    first = rows.iloc[0]
    assert first["amount"] == 134.09
    assert first["timestamp"] == pd.Timestamp("2002-09-01 06:21", tz="UTC")
    assert first["mcc"] == "5300"
    assert rows["is_fraud"].sum() == 2
    assert rows["transaction_id"].str.fullmatch(r"[0-9a-f]{16}").all()


def test_transaction_ids_are_deterministic(tmp_path: Path, ingested: tuple[Path, pd.DataFrame]) -> None:
    _, rows = ingested
    ingest_csv(SAMPLE, tmp_path, IngestConfig(banks=1, partition="region"), progress=False)
    again = read_bank(tmp_path, 0).sort_values("timestamp", ignore_index=True)
    assert again["transaction_id"].tolist() == rows["transaction_id"].tolist()


def test_home_states_pre_pass() -> None:
    home = home_states(read_header(SAMPLE), chunk_rows=4, progress=False)
    assert home.to_dict() == {"0-0": "CA", "1-0": "TX", "1-1": "TX", "2-0": "NY"}

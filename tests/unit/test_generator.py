"""Synthetic generator: determinism, fraud mix, non-IID banks, sessions, travel, labels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedfraud.training.data.config import GeneratorConfig
from fedfraud.feature_store.geo import haversine_km
from fedfraud.feature_store.layout import TRANSACTIONS_FILE, bank_dir, list_banks, read_bank, read_manifest
from fedfraud.training.data.synthetic import FRAUD_SCENARIOS, REGIONS, generate_dataset, generate_frame
from fedfraud.training.data.writer import LABELS_FILE

CONFIG = GeneratorConfig(banks=4, cardholders=300, days=30, seed=11, fraud_rate=0.01)


def _km(lat1: pd.Series, lon1: pd.Series, lat2: pd.Series, lon2: pd.Series) -> np.ndarray:
    return haversine_km(lat1.to_numpy(), lon1.to_numpy(), lat2.to_numpy(), lon2.to_numpy())


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gen")
    generate_dataset(out, CONFIG, raw_csv=False, progress=False)
    return out


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return generate_frame(CONFIG)[0]


def test_same_seed_gives_byte_identical_parquet(dataset: Path, tmp_path: Path) -> None:
    generate_dataset(tmp_path / "again", CONFIG, raw_csv=False, progress=False)
    generate_dataset(tmp_path / "other", CONFIG.model_copy(update={"seed": 12}), raw_csv=False, progress=False)
    for k in list_banks(dataset):
        for name in (TRANSACTIONS_FILE, LABELS_FILE):
            assert (bank_dir(dataset, k) / name).read_bytes() == (bank_dir(tmp_path / "again", k) / name).read_bytes()
    assert (bank_dir(dataset, 0) / TRANSACTIONS_FILE).read_bytes() != (
        bank_dir(tmp_path / "other", 0) / TRANSACTIONS_FILE
    ).read_bytes()


def test_manifest_and_labels(dataset: Path) -> None:
    manifest = read_manifest(dataset)
    assert manifest["total_rejected"] == 0 and manifest["partition"] == "generator"
    total = 0
    for k in list_banks(dataset):
        rows = read_bank(dataset, k)
        labels = pd.read_parquet(bank_dir(dataset, k) / LABELS_FILE)
        assert labels["transaction_id"].tolist() == rows["transaction_id"].tolist()  # row-aligned
        assert (labels["scenario"].isin(list(FRAUD_SCENARIOS)) == rows["is_fraud"]).all()
        assert "scenario" not in rows.columns  # the canonical file stays canonical
        assert manifest["per_bank"][str(k)]["rows"] == len(rows)
        total += len(rows)
    assert manifest["total_accepted"] == total


def test_fraud_rate_and_every_scenario(frame: pd.DataFrame) -> None:
    assert frame["is_fraud"].mean() == pytest.approx(CONFIG.fraud_rate, abs=0.002)
    counts = frame.loc[frame["is_fraud"], "scenario"].value_counts()
    assert set(counts.index) == set(FRAUD_SCENARIOS)
    shares = counts / counts.sum()
    for name, share in FRAUD_SCENARIOS.items():
        assert shares[name] == pytest.approx(share, abs=0.08)


def test_scenarios_leave_their_signals(frame: pd.DataFrame) -> None:
    legit = frame[frame["scenario"] == "legit"]
    testing = frame[frame["scenario"] == "card_testing"]
    assert testing["amount"].max() <= 3.0 < legit["amount"].median()
    assert set(testing["mcc"]) <= {"shopping_net", "misc_net", "grocery_net"}
    ato = frame[frame["scenario"] == "account_takeover"]
    stolen = frame[frame["scenario"] == "lost_stolen"]
    assert ato["amount"].median() > 3 * legit["amount"].median()
    assert stolen["amount"].median() > 2 * legit["amount"].median()
    # Takeovers happen far from home: no takeover row sits at the cardholder's usual metro.
    home = legit.groupby("cardholder_id")[["lat", "lon"]].median()
    lat0, lon0 = ato["cardholder_id"].map(home["lat"]), ato["cardholder_id"].map(home["lon"])
    assert (_km(lat0, lon0, ato["lat"], ato["lon"]) > 800).all()
    near = _km(stolen["cardholder_id"].map(home["lat"]), stolen["cardholder_id"].map(home["lon"]), stolen["lat"],
               stolen["lon"])
    assert (near < 100).mean() > 0.9  # lost/stolen cards are used around home


def test_sessions_make_sub_two_hour_edges(frame: pd.DataFrame) -> None:
    legit = frame[frame["scenario"] == "legit"].sort_values(["cardholder_id", "timestamp"])
    gaps = legit.groupby("cardholder_id")["timestamp"].diff().dropna()
    short = (gaps < pd.Timedelta(hours=2)).mean()
    assert 0.2 < short < 0.8
    revisits = legit.groupby("cardholder_id")["merchant_id"].agg(lambda s: 1 - s.nunique() / len(s))
    assert revisits.median() > 0.5  # favourites make ego graphs revisit merchants


def test_travel_is_legitimate_and_elsewhere(frame: pd.DataFrame) -> None:
    travel = frame[frame["scenario"] == "travel"]
    assert len(travel) > 0 and not travel["is_fraud"].any()
    home = frame[frame["scenario"] == "legit"].groupby("cardholder_id")[["lat", "lon"]].median()
    away = _km(travel["cardholder_id"].map(home["lat"]), travel["cardholder_id"].map(home["lon"]), travel["lat"],
               travel["lon"])
    assert np.median(away) > 500
    assert len(REGIONS) >= 5


def test_banks_are_non_iid(frame: pd.DataFrame) -> None:
    legit = frame[~frame["is_fraud"]]
    metro = legit["merchant_id"].str.rsplit(" ", n=1).str[1].str[:3]
    mix = pd.crosstab(legit["bank"], metro, normalize="index")
    # Each bank's customers come mostly from its own metros: the mixes differ a lot.
    top = mix.idxmax(axis=1)
    assert top.nunique() == len(top)
    spend = legit.groupby("bank")["amount"].median()
    assert spend.max() / spend.min() > 1.1

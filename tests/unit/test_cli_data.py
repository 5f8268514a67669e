"""``fedfraud generate`` and ``fedfraud ingest`` through the real CLI entry point."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfraud.cli.app import main
from fedfraud.feature_store.layout import read_manifest

SAMPLE = Path(__file__).parents[1] / "fixtures" / "tabformer_sample.csv"


def test_generate_then_ingest_the_raw_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gen = tmp_path / "gen"
    code = main(["generate", "--banks", "3", "--cardholders", "60", "--days", "14", "--seed", "5",
                 "--fraud-rate", "0.02", "--out", str(gen)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "transactions" in printed and "bank_2" in printed
    generated = read_manifest(gen)
    assert generated["generator"]["cardholders"] == 60 and generated["banks"] == 3

    ing = tmp_path / "ing"
    code = main(["ingest", str(gen / "raw" / "transactions.csv"), "--format", "auto", "--banks", "5",
                 "--partition", "hash", "--out", str(ing)])
    assert code == 0
    printed = capsys.readouterr().out
    ingested = read_manifest(ing)
    assert ingested["format"] == "sparkov" and ingested["banks"] == 5
    assert ingested["total_accepted"] == generated["total_accepted"]
    assert ingested["total_rejected"] == 0
    fraud = sum(b["fraud"] for b in ingested["per_bank"].values())
    assert fraud == sum(b["fraud"] for b in generated["per_bank"].values())
    assert f"accepted={generated['total_accepted']}" in printed


def test_ingest_tabformer_prints_reasons(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["ingest", str(SAMPLE), "--format", "tabformer", "--partition", "region", "--out", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "accepted=14 rejected=6" in out
    assert "bad_amount=2" in out and "missing_field=2" in out


@pytest.mark.parametrize("kind", ["missing", "empty", "directory", "garbage"])
def test_bad_input_is_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    path = tmp_path / "in.csv"
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "directory":
        path.mkdir()
    elif kind == "garbage":
        path.write_text("hello,world\n1,2\n")
    code = main(["ingest", str(path), "--out", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_bad_option_is_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["generate", "--cardholders", "0", "--out", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "cardholders" in err


@pytest.mark.parametrize(
    ("argv", "setup", "says"),
    [
        (["stream", "--data", "{d}/empty.csv", "--bootstrap-servers", "127.0.0.1:1"], "empty", "CSV"),
        (["stream", "--source", "{d}/ds", "--bootstrap-servers", "127.0.0.1:1"], "corrupt", "parquet"),
        (["inspect", "--data", "{d}/ds", "--cardholder", "4000000000000001"], "corrupt", "parquet"),
        (["stream", "--source", "{d}/ok.csv", "--bootstrap-servers", "127.0.0.1:1"], "ok", "no Kafka broker"),
    ],
    ids=["stream-empty-csv", "stream-corrupt-parquet", "inspect-corrupt-parquet", "stream-unreachable-broker"],
)
def test_stream_and_inspect_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                                setup: str, says: str) -> None:
    """Issue 14: each of these printed a traceback (EmptyDataError, ArrowInvalid, an 85-line KafkaTimeoutError)."""
    (tmp_path / "empty.csv").write_text("\n")
    code = main(["generate", "--banks", "1", "--cardholders", "5", "--days", "3", "--out", str(tmp_path / "ds")])
    assert code == 0
    capsys.readouterr()
    if setup == "corrupt":
        (tmp_path / "ds" / "bank_0" / "transactions.parquet").write_bytes(b"not a parquet file")
    if setup == "ok":
        from fedfraud.serving.replay import load_source

        load_source(tmp_path / "ds").head(3).to_csv(tmp_path / "ok.csv", index=False)
    code = main([a.format(d=tmp_path) for a in argv])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and says in err, err

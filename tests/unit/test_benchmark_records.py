"""Benchmark records (docs/results) and the pages rendered from them (issue 41 part 1)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from fedfraud.bench import records
from fedfraud.bench.records import README_BEGIN, README_END, ROOT, latest_records, render_benchmarks, render_readme
from fedfraud.cli.app import main

RERENDER = "run `python -m fedfraud.bench.records` and commit the result"
MAX_LINES = 400  # issue 41: a page that reads


def test_benchmarks_page_is_rendered_from_the_newest_records() -> None:
    page = (ROOT / "docs/benchmarks.md").read_text(encoding="utf-8")
    assert page == render_benchmarks(latest_records()), f"docs/benchmarks.md is stale: {RERENDER}"


def test_readme_headline_table_is_rendered_from_the_newest_records() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme == render_readme(readme, latest_records()), f"README.md's headline table is stale: {RERENDER}"


def test_benchmarks_page_stays_short() -> None:
    lines = len((ROOT / "docs/benchmarks.md").read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"docs/benchmarks.md has {lines} lines: trim the largest records' markdown"


def test_every_record_names_its_folder_and_says_where_it_came_from() -> None:
    found = latest_records()
    assert len(found) >= 20
    for name, r in found.items():
        assert r["path"].startswith(f"{name}/"), r["path"]
        assert r["command"].startswith("fedfraud ") and r["markdown"].strip(), name
        assert r["source"] is None or r["source"].startswith("imported from "), name


def test_the_newest_record_of_a_bench_wins(tmp_path: Path) -> None:
    for date, time, figure in (("2026-11-20", None, "old"), ("2026-11-26", "08:00:00 UTC", "morning"),
                               ("2026-11-26", "19:00:00 UTC", "evening")):
        record = {"bench": "b", "date": date, "time": time, "command": "fedfraud bench b", "markdown": figure}
        (tmp_path / "b").mkdir(exist_ok=True)
        (tmp_path / "b" / f"{date}-{figure}.json").write_text(json.dumps(record))
    assert latest_records(tmp_path)["b"]["markdown"] == "evening"


def test_readme_without_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="markers"):
        render_readme("# no table here\n", {})


def test_a_bad_record_name_is_one_line_and_runs_nothing(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("FEDFRAUD_SIMULATION_SECRET", "test-secret-not-for-production")
    assert main(["bench", "--record", "Not A Name", "features", "--quick"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --record") and "\n" not in err


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any], str]:
    """One real ``bench features --quick`` run (~30 s) with both ``--json`` and ``--record``, against a results
    folder whose previous record of the bench carries targets and a headline."""
    tmp = tmp_path_factory.mktemp("records")
    results = tmp / "results"
    previous = {"bench": "features-smoke", "date": "2026-01-01", "time": None, "command": "fedfraud bench features",
                "markdown": "old", "title": "Feature pipeline", "targets": ["ego-graph update ≥ 20,000/s"],
                "headline": {"what": "Ego graphs", "result": "34,501/s", "order": 1}}
    (results / "features-smoke").mkdir(parents=True)
    (results / "features-smoke" / "2026-01-01-abc1234.json").write_text(json.dumps(previous))
    argv = ["bench", "--record", "features-smoke", "--json", str(tmp / "run.json"), "features", "--quick",
            "--pairs", "100"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FEDFRAUD_SIMULATION_SECRET", "test-secret-not-for-production")
        mp.setattr(records, "RESULTS", results)
        mp.setattr(sys, "argv", ["/venv/bin/fedfraud", *argv])
        assert main(argv) == 0
        newest = latest_records(results)["features-smoke"]
    return json.loads((tmp / "run.json").read_text()), newest, str(results)


@pytest.mark.slow
def test_a_real_bench_run_writes_its_record(recorded: tuple[dict[str, Any], dict[str, Any], str]) -> None:
    run, newest, _ = recorded
    assert run["bench"] == "features-smoke"
    assert run["command"] == "fedfraud bench --record features-smoke --json " + run["command"].split(" --json ")[1]
    assert run["command"].endswith("features --quick --pairs 100")
    assert len(run["commit"]) >= 7 and isinstance(run["dirty"], bool)
    assert run["machine"]["cores"] == os.cpu_count() and run["machine"]["python"] == sys.version.split()[0]
    assert run["load"]["before"] and run["load"]["after"]
    assert "| EgoGraphState.update |" in run["markdown"]
    assert any(m["name"] == "EgoGraphState.update" for m in run["figures"]["throughput"])
    assert run["source"] is None


@pytest.mark.slow
def test_a_recorded_run_keeps_the_targets_and_drops_the_stale_headline(
    recorded: tuple[dict[str, Any], dict[str, Any], str],
) -> None:
    run, newest, results = recorded
    assert Path(results, newest["path"]).name.startswith(run["date"] + "-" + run["commit"])
    assert newest["markdown"] == run["markdown"]
    assert newest["targets"] == ["ego-graph update ≥ 20,000/s"] and newest["title"] == "Feature pipeline"
    assert newest["headline"] == {"what": "Ego graphs", "result": None, "order": 1}
    page = render_benchmarks({"features-smoke": newest})
    assert "## features-smoke" in page and "Targets: ego-graph update ≥ 20,000/s." in page
    row = render_readme(f"x\n{README_BEGIN}\n{README_END}\n", {"features-smoke": newest})
    assert "| Ego graphs | re-run " in row and "34,501" not in row

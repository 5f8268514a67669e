"""Benchmark records: one JSON file per run, and the pages rendered from the newest record of each bench.

A run's figures outlive the prose around them only if the run is data: ``fedfraud bench --record NAME ...`` writes
``docs/results/<NAME>/<date>-<commit>.json`` (command, commit, machine, load average, the printed block), and
``docs/benchmarks.md`` and the README's headline table are rendered from the newest record of each bench, so no
figure is copied by hand and the history stays in the JSON files and git. Re-render with
``python -m fedfraud.bench.records``; ``tests/unit/test_benchmark_records.py`` fails when a page is stale.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fedfraud.bench.harness import load_average

__all__ = [
    "MORE", "README_BEGIN", "README_END", "ROOT", "build_record", "git", "latest_records", "render_benchmarks",
    "render_readme", "write_pages", "write_record",
]

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path("docs/results")
README_BEGIN = "<!-- headline results: rendered by `python -m fedfraud.bench.records` from docs/results -->"
README_END = "<!-- end of headline results -->"
#: A line in a record's block after which its detail (every block, per-role tables) stays in the record only.
MORE = "<!-- more in the record -->"
RERENDER = "python -m fedfraud.bench.records"
_OLD_PAGE = "918463b"

_INTRO = f"""# Benchmarks

<!-- Rendered by `{RERENDER}` from docs/results/*/*.json: edit the records, not this page. -->

The newest result of every bench, one JSON record each (`results/<bench>/<date>-<commit>.json`; older runs: older
records, git history): command, commit, UTC time, machine, load before and after, printed block, targets. Write one
with `fedfraud bench --record NAME <bench>` (`--json FILE`; `--record` of the `eval` studies), run `{RERENDER}`, commit
both. Tables after a block's "more" marker stay in the record. *Imported* records come from this page's old log (`git
show {_OLD_PAGE}:docs/benchmarks.md`). Test-split looks: [test-split-looks.md](test-split-looks.md). Unless a record
says otherwise: the shared 2-core / 24 GiB machine without GPU, whose speed varies 2× between days.
"""


def git(*args: str) -> str | None:
    """A git query's output in this checkout, or None outside a work tree (a record is still worth writing)."""
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def _machine() -> dict[str, Any]:
    """The facts that explain a figure's speed: cores, memory, CPU model, GPU, Python."""
    cpu = platform.machine()
    memory_gib: float | None = None
    try:
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), cpu)
        kib = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()
                   if ln.startswith("MemTotal:"))
        memory_gib = round(kib / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        pass
    gpu = _gpu()
    return {"cores": os.cpu_count(), "memory_gib": memory_gib, "cpu": cpu, "gpu": gpu,
            "python": platform.python_version()}


def _gpu() -> str | None:
    """The CUDA device's name if torch is already loaded and sees one (a bench never loads torch just for this)."""
    torch = sys.modules.get("torch")
    try:
        return str(torch.cuda.get_device_name(0)) if torch is not None and torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - a broken driver must not lose the run's record
        return None


def _plain(figures: object) -> Any:
    """A result object's figures as JSON data (dataclasses and ``to_dict()``), else None."""
    if figures is None:
        return None
    if dataclasses.is_dataclass(figures) and not isinstance(figures, type):
        figures = dataclasses.asdict(figures)
    elif callable(getattr(figures, "to_dict", None)):
        figures = figures.to_dict()  # type: ignore[attr-defined]
    return json.loads(json.dumps(figures, default=str, allow_nan=True))


def latest_records(results: Path | None = None) -> dict[str, dict[str, Any]]:
    """The newest record of every bench under ``results``, by bench name (newest = latest date and time)."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted((results or ROOT / RESULTS).glob("*/*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        record["path"] = path.relative_to(path.parents[1]).as_posix()
        key = (record.get("date") or "", record.get("time") or "", path.name)
        old = out.get(record["bench"])
        if old is None or key >= (old.get("date") or "", old.get("time") or "", Path(old["path"]).name):
            out[record["bench"]] = record
    return out


def build_record(bench: str, markdown: str, load_before: str, figures: object = None,
                 previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """The record of a run that just printed ``markdown``; targets and the README row's name come from
    ``previous`` (a bench's targets are the tracker's, not the run's), the headline result does not.
    """
    now = datetime.now(UTC)
    argv = ["fedfraud", *sys.argv[1:]]
    status = git("status", "--porcelain", "--untracked-files=no")
    headline = (previous or {}).get("headline")
    return {
        "bench": bench,
        "title": (previous or {}).get("title", bench),
        "command": " ".join(argv),
        "date": now.strftime("%Y-%m-%d"),
        "time": now.strftime("%H:%M:%S UTC"),
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": None if status is None else bool(status),
        "machine": _machine(),
        "load": {"before": load_before, "after": load_average()},
        "markdown": markdown.strip("\n"),
        "figures": _plain(figures),
        "targets": list((previous or {}).get("targets", [])),
        "headline": {**headline, "result": None} if headline else None,
        "source": None,
    }


def write_record(record: dict[str, Any], path: Path | None = None, results: Path | None = None) -> Path:
    """Write ``record`` to ``path``, or to ``<results>/<bench>/<date>-<commit>.json``."""
    if path is None:
        name = f"{record['date']}-{record['commit'] or 'nogit'}{'-dirty' if record.get('dirty') else ''}.json"
        path = (results or ROOT / RESULTS) / record["bench"] / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    logger.info("benchmark record written: %s", path)
    return path


def _run_line(r: dict[str, Any]) -> str:
    """The run in one line: what, when, which commit, how loaded, which record."""
    load = r.get("load") or {}
    when = f"{r.get('date') or 'date not stated'} {r.get('time') or ''}".strip()
    commit = f"commit {r['commit']}{' + uncommitted changes' if r.get('dirty') else ''}" if r.get("commit") else (
        "commit not stated")
    before, after = load.get("before"), load.get("after")
    one = f"load {before or after} ({'at start' if before else 'at end'})"
    loads = f"load {before} → {after}" if before and after else one if before or after else "load not stated"
    imported = ", imported" if r.get("source") else ""
    return f"*{r.get('title') or r['bench']}.* {when}, {commit}, {loads} ([record](results/{r['path']}){imported})."


def render_benchmarks(records: dict[str, dict[str, Any]]) -> str:
    """``docs/benchmarks.md``: the intro, then one short section per bench, in bench-name order."""
    out = [_INTRO]
    for name in sorted(records):
        r = records[name]
        targets = " Targets: " + "; ".join(r["targets"]) + "." if r.get("targets") else ""
        body, more, _ = r["markdown"].partition(MORE)
        tail = " More of the run's tables are in its record." if more else ""
        out += [f"## {name}", _run_line(r) + targets + tail + "\\", f"`{r['command']}`", "", body.strip("\n"), ""]
    return "\n".join(out).rstrip("\n") + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_readme(readme: str, records: dict[str, dict[str, Any]]) -> str:
    """``readme`` with its headline table, between the two markers, rendered from the records' headlines."""
    begin, end = readme.find(README_BEGIN), readme.find(README_END)
    if begin < 0 or end < begin:
        raise ValueError(f"README.md lacks the markers {README_BEGIN!r} … {README_END!r}")
    rows = sorted((r for r in records.values() if r.get("headline")), key=lambda r: r["headline"].get("order", 99))
    table = ["| what | result | date | source |", "|---|---|---|---|"]
    for r in rows:
        h = r["headline"]
        result = h.get("result") or f"re-run {r['date']}: no headline written for it yet, see the figures"
        table.append(f"| {_cell(h['what'])} | {_cell(result)} | {r['date']} | "
                     f"[{r['bench']}](docs/benchmarks.md#{r['bench']}) |")
    return readme[: begin + len(README_BEGIN)] + "\n" + "\n".join(table) + "\n" + readme[end:]


def write_pages(root: Path = ROOT) -> list[Path]:
    """Render ``docs/benchmarks.md`` and the README's table from ``root``'s records; return the files changed."""
    records = latest_records(root / RESULTS)
    changed = []
    for path, text in ((root / "docs/benchmarks.md", render_benchmarks(records)),
                       (root / "README.md", render_readme((root / "README.md").read_text(encoding="utf-8"),
                                                           records))):
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed


def main() -> None:
    """``python -m fedfraud.bench.records``: re-render both pages and say which changed."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    changed = write_pages()
    names = ", ".join(str(p.relative_to(ROOT)) for p in changed)
    logger.info("re-rendered: %s", names or "nothing changed")


if __name__ == "__main__":
    main()

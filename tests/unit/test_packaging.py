"""The wheel installs one top-level name, ``fedfraud``, with the product folders and their data files under it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fedfraud import __version__

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_puts_nothing_generic_into_site_packages(tmp_path: Path) -> None:
    source = tmp_path / "src"  # setuptools builds in the source folder: build a copy, not the checkout
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for name in ("fedfraud", "training", "serving", "feature_store"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "-w", str(tmp_path), str(source)], check=True,
                   capture_output=True)
    (wheel,) = tmp_path.glob("fedfraud-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"fedfraud", f"fedfraud-{__version__}.dist-info"}
    for module in ("fedfraud/training/registry.py", "fedfraud/serving/app.py", "fedfraud/feature_store/schema.py",
                   "fedfraud/feature_store/repo/feature_store.yaml",
                   "fedfraud/training/tokenizer/data/first_names.txt"):
        assert module in names
    # every source module of the mapped folders is in the wheel, under the namespace
    for top in ("training", "serving", "feature_store"):
        for path in (ROOT / top).rglob("*.py"):
            if "__pycache__" not in path.parts:
                assert f"fedfraud/{path.relative_to(ROOT).as_posix()}" in names


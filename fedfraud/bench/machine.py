"""Machine facts a benchmark prints beside its figures (this machine's speed varies 2× from day to day)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["load_average"]


def load_average() -> str:
    """``/proc/loadavg`` as written (1, 5, 15 min, runnable/total, last pid), else the three averages."""
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())

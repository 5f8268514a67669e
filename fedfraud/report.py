"""A self-contained HTML report (inline PNG plots) that a person would rather look at than read."""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedfraud.demo import DemoReport

__all__ = ["write_html_report"]


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _figures(report: DemoReport) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures: list[tuple[str, str]] = []

    fig, ax = plt.subplots(figsize=(6, 2.6))
    names = [s.name for s in report.stages]
    ax.barh(names[::-1], [s.seconds for s in report.stages][::-1], color="#3b7dd8")
    ax.set_xlabel("seconds")
    ax.set_title("Wall time per stage")
    figures.append(("Where the time went", _png(fig)))
    plt.close(fig)

    for stage in report.stages:
        for key, values in stage.plots.items():
            fig, ax = plt.subplots(figsize=(6, 2.8))
            if isinstance(values, dict):
                labels = [str(k) for k in values]
                ax.bar(labels, list(values.values()), color="#d8643b")
                ax.tick_params(axis="x", rotation=30)
            elif values and isinstance(values[0], tuple | list):
                for series in values:
                    ax.plot(*zip(*series, strict=False))
            else:
                ax.hist(values, bins=30, color="#3bd87d")
            ax.set_title(f"{stage.name}: {key}")
            figures.append((f"{stage.name} — {key}", _png(fig)))
            plt.close(fig)
    return figures


def write_html_report(report: DemoReport, path: Path) -> Path:
    """Write the demo report to ``path`` (one HTML file, images inline) and return it."""
    rows = "".join(
        f"<tr><td>{html.escape(s.name)}</td><td>{s.seconds:.1f}</td>"
        f"<td><pre>{html.escape(json.dumps(s.summary, indent=1, default=str))}</pre></td></tr>"
        for s in report.stages
    )
    images = "".join(
        f"<figure><img src='data:image/png;base64,{data}'><figcaption>{html.escape(title)}</figcaption></figure>"
        for title, data in _figures(report)
    )
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>fedfraud demo report</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top}}
pre{{margin:0;font-size:12px}}figure{{display:inline-block;margin:8px}}</style></head><body>
<h1>fedfraud demo</h1><p>Total wall time: {report.seconds:.1f} s. Output folder: {html.escape(str(report.out))}</p>
<h2>Stages</h2><table><tr><th>stage</th><th>s</th><th>figures</th></tr>{rows}</table>
<h2>Plots</h2>{images}</body></html>"""
    path.write_text(page, encoding="utf-8")
    return path

"""The operators' dashboards (issue 40, part 3): every PromQL query of ``infra/grafana/dashboards/fedfraud.json``
names a metric, and labels, that a scoring replica really exports, and the provisioning and scrape files fit.

What a replica exports is read from its own rendering, not from a list kept here: a :class:`PipelineMetrics` with
every family given a value (the drift and shadow collector with a challenger, as the hot path feeds it), rendered
through :class:`MetricsBoard` over the real SQLite KV store, which is what ``GET /metrics`` of ``fedfraud serve``
answers. A metric renamed in ``serving/metrics.py`` therefore fails here, not on an operator's empty panel.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from fedfraud.serving.config import ServingConfig
from fedfraud.serving.kvstore import SqliteKV
from fedfraud.serving.metrics import LoopFigures, MetricsBoard, PipelineMetrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "infra" / "grafana" / "dashboards" / "fedfraud.json"
PROVISIONING = ROOT / "infra" / "grafana" / "provisioning"
PROMETHEUS = ROOT / "infra" / "prometheus" / "prometheus.yml"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"

#: PromQL functions and aggregations the dashboard may call (a name followed by "(")
FUNCTIONS = {"sum", "max", "min", "avg", "count", "topk", "bottomk", "rate", "irate", "increase", "delta",
             "histogram_quantile", "label_values", "clamp_min", "clamp_max", "abs", "vector", "scalar"}
#: PromQL keywords that are not metric names
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
#: labels Prometheus itself adds to every scraped sample, and the histogram bucket bound
SCRAPE_LABELS = {"instance", "job", "le"}


def _exported(tmp_path: Path) -> tuple[set[str], set[str]]:
    """(sample names, label names) of a replica's ``/metrics`` with every family holding a sample."""
    m = PipelineMetrics()
    m.consumed.inc(3)
    m.decided.inc(2)
    m.dead.labels(reason="malformed_json").inc()
    m.redelivered.inc()
    m.http_scored.inc()
    m.retries.labels(stage="score").inc()
    m.inflight.set(0)
    m.lag.set(4)
    m.e2e.observe(0.02)
    m.stage.labels(stage="score").observe(0.01)
    m.batch_size.observe(8)
    m.set_model("fraud", "fraud:v1")
    m.watch_loop(lambda: LoopFigures(psi={"amount": 0.1}, drift_rows=10, shadow_scored=5, shadow_agreed=4,
                                     challenger="fraud:v2", side_errors={"shadow": 1}))
    text = MetricsBoard(SqliteKV(tmp_path / "state.db"), "group", "replica-a", m.render).render().decode()
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    return {s.name for s in samples}, {label for s in samples for label in s.labels}


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def _queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and every query variable."""
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]
            out.append((f"variable {var['name']}", query["query"] if isinstance(query, dict) else query))
    return out


def parse_promql(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) an expression refers to.

    A small reader for the subset the dashboard uses, enough to find every name: strings, ``[...]`` ranges and
    Grafana's ``$variables`` are dropped; names inside ``{...}`` matchers and ``by``/``without`` lists are labels;
    an identifier followed by ``(`` is a function; what is left (not a keyword or a number) is a metric name.
    """
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\[[^\]]*\]", "", text)
    labels: set[str] = set()
    for body in re.findall(r"\{([^}]*)\}", text):
        labels |= set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", body))
    text = re.sub(r"\{[^}]*\}", " ", text)
    for body in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", text):
        labels |= {name.strip() for name in body.split(",") if name.strip()}
    text = re.sub(r"\b(by|without)\s*\([^)]*\)", " ", text)
    if text.lstrip().startswith("label_values("):  # Grafana's variable function: (metric, label)
        metric, label = (p.strip() for p in text.strip()[len("label_values("):-1].split(","))
        return {metric}, labels | {label}
    metrics = set()
    for match in re.finditer(r"\$?[A-Za-z_:][A-Za-z0-9_:]*", text):
        name = match.group()
        following = text[match.end():].lstrip()[:1]
        if name.startswith("$") or name in KEYWORDS:
            continue
        if following == "(":
            assert name in FUNCTIONS, f"unknown PromQL function {name} in {expr}"
            continue
        metrics.add(name)
    return metrics, labels


def test_the_promql_reader_finds_metrics_and_labels() -> None:
    """The reader itself, on the shapes the dashboard uses (a reader that found nothing would pass anything)."""
    assert parse_promql('histogram_quantile(0.99, sum by (le, stage) (rate(a_bucket{replica=~"$replica"}'
                        '[$__rate_interval])))') == ({"a_bucket"}, {"le", "stage", "replica"})
    assert parse_promql("sum(x_total) - sum(y) / topk(10, max by (feature) (z))") == ({"x_total", "y", "z"},
                                                                                      {"feature"})
    assert parse_promql("label_values(m_total, replica)") == ({"m_total"}, {"replica"})
    with pytest.raises(AssertionError, match="unknown PromQL function"):
        parse_promql("nosuchfunction(m)")


def test_every_query_names_a_metric_and_labels_a_replica_exports(tmp_path: Path) -> None:
    names, labels = _exported(tmp_path)
    dashboard = _dashboard()
    queries = _queries(dashboard)
    assert len(queries) >= 15, queries
    problems, used = [], set()
    for where, expr in queries:
        metrics, query_labels = parse_promql(expr)
        if not metrics:
            problems.append(f"{where}: no metric in {expr!r}")
        used |= metrics
        problems += [f"{where}: {m} is not exported (serving/metrics.py)" for m in sorted(metrics - names)]
        problems += [f"{where}: label {x} is on no exported sample" for x in
                     sorted(query_labels - labels - SCRAPE_LABELS)]
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            for legend in re.findall(r"\{\{\s*([A-Za-z_]+)\s*\}\}", target.get("legendFormat", "")):
                if legend not in labels | SCRAPE_LABELS:
                    problems.append(f"panel {panel['title']!r}: legend names label {legend}, on no sample")
    assert not problems, "\n".join(problems)
    # the six: throughput, p99, DLQ by reason, lag, drift, shadow agreement
    for wanted in ("fedfraud_consumed_total", "fedfraud_decided_total", "fedfraud_end_to_end_latency_seconds_bucket",
                   "fedfraud_dead_lettered_total", "fedfraud_consumer_lag", "fedfraud_drift_psi",
                   "fedfraud_shadow_agreed_total", "fedfraud_shadow_scored_total"):
        assert wanted in used, f"no panel shows {wanted}"


def test_panels_use_the_datasource_variable_and_ids_are_unique() -> None:
    dashboard = _dashboard()
    (datasource,) = [v for v in dashboard["templating"]["list"] if v["name"] == "datasource"]
    assert (datasource["type"], datasource["query"]) == ("datasource", "prometheus")
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and panel.get("description"), panel["title"]
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24, panel["title"]


def _documented_grafana_mount() -> str:
    """Where the ``docker run`` of grafana in docs/deploy.md mounts ``infra/grafana/dashboards``."""
    text = DEPLOY_DOC.read_text(encoding="utf-8")
    commands = re.findall(r"docker run(?:[^\n\\]|\\\n|\\.)*", text)  # with its continued lines
    (grafana,) = [c for c in commands if "grafana/grafana" in c]
    argv = shlex.split(grafana.replace("\\\n", " "), comments=True)
    mounts = [argv[i + 1] for i, a in enumerate(argv) if a in ("-v", "--volume")]
    (mount,) = [m for m in mounts if m.split(":")[0].endswith("infra/grafana/dashboards")]
    return mount.split(":")[1]


def test_provisioning_points_at_the_dashboard_file_and_a_prometheus_datasource() -> None:
    (providers_file,) = (PROVISIONING / "dashboards").glob("*.yaml")
    (provider,) = yaml.safe_load(providers_file.read_text(encoding="utf-8"))["providers"]
    assert provider["type"] == "file"
    mounted_at = _documented_grafana_mount()
    assert provider["options"]["path"] == mounted_at, (provider["options"]["path"], mounted_at)
    # the folder mounted there is the repository's, and the dashboard is in it
    assert DASHBOARD.parent == ROOT / "infra" / "grafana" / "dashboards" and DASHBOARD.is_file()
    assert [p.name for p in DASHBOARD.parent.glob("*.json")] == ["fedfraud.json"]
    (datasources_file,) = (PROVISIONING / "datasources").glob("*.yaml")
    (source,) = yaml.safe_load(datasources_file.read_text(encoding="utf-8"))["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    scrape = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))
    assert source["url"].endswith(":9090")
    assert f"{scrape['global']['scrape_interval']}" == source["jsonData"]["timeInterval"]


def test_prometheus_scrapes_the_scorer_once_with_the_bearer_token_from_a_file() -> None:
    config = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["authorization"]["type"] == "Bearer"
    assert "credentials" not in job["authorization"] and job["authorization"]["credentials_file"]
    (static,) = job["static_configs"]
    # one target: any replica's /metrics already holds every replica's samples (MetricsBoard); two would double
    assert static["targets"] == [f"127.0.0.1:{ServingConfig().http_port}"]

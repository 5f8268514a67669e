"""Every replica's metrics on any replica's /metrics (fedfraud.serving.metrics.MetricsBoard over the real SQLite KV)."""

from __future__ import annotations

import json
import time

from prometheus_client.parser import text_string_to_metric_families

from fedfraud.serving.kvstore import SqliteKV
from fedfraud.serving.metrics import MetricsBoard, PipelineMetrics


def _samples(text: bytes, name: str) -> dict[str, float]:
    return {s.labels["replica"]: s.value for f in text_string_to_metric_families(text.decode())
            for s in f.samples if s.name == name}


def test_a_scrape_of_either_replica_shows_both_with_replica_labels(tmp_path):
    kv = SqliteKV(tmp_path / "state.db")
    a, b = PipelineMetrics(), PipelineMetrics()
    a.consumed.inc(5)
    b.consumed.inc(7)
    b.e2e.observe(0.02)
    board_a = MetricsBoard(kv, "g", "replica-a", a.render)
    board_b = MetricsBoard(kv, "g", "replica-b", b.render)
    board_b.publish()
    from_a, from_b = board_a.render(), board_b.render()
    assert _samples(from_a, "fedfraud_consumed_total") == {"replica-a": 5.0, "replica-b": 7.0}
    assert _samples(from_b, "fedfraud_consumed_total") == _samples(from_a, "fedfraud_consumed_total")
    assert _samples(from_a, "fedfraud_end_to_end_latency_seconds_count") == {"replica-a": 0.0, "replica-b": 1.0}


def test_a_replica_gone_quiet_drops_out_and_other_groups_never_show(tmp_path):
    kv = SqliteKV(tmp_path / "state.db")
    m = PipelineMetrics()
    MetricsBoard(kv, "other-group", "x", m.render).publish()
    stale = {"replica": "dead", "seen": time.time() - 120, "text": m.render().decode()}
    kv.put_many("metrics", [("g/dead", json.dumps(stale).encode())])
    text = MetricsBoard(kv, "g", "alive", m.render, stale_s=30).render()
    assert set(_samples(text, "fedfraud_consumed_total")) == {"alive"}

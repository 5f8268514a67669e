"""The demo's report.html (issue 40, part 2): rendered from a plain summary mapping, figures inline, content escaped,
the JSON in a collapsed appendix, no card-number-like strings."""

from __future__ import annotations

import ast
import html
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from fedfraud.report import REDACTED, render_report, scrub

SCRIPT = "<script>alert('x')</script><b>bold</b>"
CARD = "4111111111111111"


def _summary() -> dict[str, Any]:
    """A trimmed ``summary.json`` of a demo run, with hostile text in a merchant name and a policy reason."""
    return {
        "out": "/tmp/demo", "seconds": 576.6, "cpus": 2,
        "load_avg_1m": {"train anomaly": [1.2, 3.4], "serve + loop": [2.0, 2.6]},
        "stages": [
            {"name": "generate", "seconds": 1.5, "transactions": 46153, "fraud": 231, "banks": 5,
             "scenarios": {"account_takeover": 69, "card_testing": 46, "compromised_merchant": 58,
                           "lost_stolen": 58}},
            {"name": "ingest", "seconds": 0.6, "accepted": 46153, "rejected": 5,
             "rejects_by_reason": {"bad_amount": 2, "bad_timestamp": 1, "duplicate_id": 1, "lat_out_of_range": 1},
             "sample_reject": {"cardholder_id": CARD, "note": f"row for card {CARD}"}},
            {"name": "train anomaly", "seconds": 156.7, "model": "anomaly:v1", "banks": 5,
             "fraud_roc_auc_95ci": "0.914 [0.855, 0.961]", "fraud_pr_auc_95ci": "0.113 [0.014, 0.253]",
             "test_frauds": 34, "baselines_roc_auc": {"isolation_forest": 0.848, "amount_surprise": 0.736},
             "roc_auc_by_scenario": {"account_takeover": 0.968, "card_testing": 0.996,
                                     "compromised_merchant": 0.862, "lost_stolen": 0.893},
             "seconds_per_round": [20.1, 18.3, 19.0]},
            {"name": "train fraud", "seconds": 118.2, "model": "fraud:v1", "test_pr_auc": 0.5025, "test_frauds": 34,
             "test_rows": 9000, "test_roc_auc_card_testing": 0.9995, "test_roc_auc_card_testing_central": 0.9996,
             "test_roc_auc_card_testing_central_without_merchant_risk": 0.9997,
             "bank0_federation_pr_auc": 0.6632, "bank0_local_pr_auc": 0.5458,
             "bank0_federation_recall_at_fpr": 0.8333, "bank0_local_recall_at_fpr": 0.6667, "bank0_test_frauds": 6},
            {"name": "merchant risk", "seconds": 20.5,
             "guarantee": "per cardholder (ε, δ) = (1.1069, 1e-08) per daily release, ε = 10.4457 over 61 releases",
             "flagged_merchants": [f"bank 1: {SCRIPT} MIA-0077 (4.5 frauds, averaged)"],
             "breached_by_generator": ["Kirlin Store DEN-0026"], "breached_flagged": []},
            {"name": "heterogeneous banks", "seconds": 95.0,
             "schemas": {"bank 0": "shared only", "bank 1": "demographics", "bank 2": "demographics",
                         "bank 3": "merchant_history", "bank 4": "merchant_history"},
             "distinct_schemas": 3, "model": "fraud-spfd:v1", "test_pr_auc_all_banks": 0.2419,
             "test_pr_auc_bank1": 0.0474, "served_bank": 1, "served_by": "fraud-spfd:v1", "served": 2873,
             "live_frauds": 50, "flagged": 21, "served_pr_auc": 0.583, "served_cpu_ms_per_tx": 0.752},
            {"name": "serve + loop", "seconds": 265.5, "produced": 3480, "decided": 3480, "missing": 0,
             "dead_lettered": 2, "dlq_reasons": ["malformed", SCRIPT], "dlq_by_reason": {"malformed": 1, SCRIPT: 1},
             "offered_tx_per_s": 250.0, "achieved_tx_per_s": 249.1, "latency_p50_ms": 33.4, "latency_p99_ms": 156.1,
             "latency_by_part": {
                 "champion alone": {"n": 1731, "p50_ms": 22.1, "p99_ms": 61.8, "max_ms": 78.9,
                                    "produced_to_picked_p99_ms": 35.1, "picked_to_decided_p99_ms": 36.1},
                 "challenger shadowing": {"n": 1749, "p50_ms": 56.8, "p99_ms": 167.5, "max_ms": 196.7,
                                          "produced_to_picked_p99_ms": 100.7, "picked_to_decided_p99_ms": 95.5}},
             "frauds_streamed": 33, "flagged": 25, "precision": 0.96, "recall": 0.7273, "f1": 0.8276,
             "pr_auc": 0.8817, "confusion": {"tp": 24, "fp": 1, "fn": 9, "tn": 3446},
             "labels_sent": 2991, "labels_joined": 2991, "labels_duplicate": 0,
             "drift_after_champion": {"features": 43, "max_psi": 0.193, "top": {"tx_count_7d": 0.193}},
             "drift_after_loop": {"features": 43, "max_psi": 0.212, "top": {"n_prior": 0.212}},
             "cycle": {"trigger": "schedule", "seconds": 163.3, "anomaly": "anomaly:v2", "fraud": "fraud:v2"},
             "drift_psi_threshold": 0.25,
             "policy": {"action": "keep",
                        "reason": f"champion kept: challenger PR-AUC 0.896 vs 0.820 (difference +0.076, 95% CI "
                                  f"[-0.000, +0.863]); {SCRIPT}; 12 labelled frauds",
                        "evidence": {"transactions": 1749, "frauds": 12,
                                     "pr_auc": {"champion": 0.8203, "challenger": 0.8961, "difference": 0.0758,
                                                "difference_95ci": [-0.0004, 0.8631]},
                                     "recall_at_fpr": {"champion": 0.75, "challenger": 0.8333, "difference": 0.0833,
                                                       "difference_95ci": [-0.1, 0.25]}}}},
        ],
    }


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = render_report(_summary(), tmp_path_factory.mktemp("report") / "report.html")
    return path.read_text(encoding="utf-8")


def test_report_has_figures_and_headline_cards(page: str) -> None:
    figures = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(figures) >= 6 and page.count("<img") == len(figures)
    assert all(len(f) > 2000 for f in figures)  # real PNGs, not empty placeholders
    ids = set(re.findall(r'<figure id="fig-([\w-]+)"', page))
    assert {"latency", "confusion", "scenarios", "anomaly", "policy", "drift", "rejects", "stage-seconds",
            "rounds"} <= ids
    headline = page[page.index('<section id="headline">'):page.index("</section>")]
    cards = re.findall(r'<div class="card (\w+)">', headline)
    assert len(cards) >= 6
    # each figure against its target: the stream's p99 misses 50 ms, the GNN misses 0.93, FL beats Local
    assert re.search(r"156\.1 ms</div>\s*<div class=\"target\">target ≤ 50 ms · <span class=\"status\">missed",
                     headline)
    assert re.search(r"0\.914</div>\s*<div class=\"target\">target ≥ 0\.93 · <span class=\"status\">missed", headline)
    assert "95% interval [0.855, 0.961] on 34 test frauds" in headline
    assert "34 test frauds in 9,000 rows, base rate 0.38%" in headline
    assert "(ε, δ) = (1.1069, 1e-08)" in headline
    assert "Load average (1 min) 2.0 → 2.6 during this stage on 2 CPUs" in headline
    assert "2,873 decided by bank 1" in headline and "3 schemas across 5 banks" in headline
    assert "served PR-AUC 0.583 on 50 live frauds" in headline
    assert "keep</div>" in headline and "+0.076, 95% CI [-0.000, +0.863], 12 labelled frauds" in headline


def test_report_escapes_content(page: str) -> None:
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&lt;b&gt;bold&lt;/b&gt;" in page
    # in the merchant list, the policy reason and the dead-letter reasons, not only in the JSON appendix
    body = page[:page.index('<section id="appendix">')]
    assert body.count("&lt;script&gt;") >= 3


def test_report_keeps_the_json_in_a_collapsed_appendix(page: str) -> None:
    match = re.search(r"<details>\s*<summary>.*?</summary>\s*<pre>(.*?)</pre>\s*</details>", page, re.S)
    assert match is not None and "<details open" not in page
    appendix = json.loads(html.unescape(match[1]))
    assert appendix == json.loads(json.dumps(scrub(_summary())))
    assert appendix["stages"][-1]["policy"]["action"] == "keep"
    # the stage table shows figures, not the JSON dump the old report had
    stages = page[page.index('<section id="stages">'):page.index('<section id="appendix">')]
    assert "<pre>" not in stages and "frauds_streamed</b>: 33" in stages


def test_report_holds_no_card_numbers(page: str) -> None:
    assert CARD not in page
    assert re.search(r"(?<!\d)\d{13,19}(?!\d)", page) is None
    assert page.count(REDACTED) >= 2  # the cardholder_id value and the number inside the note


def test_scrub_redacts_card_keys_and_digit_runs() -> None:
    out = scrub({"cardholder_id": "abc", "Cardholder_ID": 12, "x": [f"pan {CARD}!", 4111111111111111, 123456],
                 "nested": {"cc_num": CARD, "amount": 12.5, "ok": "ref 123456789012"}})
    assert out == {"cardholder_id": REDACTED, "Cardholder_ID": REDACTED, "x": [f"pan {REDACTED}!", REDACTED, 123456],
                   "nested": {"cc_num": REDACTED, "amount": 12.5, "ok": "ref 123456789012"}}


def test_report_with_raw_arrays_draws_histograms_and_curves(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    y = np.zeros(400, bool)
    y[::40] = True
    extra = {"latency_ms": {"champion alone": rng.gamma(4, 6, 200), "challenger shadowing": rng.gamma(4, 12, 200)},
             "stream_labels": y, "stream_scores": rng.random(400) * 0.5 + y * 0.5}
    page = render_report(_summary(), tmp_path / "r.html", extra).read_text(encoding="utf-8")
    assert 'id="fig-stream-curves"' in page
    assert "Histogram of every streamed transaction&#39;s latency" in page
    assert "keeps no raw latencies" not in page


def test_report_from_an_old_summary_reads_figures_back(tmp_path: Path) -> None:
    """A summary written before the demo kept the confusion counts, dead-letter counts, policy evidence and load."""
    summary = _summary()
    stream = summary["stages"][-1]
    for key in ("confusion", "dlq_by_reason", "drift_psi_threshold"):
        del stream[key]
    del stream["policy"]["evidence"]
    stream["dlq_reasons"] = ["malformed", "missing_field"]
    del summary["load_avg_1m"]
    page = render_report(summary, tmp_path / "r.html").read_text(encoding="utf-8")
    assert "</b> 24 frauds caught, 9 missed, 1 genuine declined of 3,447 genuine" in page  # from precision and recall
    assert "Machine load not recorded in this summary" in page
    assert 'id="fig-policy"' in page and 'id="fig-rejects"' in page  # the interval read back from the reason
    assert "+0.076, 95% CI [-0.000, +0.863], 12 labelled frauds" in page
    assert len(re.findall(r"<img ", page)) >= 6


def test_report_does_not_import_the_demo() -> None:
    import fedfraud.report

    tree = ast.parse(Path(fedfraud.report.__file__).read_text(encoding="utf-8"))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(m and m.startswith("fedfraud") for m in imported)


def test_demo_decision_quality_counts_agree_with_its_precision_and_recall() -> None:
    from fedfraud.config import FedfraudConfig
    from fedfraud.demo import _decision_quality

    n = 300
    live = pd.DataFrame({"transaction_id": [f"t{i}" for i in range(n)],
                         "is_fraud": pd.array([i % 30 == 0 for i in range(n)], dtype="boolean")})
    live.loc[1, "is_fraud"] = pd.NA  # unlabelled: counted genuine
    rng = np.random.default_rng(3)
    scores = rng.random(n) * 0.6 + np.array([0.4 if i % 30 == 0 else 0.0 for i in range(n)])
    first = {f"t{i}": {"score": float(scores[i]), "decision": "fraud" if scores[i] >= 0.55 else "approve"}
             for i in range(n) if i != 7}  # one transaction never decided
    summary, y, score = _decision_quality(FedfraudConfig(), live, first)
    c = summary["confusion"]
    assert sum(c.values()) == len(y) == len(score) == n - 1
    assert c["tp"] + c["fn"] == summary["frauds_streamed"] == int(y.sum()) == 10
    assert summary["precision"] == round(c["tp"] / (c["tp"] + c["fp"]), 4)
    assert summary["recall"] == round(c["tp"] / (c["tp"] + c["fn"]), 4)

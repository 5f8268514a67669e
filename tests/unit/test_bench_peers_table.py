"""The ``bench serving --peers`` table: ratios to the plain peer's median, and each target met or missed."""

from __future__ import annotations

from fedfraud.bench.serving import PEER_VARIANTS, PeersResult


def _block(variant: str, rnd: int, tx_s: float, cpu: float, p99: float) -> dict:
    loads = {rate: {"p50_ms": p99 / 2, "p99_ms": p99, "achieved": rate, "missing": 0, "cpu": {"scoring replicas": 0.5}}
             for rate in (250.0, 1000.0)}
    return {"variant": variant, "round": rnd, "sustained_tx_s": tx_s, "cpu_ms_tx": cpu, "process_cpu_ms_tx": cpu,
            "loads": loads}


def test_ratios_are_medians_over_the_peers_median_and_targets_say_met_or_missed() -> None:
    peer, off, full, gnn, h2v = PEER_VARIANTS
    result = PeersResult(blocks=[
        _block(peer, 0, 1000, 0.1, 10), _block(off, 0, 900, 0.15, 12), _block(full, 0, 700, 0.3, 15),
        _block(gnn, 0, 600, 0.5, 16), _block(h2v, 0, 650, 0.4, 15),
        _block(peer, 1, 3000, 0.1, 30), _block(off, 1, 1000, 0.15, 40), _block(full, 1, 500, 0.1, 50),
        _block(gnn, 1, 400, 0.3, 60), _block(h2v, 1, 450, 0.2, 55),
    ], backlog=100, seconds=1)
    r = result.ratios(full)
    assert r["sustained_tx_s"] == 600 / 2000  # medians: 600 against 2,000
    assert r["cpu_ms_tx"] == 0.2 / 0.1
    assert r["p99@1000"] == 32.5 / 20
    text = result.to_markdown()
    assert "| throughput ≥ 60% of the peer's | ×0.30 | missed by 50% of the bound" in text
    assert "| p99 at 1,000 tx/s ≤ 2× the peer's | ×1.62 | met" in text
    assert "| replica CPU per transaction ≤ 2× the peer's | ×2.00 | met" in text
    # issue 38: the GNN fraud model against XGBoost on the full hot path (medians 0.4 against 0.2)
    assert "| replica CPU per transaction with the GNN fraud model ≤ 2× with XGBoost | ×2.00 | met" in text
    assert "| replica CPU per transaction with G-HIN2Vec columns, against XGBoost alone | ×1.50 | no target |" in text


def test_the_per_stage_table_gives_each_sections_median_and_a_dash_where_a_variant_has_none() -> None:
    peer, off, full, gnn, h2v = PEER_VARIANTS
    blocks = [_block(v, r, 1000, 0.1, 10) for r in (0, 1) for v in PEER_VARIANTS]
    for b in blocks:
        b["sections_ms_tx"] = {"fraud.model": 0.01 * (b["round"] + 1)}
        if b["variant"] == full:
            b["sections_ms_tx"]["anomaly.gnn_embed"] = 0.05 * (b["round"] + 1)
    text = PeersResult(blocks=blocks, backlog=100, seconds=1).to_markdown()
    assert "| anomaly.gnn_embed | – | – | 0.0750 | – | – |" in text
    assert "| fraud.model | 0.0150 | 0.0150 | 0.0150 | 0.0150 | 0.0150 |" in text

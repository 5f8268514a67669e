"""The next-event head's scoring rule: −log P(x) per head, or the upper tail −log P(X ≥ x) for the named heads."""

import json

import pytest
import torch

from fedfraud.training.anomaly.config import HEAD_SIZES, AnomalyConfig
from fedfraud.training.anomaly.heads import NextEventHead

HEADS = ("category", "amount", "amount-rel")


@pytest.fixture
def head_and_q():
    torch.manual_seed(0)
    head = NextEventHead(q_dim=8, hidden=16, heads=HEADS, dropout=0.0).eval()
    return head, torch.randn(5, 8)


def _targets(n, **fixed):
    return {h: torch.full((n,), fixed.get(h, 3), dtype=torch.long) for h in HEADS}


def test_two_sided_surprise_is_the_summed_nll(head_and_q):
    head, q = head_and_q
    targets = {h: torch.randint(0, HEAD_SIZES[h], (5,)) for h in HEADS}
    expected = sum(head.nll(q, targets).values())
    assert torch.allclose(head.surprise(q, targets), expected, atol=1e-5)


def test_upper_tail_is_minus_log_of_the_mass_at_or_above_the_observed_bin(head_and_q):
    head, q = head_and_q
    upper = frozenset({"amount-rel"})
    with torch.no_grad():
        probs = torch.softmax(head(q)["amount-rel"], dim=-1)
        others = {h: torch.full((5,), 3, dtype=torch.long) for h in ("category", "amount")}
        rest = sum(head.nll(q, {**others, "amount-rel": torch.zeros(5, dtype=torch.long)}).values()) - head.nll(
            q, {**others, "amount-rel": torch.zeros(5, dtype=torch.long)})["amount-rel"]
        previous = None
        for k in range(HEAD_SIZES["amount-rel"]):
            got = head.surprise(q, _targets(5, **{"amount-rel": k}), upper) - rest
            want = -torch.log(probs[:, k:].sum(dim=-1))
            assert torch.allclose(got, want, atol=1e-4), k
            if previous is not None:  # a larger amount is never less surprising
                assert (got >= previous - 1e-6).all(), k
            previous = got
        lowest = head.surprise(q, _targets(5, **{"amount-rel": 0}), upper) - rest
        assert torch.allclose(lowest, torch.zeros(5), atol=1e-5)  # the smallest bin is no surprise at all


def test_upper_tail_names_real_heads_and_ignores_absent_ones():
    assert AnomalyConfig().upper_tail == "amount" and AnomalyConfig(upper_tail="amount, amount-rel").upper_tail
    assert AnomalyConfig(heads="category").upper_tail == "amount"  # a variant without the head: not scored
    with pytest.raises(ValueError, match="not a next-event head"):
        AnomalyConfig(upper_tail="amout")


def test_a_published_spec_without_the_key_scores_two_sided(tmp_path):
    """A model published before ``upper_tail`` existed keeps its scoring rule (its fraud model stacked on it)."""
    from fedfraud.feature_store.config import EgoGraphConfig, EncoderConfig
    from fedfraud.training.anomaly.scorer import AnomalyScorer, publish_anomaly_model
    from fedfraud.training.anomaly.model import AnomalyModel
    from fedfraud.training.registry import ModelRegistry

    cfg = AnomalyConfig(hidden=16, disc_hidden=8, upper_tail="amount")
    enc, ego = EncoderConfig(dim=16, merchant_buckets=64), EgoGraphConfig()
    model = AnomalyModel(cfg, enc, ego.max_nodes)
    reg = ModelRegistry(tmp_path)
    version = publish_anomaly_model(reg, model.state_dict(), anomaly_cfg=cfg, encoder_cfg=enc, ego_cfg=ego,
                                    config={}, metrics={}, privacy={}, card="test")
    assert AnomalyScorer.from_registry(reg).model.cfg.upper_tail == "amount"
    spec_file = version.path / "model.json"
    spec = json.loads(spec_file.read_text())
    del spec["anomaly"]["upper_tail"]
    spec_file.write_text(json.dumps(spec))
    assert AnomalyScorer.from_registry(reg).model.cfg.upper_tail == ""

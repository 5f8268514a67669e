"""One real Flower simulation on Ray: 3 SuperNodes, 2 institutions with seeded PII, one node with no data."""

import json

import pytest

from fedfraud.training.tokenizer.bpe import reference_bpe, words_to_bytes
from fedfraud.training.tokenizer.config import TokenizerConfig
from fedfraud.training.tokenizer.corpus import generate_corpus, group_by_client, write_jsonl
from fedfraud.training.tokenizer.pretokenize import CorpusPipeline
from fedfraud.training.tokenizer.trainer import train_federated_flower

pytestmark = pytest.mark.integration


def test_flower_fedbpe_matches_reference_and_server_sees_no_pii(tmp_path):
    docs = generate_corpus(2, 12, pii_rate=1.0, seed=5)
    corpus = write_jsonl(tmp_path / "corpus.jsonl", docs)
    audit = tmp_path / "audit.jsonl"
    n_merges = 12
    cfg = TokenizerConfig(vocab_size=256 + n_merges + 1, mode="single", theta=0, p=1.0, k_fraction=1.0, top_n=None)
    run = train_federated_flower(cfg, corpus, num_supernodes=3, audit_path=audit, privacy=False)
    assert run.privacy["privacy"].startswith("OFF (--no-privacy)")

    pipe = CorpusPipeline()
    pooled: dict[bytes, int] = {}
    for texts in group_by_client(docs).values():
        for w, c in words_to_bytes(pipe.count_words(texts)[0]).items():
            pooled[w] = pooled.get(w, 0) + c
    assert run.merges == reference_bpe(pooled, n_merges)
    assert run.rounds == n_merges and run.stop_reason == "target vocabulary reached"

    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert {r["phase"] for r in records} == {"single", "pair"}
    assert len({r["node"] for r in records}) == 3  # the empty node answered (NVL) without failing the round
    received = json.dumps([r["keys"] for r in records], ensure_ascii=False)
    pii_values = {d.text[s.start : s.end] for d in docs for s in d.pii}
    assert len(pii_values) > 10
    for value in pii_values:
        assert value not in received, value
    # distinctive name parts never reach the server either
    names = {part for d in docs for s in d.pii if s.label == "PERSON" for part in d.text[s.start : s.end].split()}
    tokens = {t.strip() for r in records for k in r["keys"] for t in ([k] if isinstance(k, str) else k)}
    assert not {n for n in names if len(n) > 3} & tokens

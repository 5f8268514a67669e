"""The FedByteBPE Flower apps on both engines: Flower's simulation on Ray and the in-process loopback grid (3
SuperNodes, 2 institutions with seeded PII, one node with no data), and the two engines' merges side by side."""

import json

import pytest

from fedfraud.training.tokenizer.bpe import reference_bpe, words_to_bytes
from fedfraud.training.tokenizer.config import TokenizerConfig
from fedfraud.training.tokenizer.corpus import generate_corpus, group_by_client, write_jsonl
from fedfraud.training.tokenizer.pretokenize import CorpusPipeline
from fedfraud.training.tokenizer.trainer import train_federated_flower

pytestmark = pytest.mark.integration


# the Ray simulation engine runs in `make test` in the engines test below (noise on, merges equal to the loopback
# grid's); its own privacy-off run against the reference is one more Ray start-up (~10 s), so `make test-long`
@pytest.mark.parametrize("engine", [pytest.param("simulation", marks=pytest.mark.long), "loopback"])
def test_flower_fedbpe_matches_reference_and_server_sees_no_pii(tmp_path, engine):
    docs = generate_corpus(2, 12, pii_rate=1.0, seed=5)
    corpus = write_jsonl(tmp_path / "corpus.jsonl", docs)
    audit = tmp_path / "audit.jsonl"
    n_merges = 12
    cfg = TokenizerConfig(vocab_size=256 + n_merges + 1, mode="single", theta=0, p=1.0, k_fraction=1.0, top_n=None,
                          engine=engine)
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


def test_engines_choose_the_same_merges_under_noise(tmp_path):
    """Same seed, noise on, batched rounds: the loopback grid and the Ray simulation run the same ServerApp and
    ClientApp, each client's noise is drawn from (seed, partition, round, phase), and the server sums the releases
    in an order fixed by their content, whatever order they arrive in (``aggregate_arrays``): both engines choose
    the same merges in the same order.
    """
    docs = generate_corpus(3, 20, pii_rate=0.5, seed=11, multilingual=True)
    corpus = write_jsonl(tmp_path / "corpus.jsonl", docs)
    cfg = TokenizerConfig(vocab_size=256 + 160 + 1, merges_per_round=32, epsilon=1.0, max_doc_bytes=256, seed=3)
    runs = {e: train_federated_flower(cfg.model_copy(update={"engine": e}), corpus, num_supernodes=3)
            for e in ("loopback", "simulation")}
    assert runs["loopback"].rounds >= 4  # several rounds of broadcasts and catch-up, not one
    assert runs["loopback"].merges == runs["simulation"].merges
    assert runs["loopback"].privacy == runs["simulation"].privacy


@pytest.mark.long  # one more Ray start-up (~20 s) for one round: `make test-long`; the loopback half runs in
# tests/unit/test_tokenizer_histogram.py (loopback merges == the in-process driver's)
def test_histogram_mode_chooses_the_same_merges_on_both_engines(tmp_path):
    """Histogram mode: one query round through the same ServerApp and ClientApp; each client's noise comes from
    (seed, partition id), and the server sums the releases in an order fixed by their content, so both engines and
    the in-process driver train on the same table and choose the same merges; the card is the same.
    """
    docs = generate_corpus(3, 60, pii_rate=0.5, seed=11, multilingual=True)
    corpus = write_jsonl(tmp_path / "corpus.jsonl", docs)
    cfg = TokenizerConfig(mode="histogram", vocab_size=256 + 400 + 1, epsilon=8.0, histogram_words=16, seed=3)
    runs = {e: train_federated_flower(cfg.model_copy(update={"engine": e}), corpus, num_supernodes=3)
            for e in ("loopback", "simulation")}
    assert runs["loopback"].rounds == runs["simulation"].rounds == 1
    assert len(runs["loopback"].merges) > 20
    assert runs["loopback"].merges == runs["simulation"].merges
    assert runs["loopback"].privacy == runs["simulation"].privacy
    assert runs["loopback"].privacy["releases_per_client"] == 1

"""Histogram mode (``tokenizer.mode: histogram``): the per-document contribution bound, σ and τ against dp-accounting,
rare words staying unreleased, what a client's Flower message holds on the loopback grid, and the card."""

import math
from collections import Counter

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant
from flwr.common.serde import message_from_proto, message_to_proto
from scipy.stats import norm

from fedfraud.cli.app import main
from fedfraud.training.fraud.gnn.loopback import LoopbackGrid
from fedfraud.training.registry import ModelRegistry
from fedfraud.training.tokenizer.config import TokenizerConfig
from fedfraud.training.tokenizer.corpus import generate_corpus, group_by_client, write_jsonl
from fedfraud.training.tokenizer.federated.task import array_of, client_names
from fedfraud.training.tokenizer.histogram import (
    calibrate,
    client_histogram,
    histogram_release,
    pack_words,
    unpack_words,
)
from fedfraud.training.tokenizer.pretokenize import CorpusPipeline, document_contribution
from fedfraud.training.tokenizer.noise import TEST_NOISE_SEED_ENV
from fedfraud.training.tokenizer.privacy import default_delta, tokenizer_privacy
from fedfraud.training.tokenizer.trainer import histogram_mechanism, train_federated_flower, train_federated_inprocess

DOCS = [d.text for d in generate_corpus(1, 12, pii_rate=0.0, seed=2, multilingual=True)]


def test_a_document_contributes_to_at_most_k_words_each_at_most_c_times():
    words = ["a", " b", " a", " c", " b", " d", " e", " a", " f", " g"] * 3
    once = document_contribution(words, max_words=4, max_count=1)
    assert once == Counter({"a": 1, " b": 1, " a": 1, " c": 1})  # the first 4 distinct words, once each
    twice = document_contribution(words, max_words=4, max_count=2)
    assert set(twice) == set(once) and max(twice.values()) == 2
    assert document_contribution(words) == words  # no bound: every occurrence

    pipe = CorpusPipeline()
    k, c = 8, 1
    full, _ = pipe.count_word_bytes(DOCS, 256, k, c)
    assert len(set().union(*(pipe.count_word_bytes([d], 256)[0] for d in DOCS))) > 8 * len(DOCS) // 2
    for i in range(len(DOCS)):  # neighbours: one document fewer moves at most k counts, each by at most c
        without, _ = pipe.count_word_bytes(DOCS[:i] + DOCS[i + 1 :], 256, k, c)
        diff = {w: full.get(w, 0) - without.get(w, 0) for w in set(full) | set(without)}
        changed = [v for v in diff.values() if v]
        assert 0 < len(changed) <= k and all(0 < v <= c for v in changed)
        assert math.sqrt(sum(v * v for v in changed)) <= c * math.sqrt(k)  # the L2 sensitivity σ is calibrated for


@pytest.mark.parametrize(("epsilon", "delta", "k", "c"), [(1.0, 1e-5, 64, 1), (8.0, 8e-6, 64, 1), (4.0, 1e-6, 16, 2)])
def test_sigma_and_tau_meet_the_targets_by_dp_accounting(epsilon, delta, k, c):
    mech = calibrate(epsilon, delta, k, c)
    multiplier = mech.sigma / (c * math.sqrt(k))
    # dp-accounting's PLD at its default (finer) grid, and its RDP accountant (looser), for the calibrated σ
    pld = PLDAccountant()
    pld.compose(dp_accounting.GaussianDpEvent(multiplier))
    assert pld.get_epsilon(mech.delta_gaussian) <= epsilon * (1 + 1e-4)
    assert mech.epsilon <= epsilon
    rdp = RdpAccountant()
    rdp.compose(dp_accounting.GaussianDpEvent(multiplier))
    assert rdp.get_delta(epsilon) >= mech.delta_gaussian * 0.5  # σ is not looser than the Gaussian needs
    # the selection: k words of the document's own, each with a count <= c, cross τ with probability δ_sel
    assert k * norm.sf((mech.tau - c) / mech.sigma) == pytest.approx(mech.delta_selection, rel=1e-6)
    assert mech.delta_gaussian + mech.delta_selection <= delta * (1 + 1e-9)
    # σ is the smallest that meets ε: 2% less noise breaks it
    smaller = PLDAccountant()
    smaller.compose(dp_accounting.GaussianDpEvent(multiplier * 0.98))
    assert smaller.get_epsilon(mech.delta_gaussian) > epsilon


def test_a_word_few_documents_hold_is_essentially_never_released():
    mech = calibrate(8.0, 1e-5, 64)
    rng = np.random.default_rng(2024)
    rare = {f"w{i}".encode(): 1 for i in range(200_000)}  # held by one document each
    assert histogram_release(rare, mech, rng).words == []  # P(release) = δ_sel / k ≈ 8e-8 each
    few = {f"w{i}".encode(): 5 for i in range(20_000)}  # five documents each, still well below τ
    share = len(histogram_release(few, mech, rng).words) / len(few)
    assert share < 1e-3 and share == pytest.approx(norm.sf((mech.tau - 5) / mech.sigma), abs=1e-3)
    common = {f"w{i}".encode(): int(mech.tau + 4 * mech.sigma) for i in range(1_000)}
    assert len(histogram_release(common, mech, rng).words) > 990  # the frequent words do get through


def test_words_travel_as_bytes_and_come_back_unchanged():
    words = [b" a", "é".encode(), b"", b"\xff\xfe", " 日本".encode()]
    assert unpack_words(*pack_words(words)) == words


def _recording_replies(patch):
    """Every reply as it crossed the loopback grid's wire (the grid still delivers as always)."""
    seen = []
    pull = LoopbackGrid.pull_messages

    def recording(self, message_ids):
        replies = list(pull(self, message_ids))
        seen.extend(message_from_proto(message_to_proto(r)) for r in replies)
        return replies

    patch.setattr(LoopbackGrid, "pull_messages", recording)
    return seen


def test_a_clients_message_holds_only_words_over_tau_with_noisy_counts(tmp_path, monkeypatch):
    docs = generate_corpus(3, 80, pii_rate=0.5, seed=11, multilingual=True)
    corpus = write_jsonl(tmp_path / "corpus.jsonl", docs)
    cfg = TokenizerConfig(mode="histogram", vocab_size=600, epsilon=8.0, histogram_words=16, engine="loopback",
                          seed=5)
    seen = _recording_replies(monkeypatch)
    run = train_federated_flower(cfg, corpus, num_supernodes=3)
    mech = histogram_mechanism(cfg, len(docs))
    assert run.rounds == 1 and len(seen) == 3  # one query round, one reply per client
    by_client = group_by_client(docs)
    names = client_names(corpus)
    released = 0
    for reply in seen:
        assert set(reply.content) <= {"release", "words"}  # no document counts, no metrics
        assert dict(reply.content["release"]) == {"applied": 0}
        if "words" not in reply.content:
            continue
        arrays = reply.content["words"]
        assert set(arrays) == {"bytes", "lengths", "values"}  # the words above τ and their values: nothing else
        words = unpack_words(array_of(arrays["bytes"]), array_of(arrays["lengths"]))
        values = array_of(arrays["values"])
        assert len(words) == len(values) and np.all(values > mech.tau)
        assert np.all(values != np.round(values))  # noisy, not the counts
        partition = reply.metadata.src_node_id - 1
        held, _ = client_histogram(CorpusPipeline(), by_client[names[partition]], cfg.max_doc_bytes, mech)
        assert set(words) <= set(held)  # a word no document holds is never released
        assert all(held[w] > mech.tau - 6 * mech.sigma for w in words)
        assert len(held) > 3 * len(words)  # most words stayed home, and nothing about them was sent
        released += len(words)
    assert released > 10
    # the in-process driver draws the same noise and trains on the same table: the same merges
    assert train_federated_inprocess(cfg, by_client).merges == run.merges


def test_outside_the_suite_the_noise_is_fresh_entropy_that_no_query_can_seed(tmp_path, monkeypatch):
    """The server must not be able to recompute a client's noise: no seed travels in the query, and two runs of
    the same corpus and config release different noisy values for the same words.
    """
    monkeypatch.delenv(TEST_NOISE_SEED_ENV)
    docs = generate_corpus(3, 80, pii_rate=0.5, seed=11, multilingual=True)
    corpus = write_jsonl(tmp_path / "corpus.jsonl", docs)
    cfg = TokenizerConfig(mode="histogram", vocab_size=400, epsilon=8.0, histogram_words=16, engine="loopback")
    seen = _recording_replies(monkeypatch)
    sent = []
    push = LoopbackGrid.push_messages

    def recording_queries(self, messages):
        messages = list(messages)
        sent.extend(m.content["config"] for m in messages)
        return push(self, messages)

    monkeypatch.setattr(LoopbackGrid, "push_messages", recording_queries)
    runs = []
    for _ in range(2):
        seen.clear()
        train_federated_flower(cfg, corpus, num_supernodes=3)
        runs.append({(r.metadata.src_node_id, w): v for r in seen if "words" in r.content
                     for w, v in zip(unpack_words(array_of(r.content["words"]["bytes"]),
                                                  array_of(r.content["words"]["lengths"])),
                                     array_of(r.content["words"]["values"]), strict=True)})
    assert sent and all("seed" not in c for c in sent)
    common = set(runs[0]) & set(runs[1])
    assert len(common) > 10 and all(runs[0][k] != runs[1][k] for k in common)


def test_card_of_a_histogram_run_and_a_vocabulary_that_ran_out(tmp_path, capsys):
    mech = calibrate(8.0, 1e-4, 64)
    card = tokenizer_privacy(mech.privacy(), documents=1000, delta=None, noise=True, max_doc_bytes=1024)
    assert card["privacy"] == "on" and card["releases_per_client"] == 1
    assert card["epsilon"] == pytest.approx(8.0, rel=1e-3) and card["delta"] == pytest.approx(1e-4)
    assert card["k"] == 64 and card["c"] == 1 and card["sigma"] == mech.sigma and card["tau"] == mech.tau
    assert "Gaussian" in card["accountant"] and "one document" in card["unit_of_privacy"]
    assert "N(0, σ²)" in card["mechanism"] and "note" not in card

    argv = ["--set", "tokenizer.clients=3", "--set", "tokenizer.docs_per_client=40", "--set",
            "tokenizer.mode=histogram", "--set", "tokenizer.epsilon=8", "--set", "tokenizer.histogram_words=16",
            "--set", "tokenizer.vocab_size=2000", "tokenizer", "train", "--backend", "inprocess", "--registry",
            str(tmp_path / "reg"), "--work", str(tmp_path / "work")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    version = ModelRegistry(tmp_path / "reg").get("tokenizer", "latest")
    assert "over all 1 release of a client" in out and "τ = " in version.model_card
    assert version.privacy["releases_per_client"] == 1 and version.privacy["delta"] == pytest.approx(
        default_delta(version.privacy["documents"]))
    assert "**Vocabulary**: reached" in version.model_card and "ran out of pairs" in version.model_card

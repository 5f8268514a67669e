"""The tokenizer's document-level DP: the per-document bound, dense releases, the noise scale and the composition."""

import numpy as np
import pytest

from fedfraud.cli.app import main
from fedfraud.training.registry import ModelRegistry
from fedfraud.training.tokenizer.bpe import ClientState, ReleaseParams, words_to_bytes
from fedfraud.training.tokenizer.corpus import generate_corpus
from fedfraud.training.tokenizer.pretokenize import CorpusPipeline
from fedfraud.training.tokenizer.privacy import composed_epsilon, default_delta, tokenizer_privacy

BOUND = 64
DOCS = [d.text for d in generate_corpus(1, 12, pii_rate=0.0, seed=2)]


def _state(docs, bound=BOUND):
    return ClientState(words_to_bytes(CorpusPipeline().count_words(docs, bound)[0]))


def _l1(a, b):
    return sum(abs(a.get(k, 0) - b.get(k, 0)) for k in set(a) | set(b))


def test_one_document_moves_a_release_by_at_most_the_bound():
    full = _state(DOCS)
    assert sum(len(w) * c for w, c in zip(full.words, full.freqs.tolist(), strict=True)) <= BOUND * len(DOCS)
    for i in range(len(DOCS)):
        without = _state(DOCS[:i] + DOCS[i + 1 :])
        assert _l1(full.unigrams, without.unigrams) <= BOUND
        assert _l1(full.pairs, without.pairs) <= BOUND
    assert _l1(_state(DOCS, None).unigrams, _state(DOCS[1:], None).unigrams) > BOUND  # unbounded, it is larger


def test_noisy_release_covers_the_public_domain_whatever_the_client_holds():
    params = ReleaseParams(epsilon=1.0, sensitivity=BOUND)
    rng = np.random.default_rng(0)
    full, one = _state(DOCS), _state(DOCS[:1])
    for phase, allowed in (("single", None), ("pair", [101, 104, 116, 32, 260])):
        a = full.release(phase, params, rng, allowed)
        b = one.release(phase, params, rng, allowed)
        assert sorted(a.keys) == sorted(b.keys)  # which keys are sent says nothing about the documents
    assert len(full.release("single", params, rng).keys) == 256
    empty = ClientState({})
    assert len(empty.release("pair", params, rng, [101, 104]).keys) == 4


def test_noise_scale_is_bound_over_epsilon():
    state = _state(DOCS)
    eps = 0.5
    rel = state.release("single", ReleaseParams(epsilon=eps, sensitivity=BOUND), np.random.default_rng(1))
    noise = np.array([v - state.unigrams.get(k, 0) for k, v in rel.as_dict().items()])
    # Laplace(b): mean |x| = b; 256 draws, 4 standard errors
    assert abs(np.abs(noise).mean() - BOUND / eps) < 4 * (BOUND / eps) / np.sqrt(len(noise))


def test_composition_over_releases():
    eps = [composed_epsilon(1.0, r, 1e-6) for r in (1, 10, 100, 400)]
    assert all(a < b for a, b in zip(eps, eps[1:], strict=False))
    assert eps[0] == pytest.approx(1.0, abs=1e-3)  # one Laplace release is pure 1-DP
    assert eps[1] == pytest.approx(9.999, abs=1e-2)  # dp-accounting PLD, 10 × Laplace(1), δ = 1e-6 (pinned)
    assert eps[3] < 400 * 1.0  # tighter than basic composition for many releases
    assert composed_epsilon(0.01, 400, 1e-6) < 0.5 * 400 * 0.01  # and much tighter for small per-release ε
    assert default_delta(4883) < 1 / 4883


def test_card_of_a_run_with_and_without_privacy():
    raw = {"epsilon_per_release": 1.0, "sensitivity": 1024, "noise_scale": 1024.0, "p": 1.0, "pair_tokens": 128,
           "max_releases_per_client": 40}
    on = tokenizer_privacy(raw, documents=1000, delta=None, noise=True, max_doc_bytes=1024)
    assert on["privacy"] == "on" and on["delta"] == pytest.approx(1e-4) and on["releases_per_client"] == 40
    assert on["epsilon"] == pytest.approx(composed_epsilon(1.0, 40, 1e-4)) and on["basic_composition_epsilon"] == 40
    assert on["unit_of_privacy"].startswith("one document") and on["note"].startswith("total epsilon above 10")
    off = tokenizer_privacy(raw, documents=1000, delta=None, noise=False, max_doc_bytes=1024)
    assert off["privacy"].startswith("OFF (--no-privacy)") and off["epsilon"] == "none"


@pytest.mark.parametrize("flag", [[], ["--no-privacy"]])
def test_cli_prints_the_composed_budget_or_that_privacy_is_off(tmp_path, capsys, flag):
    argv = ["--set", "tokenizer.clients=3", "--set", "tokenizer.docs_per_client=20", "--set",
            "tokenizer.vocab_size=300", "tokenizer", "train", "--backend", "inprocess", "--registry",
            str(tmp_path / "reg"), "--work", str(tmp_path / "work"), *flag]
    assert main(argv) == 0
    out = capsys.readouterr().out
    version = ModelRegistry(tmp_path / "reg").get("tokenizer", "latest")
    if flag:
        assert "privacy: OFF (--no-privacy)" in out and "OFF (--no-privacy)" in version.model_card
        assert version.privacy["epsilon"] == "none"
    else:
        assert "DP per document over all" in out and "DP per document over all" in version.model_card
        docs = version.privacy["documents"]
        assert 0 < docs <= 60 and version.privacy["delta"] == pytest.approx(1 / (10 * docs))
        assert version.privacy["epsilon"] > 1.0


def test_cli_refuses_a_delta_above_one_over_documents(tmp_path, capsys):
    argv = ["--set", "tokenizer.clients=2", "--set", "tokenizer.docs_per_client=5", "--set", "tokenizer.delta=0.5",
            "tokenizer", "train", "--backend", "inprocess", "--registry", str(tmp_path), "--work", str(tmp_path)]
    assert main(argv) == 2
    assert "above 1/documents" in capsys.readouterr().err

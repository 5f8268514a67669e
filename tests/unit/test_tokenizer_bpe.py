import numpy as np
import pytest
from pydantic import ValidationError

from fedfraud.config import load_config
from fedfraud.core.errors import ConfigError
from fedfraud.training.tokenizer.bpe import (
    ClientState,
    FedBPEServer,
    ReleaseParams,
    reference_bpe,
    train_in_process,
    words_to_bytes,
)
from fedfraud.training.tokenizer.config import TokenizerConfig
from fedfraud.training.tokenizer.corpus import generate_corpus, group_by_client, write_jsonl
from fedfraud.training.tokenizer.pretokenize import CorpusPipeline, pretokenize

TINY = {
    "a": ["the lower newest widest low", "newer lowest"],
    "b": ["low low lower newest", "wider wide widest"],
    "c": ["new newest newer lowly"],
}


def _states(clients):
    pipe = CorpusPipeline()
    return {name: ClientState(words_to_bytes(pipe.count_words(docs)[0])) for name, docs in clients.items()}


def _pooled(states_words):
    total = {}
    for words in states_words.values():
        for w, c in words.items():
            total[w] = total.get(w, 0) + c
    return total


def test_pretokenizer_isolates_digits_and_punctuation():
    assert pretokenize("Card 4111, ok!!") == ["Card", "Ġ4", "1", "1", "1", ",", "Ġok", "!!"]


@pytest.mark.parametrize("n_merges", [1, 10, 40])
def test_federated_equals_centralized_reference_without_noise(n_merges):
    pipe = CorpusPipeline()
    words = {n: words_to_bytes(pipe.count_words(d)[0]) for n, d in TINY.items()}
    expected = reference_bpe(_pooled(words), n_merges)
    server = FedBPEServer(256 + n_merges, theta=0, mode="single", release=ReleaseParams(p=1.0, epsilon=None))
    result = train_in_process({n: ClientState(w) for n, w in words.items()}, server)
    assert result.merges == expected[: len(result.merges)]
    assert len(result.merges) == min(n_merges, len(expected))


def test_halts_when_no_vocabulary_left():
    server = FedBPEServer(10_000, theta=0, mode="single")
    result = train_in_process(_states(TINY), server)
    assert result.halted and result.stop_reason == "no vocabulary left"
    # every word became one token: nothing left to merge
    assert result.vocab_size < 10_000


def test_batched_merges_in_a_round_cannot_overlap():
    server = FedBPEServer(256 + 30, theta=0, mode="batched", merges_per_round=8)
    result = train_in_process(_states(TINY), server)
    assert result.rounds < len(result.merges)
    single = train_in_process(_states(TINY), FedBPEServer(256 + 30, theta=0, mode="single"))
    # the first round's batch is a conflict-free selection from the same ranking the single mode uses
    assert result.merges[0] == single.merges[0]
    start = 0
    for h in result.history:
        batch = server.vocab.merges[start : start + h["merges"]]
        lefts = {m.left for m in batch}
        rights = {m.right for m in batch}
        selfs = {m.left for m in batch if m.left == m.right}
        # no "a b" + "b c" chain (a lone "a a" pair is allowed): order inside the batch does not matter
        assert not (lefts & rights) - selfs
        assert h["merges"] <= 8
        start += h["merges"]


def test_batch_grows_with_vocabulary_and_stays_conflict_free():
    fixed = train_in_process(_states(TINY), FedBPEServer(256 + 30, theta=0, mode="batched", merges_per_round=2))
    server = FedBPEServer(256 + 30, theta=0, mode="batched", merges_per_round=2, merges_growth=0.02)
    assert server.round_limit == 5  # int(0.02 * 256) > 2
    grown = train_in_process(_states(TINY), server)
    assert grown.rounds < fixed.rounds and grown.merges[0] == fixed.merges[0]
    assert FedBPEServer(300, theta=0, mode="single", merges_growth=0.5).round_limit == 1


def test_counted_corpus_survives_in_node_state(tmp_path):
    from flwr.app import RecordDict

    from fedfraud.training.tokenizer.federated import task

    path = write_jsonl(tmp_path / "c.jsonl", generate_corpus(2, 5, seed=3))
    store = RecordDict()
    built, report = task.client_state(str(path), 1, store=store)
    task._STATES.clear()  # another process: only the node's Context.state is left
    restored, report2 = task.client_state(str(path), 1, store=store)
    assert restored is not built and report2 == report and report.kept > 0
    assert dict(zip(map(tuple, restored.words), restored.freqs.tolist(), strict=True)) == dict(
        zip(map(tuple, built.words), built.freqs.tolist(), strict=True)
    )


def test_client_with_no_data_leaves_round_without_failing():
    clients = {**TINY, "empty": ["", "   "]}
    states = _states(clients)
    assert states["empty"].empty
    rel = states["empty"].release("single", ReleaseParams(), np.random.default_rng(0))
    assert rel.nvl and rel.keys == []
    result = train_in_process(states, FedBPEServer(256 + 5, theta=0, mode="single"))
    assert len(result.merges) == 5


def test_bad_documents_are_counted_and_skipped():
    counts, report = CorpusPipeline().count_words(["fine text", "", b"\xff\xfe bad", b"ok bytes", "   "])
    assert report.kept == 2
    assert report.skipped == {"empty": 2, "not-utf8": 1}
    assert counts["Ġbytes"] == 1


def test_noise_threshold_and_subsampling_run_and_account_privacy():
    cfg_release = ReleaseParams(p=0.8, epsilon=1.0, sensitivity=2.0, top_n=50)
    server = FedBPEServer(256 + 20, theta=2, mode="batched", merges_per_round=4, k_fraction=0.67,
                          release=cfg_release, seed=3)
    result = train_in_process(_states(TINY), server)
    assert result.privacy["epsilon_per_release"] == 1.0 and result.privacy["noise_scale"] == 2.0
    assert result.privacy["max_releases_per_client"] == max(server.releases_per_client.values()) >= 1
    assert len(result.merges) > 0


def test_no_seeded_pii_in_vocabulary():
    docs = generate_corpus(4, 30, pii_rate=1.0, seed=11)
    clients = group_by_client(docs)
    server = FedBPEServer(1200, theta=2, mode="batched", merges_per_round=64, release=ReleaseParams(epsilon=1.0))
    result = train_in_process(_states(clients), server)
    vocab = [t.decode("utf-8", "replace") for t in server.vocab.tokens[256:]]
    pii_values = {d.text[s.start : s.end] for d in docs for s in d.pii}
    for value in pii_values:
        assert not any(value in tok for tok in vocab), value
    assert result.vocab_size > 600


def test_vocab_size_below_256_refused():
    with pytest.raises(ValidationError, match="vocab_size must be >= 256"):
        TokenizerConfig(vocab_size=255)
    with pytest.raises(ConfigError) as err:
        load_config(None, ["tokenizer.vocab_size=100"])
    assert "\n" not in str(err.value) and "256" in str(err.value)

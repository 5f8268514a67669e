import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from fedfraud.training.tokenizer.bpe import ClientState, FedBPEServer, ReleaseParams, train_in_process, words_to_bytes
from fedfraud.training.tokenizer.export import build_tokenizer, save_tokenizer
from fedfraud.training.tokenizer.metrics import evaluate_texts
from fedfraud.training.tokenizer.pretokenize import CorpusPipeline

DOCS = {
    "a": ["Payment of the balance was refused by the bank.", "The bank refused the payment twice."],
    "b": ["My payment was late because the bank lost it.", "Refund the balance, please!"],
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    pipe = CorpusPipeline()
    states = {n: ClientState(words_to_bytes(pipe.count_words(d)[0])) for n, d in DOCS.items()}
    server = FedBPEServer(256 + 60, theta=0, mode="batched", merges_per_round=8, release=ReleaseParams())
    result = train_in_process(states, server)
    tok = build_tokenizer(result.merges, ["<|endoftext|>"])
    path = save_tokenizer(tok, tmp_path_factory.mktemp("tok"))
    return result, tok, path, server


def test_json_round_trip_and_ids_match_training(trained):
    result, tok, path, server = trained
    loaded = Tokenizer.from_file(str(path))
    assert loaded.get_vocab_size() == tok.get_vocab_size() == result.vocab_size + 1
    text = "The bank refused my payment."
    assert loaded.encode(text).ids == tok.encode(text).ids
    # every learned token keeps the id the federation used
    for token_id, raw in enumerate(server.vocab.tokens):
        assert loaded.decode([token_id]) == raw.decode("utf-8", "replace") or len(raw) == 1
    assert loaded.token_to_id("<|endoftext|>") == result.vocab_size


def test_transformers_fast_tokenizer_loads(trained):
    from transformers import PreTrainedTokenizerFast

    _, tok, path, _ = trained
    fast = PreTrainedTokenizerFast(tokenizer_file=str(path))
    text = "Refund the balance of 1,250.00 please"
    assert fast(text)["input_ids"] == tok.encode(text).ids
    assert fast.decode(fast(text)["input_ids"]) == text


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.characters(codec="utf-8"), max_size=200))
def test_encode_decode_is_lossless_on_any_text(trained, text):
    _, tok, _, _ = trained
    assert tok.decode(tok.encode(text).ids) == text


@settings(max_examples=100, deadline=None)
@given(raw=st.binary(max_size=100))
def test_lossless_on_any_utf8_decodable_bytes(trained, raw):
    _, tok, _, _ = trained
    text = raw.decode("utf-8", "surrogateescape")
    if any("\udc80" <= ch <= "\udcff" for ch in text):
        return  # not valid UTF-8: a str for the tokenizer cannot hold it (the pipeline skips such docs)
    assert tok.decode(tok.encode(text).ids).encode("utf-8") == raw


def test_metrics_hand_computed():
    # a "tokenizer" that counts characters: words are pre-tokenizer segments
    count = lambda texts: [len(t) for t in texts]  # noqa: E731
    m = evaluate_texts(["ab cd", "ab"], count)
    # words: doc1 = ["ab", " cd"], doc2 = ["ab"]; distinct = {"ab", " cd"}
    assert m.psi_doc == pytest.approx(((5 / 2) + (2 / 1)) / 2)
    assert m.pi_doc == pytest.approx(1 - 3 / 7)
    assert m.psi_vocab == pytest.approx((2 + 3) / 2)
    assert m.pi_vocab == pytest.approx(1 - 2 / 5)

"""A bank's tokenizer ClientApp answers only under its own policy: a query that switches the noise off, weakens it,
widens a document's contribution or names a corpus is refused with one fixed text, and nothing is released.

Queries go through the real ClientApp over the loopback grid (serialized as over the SuperLink; a ClientApp's
exception comes back as the error reply a SuperNode sends).
"""

from __future__ import annotations

from typing import Any

import pytest
from flwr.app import ConfigRecord, Message, RecordDict

from fedfraud.training.fraud.gnn.loopback import LoopbackGrid, bank_contexts, server_identity
from fedfraud.training.tokenizer.config import TokenizerConfig
from fedfraud.training.tokenizer.corpus import generate_corpus, write_jsonl
from fedfraud.training.tokenizer.federated.client_app import client_app
from fedfraud.training.tokenizer.federated.policy import REFUSAL, BankPolicy
from fedfraud.training.tokenizer.federated.server_app import _histogram_query
from fedfraud.training.tokenizer.federated.task import array_of
from fedfraud.training.tokenizer.privacy import default_delta
from fedfraud.training.tokenizer.trainer import server_settings


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    docs = generate_corpus(2, 40, pii_rate=0.5, seed=3, multilingual=True)
    return write_jsonl(tmp_path_factory.mktemp("policy") / "corpus.jsonl", docs), len(docs)


def _settings(corpus, mode: str) -> dict[str, Any]:
    path, documents = corpus
    cfg = TokenizerConfig(mode=mode, vocab_size=400, epsilon=8.0, histogram_words=16, engine="loopback")
    return server_settings(cfg, path, delta=default_delta(documents))


def _ask(policy: BankPolicy, config: dict[str, Any]) -> Message:
    """One query to bank 0 through the real ClientApp; its reply as the server receives it."""
    with server_identity(5):
        grid = LoopbackGrid(client_app(policy), bank_contexts(2, 5), 5)
        query = Message(RecordDict({"config": ConfigRecord(config)}), dst_node_id=1, message_type="query")
        [reply] = grid.send_and_receive([query])
    return reply


def _single_query(policy: BankPolicy) -> dict[str, Any]:
    """The single-token phase's first query as the server builds it (``server_app._exchange``)."""
    return {"phase": "single", "round": 0, "merge-base": 0, **policy.expected("single")}


def test_the_servers_own_queries_are_answered(corpus):
    policy = BankPolicy.of(_settings(corpus, "histogram"))
    assert policy.histogram is not None and policy.corpus_path == str(corpus[0])
    genuine = dict(_histogram_query(_settings(corpus, "histogram"), policy.histogram)["config"])
    reply = _ask(policy, genuine)
    assert not reply.has_error() and "words" in reply.content
    batched = BankPolicy.of(_settings(corpus, "batched"))
    reply = _ask(batched, _single_query(batched))
    assert not reply.has_error() and "counts" in reply.content


@pytest.mark.parametrize("tamper", [
    {"epsilon": 0.0},  # noise off: exact counts
    {"sigma": "half"},  # weaker noise
    {"tau": "half"},  # a lower threshold: rarer words out
    {"k": 10_000},  # a wider contribution per document
    {"max-doc-bytes": 1 << 20},
    {"corpus-path": "/etc/passwd"},  # another file on the bank's machine
    {"phase": "everything"},
])
def test_a_histogram_query_under_other_parameters_is_refused_and_releases_nothing(corpus, tamper, caplog):
    settings = _settings(corpus, "histogram")
    policy = BankPolicy.of(settings)
    config = dict(_histogram_query(settings, policy.histogram)["config"])
    for key, value in tamper.items():
        config[key] = config[key] / 2 if value == "half" else value
    reply = _ask(policy, config)
    assert reply.has_error() and not reply.has_content()
    assert REFUSAL in reply.error.reason and "/etc/passwd" not in reply.error.reason  # one fixed text
    assert "tokenizer_query_refused" in caplog.text  # the details stay in the bank's log


@pytest.mark.parametrize("tamper", [{"epsilon": 0.0}, {"epsilon": 80.0}, {"top-n": 0}, {"p": 0.5}, {"ner": True},
                                    {"max-doc-bytes": None}])
def test_a_count_query_under_other_parameters_is_refused(corpus, tamper):
    policy = BankPolicy.of(_settings(corpus, "batched"))
    config = {k: v for k, v in {**_single_query(policy), **tamper}.items() if v is not None}
    reply = _ask(policy, config)
    assert reply.has_error() and REFUSAL in reply.error.reason


def test_a_bank_without_noise_is_the_banks_own_choice(corpus):
    """``--no-privacy`` is set where the bank's policy is built; a server asking for noise off is still refused
    by a bank whose policy has noise (above), and a bank whose policy has none answers with exact counts.
    """
    path, _ = corpus
    exact = BankPolicy.of(server_settings(TokenizerConfig(vocab_size=400, engine="loopback"), path, privacy=False))
    assert exact.epsilon == 0.0
    reply = _ask(exact, _single_query(exact))
    values = array_of(reply.content["counts"]["values"])
    assert not reply.has_error() and (values == values.round()).all()  # exact counts


def test_a_bank_releases_at_most_its_policys_count_in_a_run(corpus):
    """Each release draws fresh noise: a server asking again would average it away. Histogram mode releases once."""
    settings = _settings(corpus, "histogram")
    policy = BankPolicy.of(settings)
    assert policy.max_releases == 1 and BankPolicy.of(_settings(corpus, "batched")).max_releases == 2 * 100_000
    query = dict(_histogram_query(settings, policy.histogram)["config"])
    with server_identity(5):
        grid = LoopbackGrid(client_app(policy), bank_contexts(2, 5), 5)
        replies = [next(iter(grid.send_and_receive([Message(RecordDict({"config": ConfigRecord(query)}),
                                                            dst_node_id=1, message_type="query")])))
                   for _ in range(2)]
    assert not replies[0].has_error() and "words" in replies[0].content
    assert replies[1].has_error() and REFUSAL in replies[1].error.reason and not replies[1].has_content()

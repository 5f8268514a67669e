"""Fertility psi and proportion of continued words Pi (paper eqs. 5-6), at vocabulary and document level.

psi(tau) = 1/|D| * sum_s |tau(s)| / |s|, with |s| counted in words.
Pi(tau)  = 1 - |D| / sum_s |tau(s)|, where |D| counts the words of D.

"Words" are the segments of the pipeline's pre-tokenizer (the same units the
clients count), so every tokenizer is measured against one fixed word split.
*Vocabulary level*: D is the set of distinct words, each a one-word "sentence",
so psi is the mean tokens per distinct word and Pi = 1 - 1/psi. *Document
level*: D is the documents; psi averages tokens/words per document and Pi uses
the corpus totals. Reading |D| as a word count is what reproduces the paper's
numbers (e.g. psi 1.07 with Pi 0.06, psi 2.18 with Pi 0.54).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fedfraud.training.tokenizer.pretokenize import pretokenize, unicode_to_bytes

__all__ = ["TokenCounter", "TokenizerMetrics", "evaluate_texts", "summarize"]

TokenCounter = Callable[[list[str]], list[int]]  # batch of texts -> number of tokens per text


@dataclass(frozen=True)
class TokenizerMetrics:
    """psi and Pi at vocabulary and document level for one tokenizer on one corpus."""

    psi_vocab: float
    pi_vocab: float
    psi_doc: float
    pi_doc: float
    words: int
    distinct_words: int

    def as_dict(self) -> dict[str, float]:
        return {"psi_vocab": self.psi_vocab, "pi_vocab": self.pi_vocab, "psi_doc": self.psi_doc, "pi_doc": self.pi_doc}


def _text_of(byte_word: str) -> str:
    table = unicode_to_bytes()
    return bytes(table[c] for c in byte_word).decode("utf-8")


def evaluate_texts(texts: Sequence[str], count_tokens: TokenCounter) -> TokenizerMetrics:
    """Compute both levels of psi and Pi for ``count_tokens`` on (already PII-wiped) ``texts``."""
    docs = [t for t in texts if t]
    if not docs:
        raise ValueError("no documents to evaluate")
    words_per_doc = [len(pretokenize(t)) for t in docs]
    distinct = sorted({w for t in docs for w in pretokenize(t)})
    tokens_per_doc = count_tokens(list(docs))
    tokens_per_word = count_tokens([_text_of(w) for w in distinct])
    psi_doc = statistics.fmean(t / w for t, w in zip(tokens_per_doc, words_per_doc, strict=True) if w)
    pi_doc = 1.0 - sum(words_per_doc) / sum(tokens_per_doc)
    psi_vocab = statistics.fmean(tokens_per_word)
    pi_vocab = 1.0 - len(distinct) / sum(tokens_per_word)
    return TokenizerMetrics(psi_vocab, pi_vocab, psi_doc, pi_doc, sum(words_per_doc), len(distinct))


def summarize(per_client: dict[str, TokenizerMetrics]) -> dict[str, tuple[float, float]]:
    """Mean and standard deviation over clients of each metric (the paper's table format)."""
    out = {}
    for key in ("psi_vocab", "pi_vocab", "psi_doc", "pi_doc"):
        vals = [getattr(m, key) for m in per_client.values()]
        out[key] = (statistics.fmean(vals), statistics.pstdev(vals) if len(vals) > 1 else 0.0)
    return out

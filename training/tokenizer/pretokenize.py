r"""Pre-tokenization, byte-level mapping and per-client word counting (pipeline stages 3-4).

The pre-tokenizer is a ``tokenizers`` object, so the words clients count and
the words the exported ``tokenizer.json`` splits text into come from the same
code. The GPT-2 regex is changed in one place: ``\p{N}`` matches a single
digit, so every digit is its own segment (numbers never become tokens, which
also keeps card, account and phone numbers out of the vocabulary).
"""

from __future__ import annotations

import bisect
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import accumulate

from tokenizers import Regex, decoders, pre_tokenizers

__all__ = [
    "PRETOKENIZE_PATTERN",
    "bytes_to_unicode",
    "unicode_to_bytes",
    "build_pre_tokenizer",
    "pretokenize",
    "CorpusReport",
    "CorpusPipeline",
    "document_contribution",
]

log = logging.getLogger(__name__)

# GPT-2's pattern with single digits; punctuation runs stay one segment.
PRETOKENIZE_PATTERN = r" ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]+|\r\n|\s+(?!\S)|\s+"


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (what ``ByteLevel`` uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


@lru_cache(maxsize=1)
def unicode_to_bytes() -> dict[str, int]:
    """Inverse of :func:`bytes_to_unicode`."""
    return {c: b for b, c in bytes_to_unicode().items()}


def build_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """Regex split (digits and punctuation runs isolated) followed by the byte-level mapping."""
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def build_decoder() -> decoders.Decoder:
    """Byte-level decoder: the exact inverse of the byte-level mapping."""
    return decoders.ByteLevel()


@lru_cache(maxsize=1)
def _shared_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return build_pre_tokenizer()


@lru_cache(maxsize=1)
def _shared_split() -> pre_tokenizers.PreTokenizer:
    """The first stage of :func:`build_pre_tokenizer` alone (the words before the byte-level mapping)."""
    return pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated", invert=False)


def pretokenize(text: str) -> list[str]:
    """Byte-level words of ``text`` (each character stands for one byte)."""
    return [w for w, _ in _shared_pre_tokenizer().pre_tokenize_str(text)]


@dataclass
class CorpusReport:
    """What the pipeline did to one client's documents: kept, skipped (with reason), PII wiped."""

    documents: int = 0
    kept: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    pii_chars_wiped: int = 0
    words: int = 0

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


Masker = Callable[[str], str]


class CorpusPipeline:
    """Documents -> PII-wiped text -> byte-level words -> word frequencies (the paper's Fig. 1).

    Each stage is a plain callable so it can be swapped: ``masker`` (default:
    the rule-based :class:`~fedfraud.training.tokenizer.pii.PIIDetector`) and
    ``pretokenizer`` (default: :func:`pretokenize`).
    """

    def __init__(self, masker: Masker | None = None, pretokenizer: Callable[[str], list[str]] | None = None) -> None:
        if masker is None:
            from fedfraud.training.tokenizer.pii import PIIDetector

            masker = PIIDetector()
        self.masker = masker
        self.pretokenizer = pretokenizer or pretokenize

    def clean(self, doc: str | bytes, report: CorpusReport) -> str | None:
        """Decode, validate and wipe one document; ``None`` (and a counted reason) if it is skipped."""
        report.documents += 1
        if isinstance(doc, bytes):
            try:
                doc = doc.decode("utf-8")
            except UnicodeDecodeError:
                report.skip("not-utf8")
                return None
        if not isinstance(doc, str):
            report.skip("not-text")
            return None
        if not doc.strip():
            report.skip("empty")
            return None
        masked = self.masker(doc)
        report.pii_chars_wiped += len(doc) - len(masked)
        if not masked.strip():
            report.skip("empty-after-masking")
            return None
        report.kept += 1
        return masked

    def masked_texts(self, docs: Iterable[str | bytes], report: CorpusReport | None = None) -> list[str]:
        """The wiped texts of the kept documents (used for centralized/local baselines and evaluation)."""
        report = report if report is not None else CorpusReport()
        return [t for t in (self.clean(d, report) for d in docs) if t is not None]

    def count_words(
        self, docs: Iterable[str | bytes], max_doc_bytes: int | None = None, max_words: int | None = None,
        max_count: int | None = None,
    ) -> tuple[Counter[str], CorpusReport]:
        """Per-client word frequencies over wiped, pre-tokenized, byte-level text; with ``max_doc_bytes`` each
        document contributes only its first words up to that many bytes (the bound the privacy account needs), and
        with ``max_words`` / ``max_count`` only to its first that many distinct words, each at most that many
        times (:func:`document_contribution`: the histogram mode's L0 / L∞ bound).
        """
        if self.pretokenizer is not pretokenize:  # a swapped pre-tokenizer: its byte-level words as they come
            report = CorpusReport()
            counts: Counter[str] = Counter()
            for text in self.masked_texts(docs, report):
                words = self.pretokenizer(text)
                if max_doc_bytes is not None:
                    words = _first_bytes(words, max_doc_bytes)
                report.words += len(words)
                counts.update(document_contribution(words, max_words, max_count))
            self._log_skips(report)
            return counts, report
        raw, report = self.count_word_bytes(docs, max_doc_bytes)
        table = bytes_to_unicode()
        return Counter({"".join(table[b] for b in w): c for w, c in raw.items()}), report

    def count_word_bytes(
        self, docs: Iterable[str | bytes], max_doc_bytes: int | None = None, max_words: int | None = None,
        max_count: int | None = None,
    ) -> tuple[dict[bytes, int], CorpusReport]:
        """:meth:`count_words` keyed by the words' UTF-8 bytes (what the BPE counts), without the byte-level strings.

        The default pre-tokenizer is split into its two stages: the ``tokenizers`` regex split runs on every
        document, and the byte-level mapping (a bijection) only on the distinct words, after counting.
        """
        if self.pretokenizer is not pretokenize:
            counts, report = self.count_words(docs, max_doc_bytes, max_words, max_count)
            table = unicode_to_bytes()
            out: dict[bytes, int] = {}
            for word, n in counts.items():
                key = bytes(table[c] for c in word)
                out[key] = out.get(key, 0) + n
            return out, report
        report = CorpusReport()
        split = _shared_split()
        words: Counter[str] = Counter()
        for text in self.masked_texts(docs, report):
            if max_doc_bytes is not None and len(text) > max_doc_bytes + 1:
                # words within the first max_doc_bytes bytes lie within as many characters; splitting a prefix
                # longer than that changes only its last piece, which ends past the budget and is dropped below
                text = text[: max_doc_bytes + 2]
            pieces = split.pre_tokenize_str(text)
            if max_doc_bytes is not None and len(text.encode("utf-8")) > max_doc_bytes:  # else every word fits
                if text.isascii():  # one byte per character: lengths from the offsets
                    sizes = accumulate(e - s for _, (s, e) in pieces)
                else:
                    sizes = accumulate(len(w.encode("utf-8")) for w, _ in pieces)
                pieces = pieces[: bisect.bisect_right(list(sizes), max_doc_bytes)]
            report.words += len(pieces)
            words.update(document_contribution([w for w, _ in pieces], max_words, max_count))
        self._log_skips(report)
        return {w.encode("utf-8"): c for w, c in words.items()}, report

    @staticmethod
    def _log_skips(report: CorpusReport) -> None:
        if report.skipped:
            log.info("corpus skipped %s of %d documents", report.skipped, report.documents)


def document_contribution(
    words: Sequence[str], max_words: int | None = None, max_count: int | None = None
) -> Counter[str] | Sequence[str]:
    """What one document adds to its client's counts: its words, or (with a bound) only its first ``max_words``
    distinct words, each counted at most ``max_count`` times.

    The rule looks at the document alone (its word order), never at other documents or at the counts, so adding or
    removing one document changes at most ``max_words`` keys by at most ``max_count`` each: L0 ≤ ``max_words``,
    L∞ ≤ ``max_count``, L2 ≤ ``max_count`` × √``max_words`` (the histogram mode's sensitivity, ``histogram.py``).
    """
    if max_words is None and max_count is None:
        return words
    counts: Counter[str] = Counter()
    for word in words:
        if word not in counts:
            if max_words is not None and len(counts) >= max_words:
                continue
            counts[word] = 1
        elif max_count is None or counts[word] < max_count:
            counts[word] += 1
    return counts


def _first_bytes(words: list[str], budget: int) -> list[str]:
    """The leading words whose byte-level lengths (one character per byte) sum to at most ``budget``."""
    out: list[str] = []
    used = 0
    for word in words:
        used += len(word)
        if used > budget:
            break
        out.append(word)
    return out

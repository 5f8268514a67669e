"""Client-side data for the Flower app: load a partition, run the corpus pipeline, keep the state warm.

A ClientApp process may serve several simulated nodes and may be restarted, so
client state is cached per (corpus, partition) in the process and rebuilt on a
miss; the server re-sends any merges a fresh state has not applied yet.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from training.tokenizer.bpe import ClientState, words_to_bytes
from training.tokenizer.corpus import read_jsonl
from training.tokenizer.pretokenize import CorpusPipeline, CorpusReport

__all__ = ["client_names", "load_partition", "client_state"]

log = logging.getLogger(__name__)

_CACHE: dict[tuple[str, int, bool], tuple[ClientState, CorpusReport]] = {}
_LOCK = threading.Lock()


def client_names(corpus_path: Path) -> list[str]:
    """Institutions in a corpus file, sorted: partition ``i`` is ``client_names()[i]``."""
    return sorted({doc.client for doc in read_jsonl(corpus_path)})


def load_partition(corpus_path: Path, partition_id: int) -> list[str]:
    """Raw texts of one institution; a partition id past the last institution is a client with no data."""
    names = client_names(corpus_path)
    if partition_id >= len(names):
        return []
    name = names[partition_id]
    return [doc.text for doc in read_jsonl(corpus_path) if doc.client == name]


def client_state(corpus_path: str, partition_id: int, ner: bool = False) -> tuple[ClientState, CorpusReport]:
    """The (cached) counting state of one client after PII wiping and pre-tokenization."""
    key = (corpus_path, partition_id, ner)
    with _LOCK:
        if key not in _CACHE:
            masker = None
            if ner:
                from training.tokenizer.pii import PIIDetector, default_recognizers, resolve_recognizer

                masker = PIIDetector([*default_recognizers(), resolve_recognizer("ner")])
            counts, report = CorpusPipeline(masker).count_words(load_partition(Path(corpus_path), partition_id))
            _CACHE[key] = (ClientState(words_to_bytes(counts)), report)
            log.info("client partition=%d words=%d kept=%d skipped=%s", partition_id, report.words, report.kept,
                     report.skipped)
        return _CACHE[key]

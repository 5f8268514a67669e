"""Client-side data for the Flower app: load a partition, run the corpus pipeline, keep the state warm.

A ClientApp process (a Ray actor in simulation) serves many simulated nodes, and
a node's messages land on whichever actor is free. Two caches keep the expensive
part (PII wiping, pre-tokenization, counting) to once per node:

* the node's counted corpus (word bytes + counts, no text) is stored in the
  node's ``Context.state`` as an ``ArrayRecord``; Flower hands that context to
  whichever process runs the node next, so a process that has not seen the node
  rebuilds its :class:`ClientState` from the counts instead of re-reading and
  re-wiping the documents;
* the live :class:`ClientState` (words with merges applied) is cached per
  process; a process that builds it fresh answers ``resync`` and the server
  re-sends the merges it has not applied yet.

The corpus file is parsed once per process (keyed by path, size and mtime), not
once per partition.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fedfraud.training.tokenizer.bpe import ClientState, words_to_bytes
from fedfraud.training.tokenizer.corpus import read_jsonl
from fedfraud.training.tokenizer.pretokenize import CorpusPipeline, CorpusReport

__all__ = ["client_names", "load_partition", "client_state", "corpus_key"]

log = logging.getLogger(__name__)

_STATES: dict[tuple[str, int], tuple[ClientState, CorpusReport]] = {}
_PARSED: dict[str, dict[str, list[str]]] = {}
_LOCK = threading.Lock()
_WORDS, _META = "fedbpe-words", "fedbpe-corpus"


def corpus_key(corpus_path: str | Path, ner: bool = False, max_doc_bytes: int | None = None) -> str:
    """Identity of a corpus file's content and pipeline (path, size, mtime, NER on/off, per-document bound) for
    cache keys.
    """
    st = Path(corpus_path).stat()
    return f"{Path(corpus_path).resolve()}:{st.st_size}:{st.st_mtime_ns}:ner={int(ner)}:bound={max_doc_bytes or 0}"


def _by_client(corpus_path: Path) -> dict[str, list[str]]:
    """``{client: texts}`` of a corpus file, parsed once per process."""
    key = corpus_key(corpus_path)
    if key not in _PARSED:
        grouped: dict[str, list[str]] = {}
        for doc in read_jsonl(corpus_path):
            grouped.setdefault(doc.client, []).append(doc.text)
        _PARSED.clear()  # one corpus at a time: a new file replaces the old one
        _PARSED[key] = grouped
    return _PARSED[key]


def client_names(corpus_path: Path) -> list[str]:
    """Institutions in a corpus file, sorted: partition ``i`` is ``client_names()[i]``."""
    return sorted(_by_client(corpus_path))


def load_partition(corpus_path: Path, partition_id: int) -> list[str]:
    """Raw texts of one institution; a partition id past the last institution is a client with no data."""
    names = client_names(corpus_path)
    if partition_id >= len(names):
        return []
    return _by_client(corpus_path)[names[partition_id]]


def _store(store: RecordDict, key: str, words: dict[bytes, int], report: CorpusReport) -> None:
    blob = b"".join(words)
    store[_WORDS] = ArrayRecord({
        "bytes": Array(np.frombuffer(blob, dtype=np.uint8).copy()),
        "lengths": Array(np.fromiter((len(w) for w in words), dtype=np.int64, count=len(words))),
        "counts": Array(np.fromiter(words.values(), dtype=np.int64, count=len(words))),
    })
    store[_META] = ConfigRecord({
        "key": key, "documents": report.documents, "kept": report.kept, "words": report.words,
        "pii-chars-wiped": report.pii_chars_wiped, "skip-reasons": list(report.skipped),
        "skip-counts": list(report.skipped.values()),
    })


def _restore(store: RecordDict, key: str) -> tuple[dict[bytes, int], CorpusReport] | None:
    if _META not in store or store[_META]["key"] != key:
        return None
    meta, arrays = store[_META], store[_WORDS]
    blob = arrays["bytes"].numpy().tobytes()
    ends = np.cumsum(arrays["lengths"].numpy()).tolist()
    starts = [0, *ends[:-1]]
    words = {blob[a:b]: c for a, b, c in zip(starts, ends, arrays["counts"].numpy().tolist(), strict=True)}
    report = CorpusReport(
        documents=int(meta["documents"]), kept=int(meta["kept"]), words=int(meta["words"]),
        pii_chars_wiped=int(meta["pii-chars-wiped"]),
        skipped=dict(zip(meta["skip-reasons"], [int(c) for c in meta["skip-counts"]], strict=True)),
    )
    return words, report


def client_state(
    corpus_path: str, partition_id: int, ner: bool = False, store: RecordDict | None = None,
    max_doc_bytes: int | None = None,
) -> tuple[ClientState, CorpusReport]:
    """The (cached) counting state of one client after PII wiping and pre-tokenization (each document bounded to
    its first ``max_doc_bytes`` bytes of words when given).

    ``store`` is the node's ``Context.state``: the counted corpus is kept there so another process can rebuild
    the state without running the pipeline again.
    """
    key = corpus_key(corpus_path, ner, max_doc_bytes)
    with _LOCK:
        cached = _STATES.get((key, partition_id))
        if cached is not None:
            return cached
        for stale in [k for k in _STATES if k[0] != key]:  # one corpus at a time: free a previous run's states
            del _STATES[stale]
        restored = _restore(store, key) if store is not None else None
        if restored is not None:
            words, report = restored
        else:
            masker = None
            if ner:
                from fedfraud.training.tokenizer.pii import PIIDetector, default_recognizers, resolve_recognizer

                masker = PIIDetector([*default_recognizers(), resolve_recognizer("ner")])
            counts, report = CorpusPipeline(masker).count_words(
                load_partition(Path(corpus_path), partition_id), max_doc_bytes
            )
            words = words_to_bytes(counts)
            if store is not None:
                _store(store, key, words, report)
            log.info("client partition=%d words=%d kept=%d skipped=%s", partition_id, report.words, report.kept,
                     report.skipped)
        _STATES[(key, partition_id)] = (ClientState(words), report)
        return _STATES[(key, partition_id)]

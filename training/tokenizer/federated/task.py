"""Client-side data for the Flower app: load a partition, run the corpus pipeline, keep the state warm.

A ClientApp process (a Ray actor in simulation) serves many simulated nodes, and
a node's messages land on whichever actor is free. Two caches keep the expensive
part (PII wiping, pre-tokenization, counting) to once per node:

* the node's counted corpus (each distinct word's bytes and count, compressed;
  no text) is stored once in the node's ``Context.state`` as an ``ArrayRecord``;
  Flower hands that context to whichever process runs the node next, so a
  process that has not seen the node rebuilds its :class:`ClientState` from the
  counts instead of re-reading and re-wiping the documents;
* the live :class:`ClientState` (words with merges applied) is cached per
  process, and so is the global merge list the process has seen
  (:func:`remember_merges`): every node gets the same merges, so a state that
  fell behind (its node was served elsewhere meanwhile) catches up locally.
  Only a process that lacks some of the merges (not seen by any of its nodes)
  answers ``resync``, and the server re-sends them.

The corpus file is parsed once per process (keyed by path, size and mtime), not
once per partition.
"""

from __future__ import annotations

import io
import logging
import threading
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fedfraud.training.tokenizer.bpe import ClientState
from fedfraud.training.tokenizer.corpus import read_jsonl
from fedfraud.training.tokenizer.histogram import HistogramMechanism, client_histogram
from fedfraud.training.tokenizer.pretokenize import CorpusPipeline, CorpusReport

__all__ = [
    "RAW_STYPE", "array_of", "client_names", "client_state", "client_word_histogram", "corpus_key", "load_partition",
    "raw_array",
    "remember_merges",
]

log = logging.getLogger(__name__)

_STATES: dict[tuple[int | str | None, str, int], tuple[ClientState, CorpusReport]] = {}
_MERGES: dict[int | str | None, np.ndarray] = {}
_PARSED: dict[str, dict[str, list[str]]] = {}
_LOCK = threading.Lock()
_WORDS, _META = "fedbpe-words", "fedbpe-corpus"
#: How the app's count and merge arrays travel: an ``Array`` whose ``data`` is the array's C-order bytes and whose
#: ``dtype`` is numpy's ``dtype.str`` (byte order included). Flower's default (``Array(ndarray)``) wraps each array
#: in a ``.npy`` container whose header numpy parses with ``ast`` on every read: about 0.4 ms an array, and a round
#: moves some 240 of them (docs/tokenizer.md).
RAW_STYPE = "fedbpe.raw"


def raw_array(values: np.ndarray) -> Array:
    """``values`` as an ``Array`` of :data:`RAW_STYPE` (its bytes, dtype and shape; no ``.npy`` container)."""
    values = np.ascontiguousarray(values)
    return Array(dtype=values.dtype.str, shape=tuple(values.shape), stype=RAW_STYPE, data=values.tobytes())


def array_of(array: Array) -> np.ndarray:
    """The numpy array an ``Array`` carries: :data:`RAW_STYPE` bytes, or Flower's ``.npy`` form."""
    if array.stype != RAW_STYPE:
        return array.numpy()
    return np.frombuffer(array.data, dtype=np.dtype(array.dtype)).reshape(array.shape)


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


def _store(store: RecordDict, key: str, state: ClientState, report: CorpusReport) -> None:
    """Write a node's counted corpus (each distinct word's bytes and count, compressed; no text) and its pipeline
    report into its ``Context.state``, once: the context rides along with every message.
    """
    buffer = io.BytesIO()
    arrays = state.to_arrays()
    np.savez_compressed(buffer, tokens=arrays["tokens"], lengths=arrays["lengths"], freqs=arrays["freqs"])
    store[_WORDS] = ArrayRecord({"npz": Array(np.frombuffer(buffer.getvalue(), dtype=np.uint8).copy())})
    store[_META] = ConfigRecord({
        "key": key, "documents": report.documents, "kept": report.kept, "words": report.words,
        "pii-chars-wiped": report.pii_chars_wiped, "skip-reasons": list(report.skipped),
        "skip-counts": list(report.skipped.values()),
    })


def _restore(store: RecordDict, key: str) -> tuple[ClientState, CorpusReport] | None:
    if _META not in store or store[_META]["key"] != key:
        return None
    meta = store[_META]
    with np.load(io.BytesIO(store[_WORDS]["npz"].numpy().tobytes())) as arrays:
        state = ClientState.from_arrays(arrays["tokens"], arrays["lengths"], arrays["freqs"])
    report = CorpusReport(
        documents=int(meta["documents"]), kept=int(meta["kept"]), words=int(meta["words"]),
        pii_chars_wiped=int(meta["pii-chars-wiped"]),
        skipped=dict(zip(meta["skip-reasons"], [int(c) for c in meta["skip-counts"]], strict=True)),
    )
    return state, report


def _pipeline(ner: bool) -> CorpusPipeline:
    """The client's corpus pipeline: the rule-based PII recognizers, plus NER when asked."""
    masker = None
    if ner:
        from fedfraud.training.tokenizer.pii import PIIDetector, default_recognizers, resolve_recognizer

        masker = PIIDetector([*default_recognizers(), resolve_recognizer("ner")])
    return CorpusPipeline(masker)


def client_word_histogram(
    corpus_path: str, partition_id: int, ner: bool, max_doc_bytes: int, mechanism: HistogramMechanism | None,
) -> tuple[dict[bytes, int], CorpusReport]:
    """Histogram mode: one client's bounded word counts after PII wiping (``histogram.client_histogram``); computed
    once per run (one query), so nothing is cached.
    """
    docs = load_partition(Path(corpus_path), partition_id)
    return client_histogram(_pipeline(ner), docs, max_doc_bytes, mechanism)


def client_state(
    corpus_path: str, partition_id: int, ner: bool = False, store: RecordDict | None = None,
    max_doc_bytes: int | None = None, run: int | str | None = None,
) -> tuple[ClientState, CorpusReport]:
    """The (cached) counting state of one client after PII wiping and pre-tokenization (each document bounded to
    its first ``max_doc_bytes`` bytes of words when given).

    ``store`` is the node's ``Context.state``: the counted corpus is kept there so another process can rebuild the
    state without running the pipeline again (it then catches up with :func:`remember_merges`). ``run`` (the
    Flower run id) keeps two runs over one corpus in one process apart.
    """
    key = corpus_key(corpus_path, ner, max_doc_bytes)
    with _LOCK:
        cached = _STATES.get((run, key, partition_id))
        if cached is not None:
            return cached
        for stale in [k for k in _STATES if k[:2] != (run, key)]:  # one run at a time: free a previous run's states
            del _STATES[stale]
        restored = _restore(store, key) if store is not None else None
        if restored is None:
            words, report = _pipeline(ner).count_word_bytes(
                load_partition(Path(corpus_path), partition_id), max_doc_bytes
            )
            restored = ClientState(words), report
            if store is not None:
                _store(store, key, *restored)
            log.info("client partition=%d words=%d kept=%d skipped=%s", partition_id, report.words, report.kept,
                     report.skipped)
        _STATES[(run, key, partition_id)] = restored
        return restored


def remember_merges(run: int | str | None, base: int, delta: np.ndarray) -> np.ndarray:
    """The global merges this process has seen in ``run``, extended by a broadcast ``delta`` that starts at merge
    ``base``: every node receives the same merge list, so a node state this process built earlier (or rebuilt from
    its counted corpus) catches up from here instead of asking the server to re-send (``resync``).
    """
    with _LOCK:
        known = _MERGES.get(run)
        if known is None or base == 0:
            known = np.zeros((0, 3), dtype=np.int64)
        if base <= len(known) < base + len(delta):
            known = np.concatenate([known[:base], np.asarray(delta, dtype=np.int64).reshape(-1, 3)])
        _MERGES.clear()  # one run at a time
        _MERGES[run] = known
        return known

"""Write the learned merges as a Hugging Face ``tokenizer.json`` through the ``tokenizers`` library itself."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer, models

from fedfraud.training.tokenizer.pretokenize import build_decoder, build_pre_tokenizer, bytes_to_unicode

__all__ = ["build_tokenizer", "save_tokenizer", "TOKENIZER_FILE"]

log = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"


def _to_str(token: bytes) -> str:
    table = bytes_to_unicode()
    return "".join(table[b] for b in token)


def build_tokenizer(merges: Sequence[tuple[bytes, bytes]], special_tokens: Sequence[str] = ()) -> Tokenizer:
    """``Tokenizer(models.BPE(vocab, merges))`` with the pipeline's pre-tokenizer and a byte-level decoder.

    Ids: bytes 0-255 first (in byte order), then each new merged string in merge
    order, then special tokens. This matches the ids used during training.
    """
    vocab: dict[str, int] = {_to_str(bytes([b])): b for b in range(256)}
    merge_strs: list[tuple[str, str]] = []
    for left, right in merges:
        merge_strs.append((_to_str(left), _to_str(right)))
        joined = _to_str(left + right)
        if joined not in vocab:
            vocab[joined] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merge_strs, fuse_unk=False))
    tok.pre_tokenizer = build_pre_tokenizer()
    tok.decoder = build_decoder()
    if special_tokens:
        tok.add_special_tokens(list(special_tokens))
    return tok


def save_tokenizer(tok: Tokenizer, folder: Path) -> Path:
    """Serialise with ``Tokenizer.save`` (the library's own format) and return the file path."""
    path = folder / TOKENIZER_FILE
    tok.save(str(path))
    log.info("tokenizer saved path=%s vocab=%d", path, tok.get_vocab_size())
    return path

"""Federated byte-level BPE tokenizer: PII wiping, pre-tokenization, FedByteBPE, metrics, tokenizer.json export."""

from fedfraud.training.tokenizer.bpe import ClientState, FedBPEServer, ReleaseParams, reference_bpe, train_in_process
from fedfraud.training.tokenizer.config import TokenizerConfig
from fedfraud.training.tokenizer.export import build_tokenizer, save_tokenizer
from fedfraud.training.tokenizer.metrics import evaluate_texts
from fedfraud.training.tokenizer.pii import PIIDetector, default_recognizers
from fedfraud.training.tokenizer.pretokenize import CorpusPipeline, build_pre_tokenizer, pretokenize

__all__ = [
    "ClientState",
    "CorpusPipeline",
    "FedBPEServer",
    "PIIDetector",
    "ReleaseParams",
    "TokenizerConfig",
    "build_pre_tokenizer",
    "build_tokenizer",
    "default_recognizers",
    "evaluate_texts",
    "pretokenize",
    "reference_bpe",
    "save_tokenizer",
    "train_in_process",
]

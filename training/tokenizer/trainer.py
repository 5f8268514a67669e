"""Train tokenizers: federated (the Flower apps on Ray or on the loopback grid, or direct calls in-process),
centralized and local baselines.

This is the glue the CLI and the benchmark call; the algorithm lives in
``bpe.py`` and the Flower app in ``server_app.py`` / ``client_app.py``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, models, trainers

from fedfraud.training.tokenizer.bpe import ClientState, FedBPEServer, ReleaseParams, train_in_process
from fedfraud.training.tokenizer.config import TokenizerConfig
from fedfraud.training.tokenizer.export import build_tokenizer, save_tokenizer
from fedfraud.training.tokenizer.pretokenize import CorpusPipeline, build_decoder, build_pre_tokenizer, bytes_to_unicode
from fedfraud.training.tokenizer.histogram import (
    HistogramMechanism,
    calibrate,
    client_histogram,
    histogram_release,
    train_from_releases,
)
from fedfraud.training.tokenizer.noise import noise_rng
from fedfraud.training.tokenizer.privacy import default_delta, tokenizer_privacy

__all__ = [
    "FederatedRun",
    "histogram_mechanism",
    "server_settings",
    "train_federated_flower",
    "train_federated_inprocess",
    "train_centralized",
    "publish_tokenizer",
]

log = logging.getLogger(__name__)


@dataclass
class FederatedRun:
    """A finished federated training: the tokenizer plus what the server reported."""

    tokenizer: Tokenizer
    merges: list[tuple[bytes, bytes]]
    rounds: int
    stop_reason: str
    privacy: dict[str, Any]
    wall_seconds: float
    train_seconds: float
    history: list[tuple[int, float]] = field(default_factory=list)  # (vocab size, seconds since loop start)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()


def server_settings(cfg: TokenizerConfig, corpus_path: Path, privacy: bool = True, **extra: Any) -> dict[str, Any]:
    """The ServerApp's kebab-case settings for a config (``privacy=False``: exact counts, ``epsilon`` 0)."""
    return {
        "vocab-size": cfg.vocab_size,
        "special-tokens": len(cfg.special_tokens),
        "theta": cfg.theta,
        "epsilon": cfg.epsilon if privacy else 0.0,
        "max-doc-bytes": cfg.max_doc_bytes,
        "pair-tokens": cfg.pair_tokens,
        "p": cfg.p,
        "k-fraction": cfg.k_fraction,
        "top-n": cfg.top_n or 0,
        "mode": cfg.mode,
        "merges-per-round": cfg.merges_per_round,
        "merges-growth": cfg.merges_growth,
        "merges-ratio": cfg.merges_ratio,
        "histogram-words": cfg.histogram_words,
        "histogram-count": cfg.histogram_count,
        "max-rounds": cfg.max_rounds,
        "seed": cfg.seed,
        "ner": cfg.ner,
        "corpus-path": str(corpus_path),
        **extra,
    }


def train_federated_flower(
    cfg: TokenizerConfig, corpus_path: Path, *, num_supernodes: int, audit_path: Path | None = None,
    privacy: bool = True,
) -> FederatedRun:
    """FedByteBPE as a Flower app (one SuperNode per institution) on ``cfg.engine``: Flower's simulation engine on
    Ray, or the same ServerApp and ClientApp in this process over the loopback grid. ``privacy=False`` (the CLI's
    ``--no-privacy``) releases exact counts and says so in the privacy section.
    """
    from fedfraud.training.fraud.gnn.loopback import run_federated
    from fedfraud.training.tokenizer.federated.client_app import client_app
    from fedfraud.training.tokenizer.federated.policy import BankPolicy
    from fedfraud.training.tokenizer.federated.server_app import build_server_app, run_jobs

    documents = _documents(corpus_path)
    settings = server_settings(
        cfg, corpus_path, privacy, **{"audit-path": str(audit_path or ""), "num-supernodes": num_supernodes,
                                      "delta": default_delta(documents) if cfg.delta is None else cfg.delta}
    )
    results: list[dict[str, Any]] = []
    start = time.perf_counter()
    # every bank answers under its own policy; here the banks' settings are the run's (one operator, one config)
    banks = client_app(BankPolicy.of(settings))
    run_federated(cfg.engine, banks, run_jobs, build_server_app, settings, results.append, num_supernodes)
    if not results:
        raise RuntimeError("the Flower ServerApp did not produce a result (see the log above)")
    out = results[0]
    merges = [(bytes.fromhex(a), bytes.fromhex(b)) for a, b in out["merges"]]
    tokenizer = build_tokenizer(merges, cfg.special_tokens)
    account = tokenizer_privacy(out["privacy"], documents=documents, delta=cfg.delta, noise=privacy,
                                max_doc_bytes=cfg.max_doc_bytes)
    return FederatedRun(
        tokenizer=tokenizer,
        merges=merges,
        rounds=out["rounds"],
        stop_reason=out["stop_reason"],
        privacy=account,
        wall_seconds=time.perf_counter() - start,  # what it takes to get the tokenizer and its privacy account
        train_seconds=out["train_seconds"],
        history=[(int(v), float(t)) for v, t in out["history"]],
    )


def _documents(corpus_path: Path) -> int:
    """Documents in a corpus file: its non-blank lines, one document each (``read_jsonl``), counted without parsing
    the JSON (re-parsing an 8 MB corpus took 2 s of the bench's federated wall time).
    """
    with corpus_path.open("rb") as fh:
        return sum(1 for line in fh if line.strip())


def train_federated_inprocess(
    cfg: TokenizerConfig, clients: dict[str, Sequence[str]], privacy: bool = True
) -> FederatedRun:
    """The same algorithm with direct calls (no messages): for tests and quick comparisons."""
    start = time.perf_counter()
    pipe = CorpusPipeline()
    bound = cfg.max_doc_bytes if privacy else None
    if cfg.mode == "histogram":
        return _histogram_inprocess(cfg, clients, pipe, privacy, start)
    states = {name: ClientState(pipe.count_word_bytes(docs, bound)[0]) for name, docs in clients.items()}
    server = FedBPEServer(
        cfg.vocab_size - len(cfg.special_tokens),
        theta=cfg.theta,
        mode=cfg.mode,
        merges_per_round=cfg.merges_per_round,
        merges_growth=cfg.merges_growth,
        merges_ratio=cfg.merges_ratio,
        k_fraction=cfg.k_fraction,
        release=ReleaseParams(
            p=cfg.p, epsilon=cfg.epsilon if privacy else None, sensitivity=float(bound or 1), top_n=cfg.top_n
        ),
        pair_tokens=cfg.pair_tokens,
        seed=cfg.seed,
    )
    t0 = time.perf_counter()
    result = train_in_process(states, server, max_rounds=cfg.max_rounds)
    train = time.perf_counter() - t0
    return FederatedRun(
        tokenizer=build_tokenizer(result.merges, cfg.special_tokens),
        merges=result.merges,
        rounds=result.rounds,
        stop_reason=result.stop_reason,
        privacy=tokenizer_privacy(result.privacy, documents=sum(len(d) for d in clients.values()), delta=cfg.delta,
                                  noise=privacy, max_doc_bytes=cfg.max_doc_bytes),
        wall_seconds=time.perf_counter() - start,
        train_seconds=train,
    )


def _histogram_inprocess(
    cfg: TokenizerConfig, clients: dict[str, Sequence[str]], pipe: CorpusPipeline, privacy: bool, start: float
) -> FederatedRun:
    """Histogram mode with direct calls: each client's one release (partition ids in name order, as the Flower
    clients' ``client_names``), then the server's sum and BPE.
    """
    documents = sum(len(d) for d in clients.values())
    mechanism = histogram_mechanism(cfg, documents) if privacy else None
    t0 = time.perf_counter()
    releases = []
    for partition, name in enumerate(sorted(clients)):
        counts, _ = client_histogram(pipe, clients[name], cfg.max_doc_bytes, mechanism)
        releases.append(histogram_release(counts, mechanism, noise_rng(partition, 2)))
    result = train_from_releases(
        releases, mechanism, cfg.vocab_size - len(cfg.special_tokens), theta=cfg.theta,
        merges_per_round=cfg.merges_per_round, merges_growth=cfg.merges_growth, merges_ratio=cfg.merges_ratio,
        seed=cfg.seed, max_rounds=cfg.max_rounds,
    )
    return FederatedRun(
        tokenizer=build_tokenizer(result.merges, cfg.special_tokens),
        merges=result.merges,
        rounds=1,  # one query round; the BPE on the server's table is local
        stop_reason=result.stop_reason,
        privacy=tokenizer_privacy(result.privacy, documents=documents, delta=cfg.delta, noise=privacy,
                                  max_doc_bytes=cfg.max_doc_bytes),
        wall_seconds=time.perf_counter() - start,
        train_seconds=time.perf_counter() - t0,
        history=[(int(h["vocab"]), float(h["time"]) - t0) for h in result.history],
    )


def histogram_mechanism(cfg: TokenizerConfig, documents: int) -> HistogramMechanism:
    """σ and τ for the config's total (ε, δ) per document and its contribution bound (k, c)."""
    delta = default_delta(documents) if cfg.delta is None else cfg.delta
    return calibrate(cfg.epsilon, delta, cfg.histogram_words, cfg.histogram_count)


def train_centralized(texts: Sequence[str], vocab_size: int, special_tokens: Sequence[str] = ()) -> Tokenizer:
    """HF ``BpeTrainer`` on pooled (already wiped) text with the same pre-tokenizer and byte alphabet."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = build_pre_tokenizer()
    tok.decoder = build_decoder()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=0,
        special_tokens=list(special_tokens),
        initial_alphabet=list(bytes_to_unicode().values()),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def publish_tokenizer(
    registry_root: Path, tok: Tokenizer, cfg: TokenizerConfig, *, metrics: dict[str, Any], privacy: dict[str, Any],
    card: str,
) -> Any:
    """Write ``tokenizer.json`` into a new registry version (atomic publish) and return that version."""
    from fedfraud.training.registry import ModelRegistry

    registry = ModelRegistry(registry_root)
    with registry.publish("tokenizer", config=cfg.model_dump(), metrics=metrics, privacy=privacy, card=card) as stage:
        save_tokenizer(tok, stage)
    return registry.latest("tokenizer")

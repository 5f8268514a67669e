"""Typed configuration of the federated byte-level BPE tokenizer (``fedfraud tokenizer ...``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["TokenizerConfig", "MIN_VOCAB_SIZE"]

MIN_VOCAB_SIZE = 256  # the byte alphabet; a byte-level BPE cannot be smaller


class TokenizerConfig(BaseModel):
    """Every knob of the privacy-aware corpus pipeline and of FedByteBPE (paper Algorithms 4-5)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab_size: int = Field(8000, description="256 bytes + merges + special tokens; the paper uses 50,257")
    special_tokens: list[str] = Field(default_factory=lambda: ["<|endoftext|>"])
    mode: Literal["single", "batched", "histogram"] = Field(
        "batched", description="single: the paper's one merge per round; batched: several non-conflicting merges; "
        "histogram: each client releases one DP word histogram (Gaussian partition selection) and the server runs "
        "BPE on their sum with the batched schedule (training/tokenizer/histogram.py; p, k_fraction, top_n and "
        "pair_tokens do not apply; set epsilon, the total, e.g. 8: chosen on validation corpora, docs/tokenizer.md)",
    )
    merges_per_round: int = Field(
        256, ge=1, description="upper bound on merges per round in batched mode (256 with growth 0.1: chosen on "
        "validation corpora, docs/tokenizer.md; 128 and 1/16 before issue 42 part 4)",
    )
    merges_growth: float = Field(
        0.1, ge=0.0, le=0.25,
        description="batched mode: allow up to merges_growth × current vocabulary merges per round when that "
        "exceeds merges_per_round (0: fixed batch)",
    )
    merges_ratio: float = Field(
        0.0, ge=0.0, le=1.0,
        description="batched mode: a round may take more merges than its limit when that many pairs have a total of "
        "at least merges_ratio × the round's best (a flat ranking; 0: off). With exact counts 0.5 halves the rounds "
        "at equal psi; under the default noise it costs psi at 8k (docs/tokenizer.md)",
    )
    theta: float = Field(8.0, ge=0.0, description="server threshold: keep keys whose aggregated count is > theta")
    epsilon: float = Field(
        1.0, gt=0.0, description="single / batched: Laplace ε of one release for one document (the card composes the "
        "releases); histogram: the TOTAL ε per document over all releases (one per client). Noise off only with "
        "--no-privacy",
    )
    delta: float | None = Field(
        None, gt=0.0, lt=1.0, description="δ of the composed (ε, δ) in the card (histogram mode: the total δ that "
        "σ and τ are calibrated for); None: 1 / (10 × documents)"
    )
    max_doc_bytes: int = Field(
        1024, ge=1, description="a document contributes at most its first max_doc_bytes bytes of words: the L1 "
        "sensitivity of a release (Laplace scale = max_doc_bytes / epsilon)",
    )
    histogram_words: int = Field(
        96, ge=1, description="histogram mode: k, the distinct words a document contributes to (its first k within "
        "max_doc_bytes); L2 sensitivity histogram_count × √k",
    )
    histogram_count: int = Field(
        1, ge=1, description="histogram mode: c, how often a document counts one word at most (1: document frequency)",
    )
    pair_tokens: int = Field(
        128, ge=2, description="with noise, the pair phase's public domain is all pairs of the top pair_tokens tokens",
    )
    p: float = Field(1.0, gt=0.0, le=1.0, description="fraction of local words each client samples per phase")
    k_fraction: float = Field(1.0, gt=0.0, le=1.0, description="fraction K of clients sampled per phase")
    top_n: int | None = Field(
        4096, ge=1,
        description="keys each client sends per phase, by noisy count (the paper sends its top 1); None sends all. "
        "4096 matched sending all on psi at 8k (docs/tokenizer.md) at half the in-process time",
    )
    clients: int = Field(30, ge=1, description="institutions in the generated corpus")
    docs_per_client: int = Field(150, ge=1, description="generated documents per institution")
    bench_docs_per_client: int = Field(
        400, ge=1,
        description="generated documents per institution in `fedfraud bench tokenizer` (multilingual corpus, "
        "large enough for vocabularies beyond 8k)",
    )
    pii_rate: float = Field(0.6, ge=0.0, le=1.0, description="share of generated documents with seeded PII")
    ner: bool = Field(False, description="also use the optional Presidio/spaCy NER recognizer (extra: pii-ner)")
    engine: Literal["simulation", "loopback"] = Field(
        "simulation", description="how the Flower apps run (`tokenizer train --backend flower`, the bench): "
        "simulation: Flower's simulation engine on Ray, one SuperNode per institution; loopback: the same ServerApp "
        "and ClientApp in this process over the loopback grid, every message serialized as over the SuperLink",
    )
    max_rounds: int = Field(100_000, ge=1, description="safety stop for the federated loop")
    seed: int = 7

    @field_validator("vocab_size")
    @classmethod
    def _at_least_bytes(cls, value: int) -> int:
        if value < MIN_VOCAB_SIZE:
            raise ValueError(f"vocab_size must be >= {MIN_VOCAB_SIZE} (the byte alphabet), got {value}")
        return value

    @property
    def target_merges(self) -> int:
        """Merges needed so that bytes + merges + specials equals ``vocab_size``."""
        return max(0, self.vocab_size - MIN_VOCAB_SIZE - len(self.special_tokens))

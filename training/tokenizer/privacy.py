"""The tokenizer's privacy account: per-release Laplace DP per document, composed over all of a client's releases.

Unit of privacy: one document. The corpus pipeline keeps at most
``max_doc_bytes`` bytes of each document's words, and every byte lies in
exactly one token (and starts at most one pair), so adding or removing one
document changes a release's count vector by at most ``max_doc_bytes`` in
L1. With Laplace noise of scale ``max_doc_bytes / ε`` on every key of the
public domain (:class:`~fedfraud.training.tokenizer.bpe.ReleaseParams`), one release is
ε-DP for that document. A client releases once per phase in which it is
sampled; those R releases are composed with the PLD accountant of
``dp-accounting`` (Laplace, R-fold) and, as a cross-check, basic
composition R·ε; the card reports the smaller. Subsampling with ``p``
draws word occurrences, not documents, so no amplification is claimed for
it. The server's threshold θ and the merge choice are post-processing.

``mode: histogram`` releases once per client instead (``histogram.py``: Gaussian partition selection on a
document-bounded word histogram); its card reports that one release's (ε, δ).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ACCOUNTANT", "composed_epsilon", "default_delta", "tokenizer_privacy"]

ACCOUNTANT = "dp_accounting PLD (Laplace mechanism, self-composed over the client's releases); basic composition"


def default_delta(documents: int) -> float:
    """δ of the reported total when none is configured: 1 / (10 × documents), below 1/documents."""
    if documents < 1:
        raise ValueError("the corpus has no documents")
    return 1.0 / (10.0 * documents)


def composed_epsilon(epsilon: float, releases: int, delta: float) -> float:
    """ε at ``delta`` of ``releases`` ε-DP Laplace releases: min(PLD, basic R·ε)."""
    if releases < 0 or epsilon <= 0 or not 0 < delta < 1:
        raise ValueError(f"need releases >= 0, epsilon > 0, 0 < delta < 1; got {releases}, {epsilon}, {delta}")
    if releases == 0:
        return 0.0
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    accountant = PLDAccountant()
    # LaplaceDpEvent's parameter is scale / sensitivity = 1/ε
    accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(1.0 / epsilon), releases))
    return float(min(accountant.get_epsilon(delta), releases * epsilon))


def _histogram_privacy(
    raw: Mapping[str, Any], *, documents: int, delta: float | None, max_doc_bytes: int
) -> dict[str, Any]:
    """The card's privacy section for histogram mode: one Gaussian partition-selection release per client."""
    from fedfraud.training.tokenizer.histogram import ACCOUNTANT as HISTOGRAM_ACCOUNTANT

    k, c = int(raw["max_words"]), int(raw["max_count"])
    eps, d = float(raw["epsilon"]), float(raw["delta"])
    return {
        "privacy": "on",
        "unit_of_privacy": f"one document (its first {max_doc_bytes} bytes of words, of those its first {k} distinct "
        f"words, each counted at most {c} time{'s' if c > 1 else ''}; the rest is never counted)",
        "epsilon": eps,
        "delta": d,
        "epsilon_per_release": eps,
        "releases_per_client": int(raw.get("max_releases_per_client", 1)),
        "accountant": HISTOGRAM_ACCOUNTANT,
        "mechanism": f"histogram: each client releases once its words' counts plus N(0, σ²), σ = {raw['sigma']:.4g}, "
        f"only those above τ = {raw['tau']:.4g} (L2 sensitivity c·√k = {raw['sensitivity']:.4g}); the server sums "
        "them and runs BPE on the sum (post-processing)",
        "k": k,
        "c": c,
        "sigma": float(raw["sigma"]),
        "tau": float(raw["tau"]),
        "delta_gaussian": float(raw["delta_gaussian"]),
        "delta_selection": float(raw["delta_selection"]),
        "documents": documents,
        "delta_rule": "1 / (10 x documents), half to the Gaussian noise, half to the selection"
        if delta is None else "configured, half to the Gaussian noise, half to the selection",
        **({"note": "total epsilon above 10: a weak guarantee"} if not eps <= 10.0 else {}),
    }


def tokenizer_privacy(
    raw: Mapping[str, Any], *, documents: int, delta: float | None, noise: bool, max_doc_bytes: int
) -> dict[str, Any]:
    """The tokenizer card's privacy section from the server's raw figures (:meth:`FedBPEServer.privacy`)."""
    releases = int(raw.get("max_releases_per_client", 0))
    if not noise:
        return {
            "privacy": "OFF (--no-privacy): every client released its exact counts; no differential privacy",
            "epsilon": "none",
            "releases_per_client": releases,
            "documents": documents,
        }
    if raw.get("mechanism") == "histogram":
        return _histogram_privacy(raw, documents=documents, delta=delta, max_doc_bytes=max_doc_bytes)
    eps = float(raw["epsilon_per_release"])
    d = default_delta(documents) if delta is None else float(delta)
    total = composed_epsilon(eps, releases, d)
    return {
        "privacy": "on",
        "unit_of_privacy": f"one document (its first {max_doc_bytes} bytes of words; the rest is never counted)",
        "epsilon": total,
        "delta": d,
        "epsilon_per_release": eps,
        "releases_per_client": releases,
        "basic_composition_epsilon": releases * eps,
        "accountant": ACCOUNTANT,
        "mechanism": f"Laplace, scale {raw.get('noise_scale')} = sensitivity {raw.get('sensitivity')} / epsilon, on "
        "every key of a public domain (all token ids; all pairs of the server's top "
        f"{raw.get('pair_tokens')} tokens), then the top keys by noisy count",
        "documents": documents,
        "delta_rule": "1 / (10 x documents)" if delta is None else "configured",
        "subsampling": f"p = {raw.get('p')} of word occurrences; no amplification claimed",
        **({"note": "total epsilon above 10: a weak guarantee"} if not total <= 10.0 else {}),
    }

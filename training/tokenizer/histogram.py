"""The tokenizer's one-release mode (``tokenizer.mode: histogram``): a DP word histogram per client, exact BPE after.

BPE needs nothing but the (word, count) table, so each client releases that
table once and the server trains on the sum of the releases. The release is
*differentially private partition selection* with Gaussian noise (Wilson et
al. 2020, "Differentially Private SQL with Bounded User Contribution", PoPETs
2020(2); Gopi et al. 2020, "Differentially Private Set Union", ICML 2020):

* **unit**: one document, its first ``max_doc_bytes`` bytes of words, and of
  those only its first ``max_words`` (k) distinct words, each counted at most
  ``max_count`` (c) times (:func:`~fedfraud.training.tokenizer.pretokenize.document_contribution`,
  a rule that looks at the document alone). Adding or removing a document
  changes at most k counts by at most c each: L2 sensitivity Δ = c·√k;
* **noise**: every word the client holds gets N(0, σ²) added to its count;
* **selection**: only words whose noisy count exceeds τ are released. A word
  no document holds is never released, so the release's key set depends on
  the data; what keeps that private is τ: a word only the removed document
  holds has a count ≤ c, so it crosses τ with probability at most
  P(N(0, σ²) > τ − c), and that document holds at most k such words.

(ε, δ): the noisy counts of the words both neighbours hold are the Gaussian
mechanism at sensitivity Δ, (ε, δ_gauss)-DP by dp-accounting's PLD accountant
(``GaussianDpEvent``, one release); the words only one of them holds add
δ_sel = k · P(N(0, σ²) > τ − c). Total: (ε, δ_gauss + δ_sel). σ is the
smallest whose PLD ε at δ_gauss is ≤ the target ε, and τ the smallest with
δ_sel equal to its share. δ is split in half (:data:`GAUSSIAN_SHARE`): τ grows
only like σ·√(2 ln(k/δ_sel)), so a smaller δ_sel costs little, and σ barely
moves with δ_gauss either; half and half keeps both figures in the card plain.

Each client's release reaches the server on its own (no secure aggregation),
and it is DP on its own: a document lives in one client, so the run as a whole
is (ε, δ)-DP per document with one release per client (parallel composition).
Secure aggregation sums vectors over a domain all clients know in advance;
here the domain (which words exist) is what each client discovers and
releases, so the key set must be private per client anyway, and the counts
released with it are covered by the same (ε, δ). The server's sum, its
threshold θ and the BPE it runs on the table are post-processing.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedfraud.training.tokenizer.bpe import ClientState, FedBPEResult, FedBPEServer, ReleaseParams, train_in_process
from fedfraud.training.tokenizer.pretokenize import CorpusPipeline, CorpusReport

__all__ = [
    "ACCOUNTANT",
    "GAUSSIAN_SHARE",
    "HistogramMechanism",
    "WordRelease",
    "calibrate",
    "client_histogram",
    "gaussian_epsilon",
    "histogram_release",
    "pack_words",
    "selection_delta",
    "sum_releases",
    "train_from_releases",
    "train_on_histogram",
    "unpack_words",
]

log = logging.getLogger(__name__)

#: Share of the total δ given to the Gaussian mechanism; the rest goes to the selection (δ_sel).
GAUSSIAN_SHARE = 0.5
ACCOUNTANT = ("dp_accounting PLD (Gaussian mechanism, one release per client) + partition-selection "
              "δ_sel = k·P(N(0, σ²) > τ − c) (Wilson et al. 2020; Gopi et al. 2020)")


#: PLD grid step: 1e-3 gives dp-accounting's default (1e-4) ε to 7 digits (8.347094 at multiplier 0.6, δ = 4e-6) in
#: a tenth of the time (at multipliers near 0.6 the default took seconds per evaluation); the PLD estimate is
#: pessimistic (an upper bound on ε) at any step.
PLD_STEP = 1e-3
#: Smallest noise multiplier tried (ε ≈ 34 at δ = 4e-6); below it the PLD grid grows past memory.
MIN_MULTIPLIER = 0.2


def _accountant() -> Any:
    from dp_accounting.pld import PLDAccountant

    return PLDAccountant(value_discretization_interval=PLD_STEP)


def gaussian_epsilon(noise_multiplier: float, delta: float) -> float:
    """ε at ``delta`` of one Gaussian release with σ = ``noise_multiplier`` × L2 sensitivity (dp-accounting PLD)."""
    import dp_accounting

    accountant = _accountant()
    accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier))
    return float(accountant.get_epsilon(delta))


def selection_delta(sigma: float, tau: float, max_words: int, max_count: int) -> float:
    """δ_sel: the chance that any of a document's ≤ ``max_words`` words of its own (count ≤ ``max_count``) is
    released, k · P(N(0, σ²) > τ − c) (union bound).
    """
    from scipy.stats import norm

    return float(max_words * norm.sf((tau - max_count) / sigma))


@dataclass(frozen=True)
class HistogramMechanism:
    """The calibrated release: contribution bound (k, c), noise σ, threshold τ and the (ε, δ) they give."""

    max_words: int
    max_count: int
    sigma: float
    tau: float
    epsilon: float  # dp-accounting's ε of the Gaussian part at delta_gaussian (≤ the target)
    delta_gaussian: float
    delta_selection: float

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of a client's count vector to one document: c·√k."""
        return self.max_count * math.sqrt(self.max_words)

    @property
    def delta(self) -> float:
        return self.delta_gaussian + self.delta_selection

    def privacy(self) -> dict[str, Any]:
        """The raw figures the card needs (:func:`~fedfraud.training.tokenizer.privacy.tokenizer_privacy`)."""
        return {
            "mechanism": "histogram", "max_words": self.max_words, "max_count": self.max_count,
            "sensitivity": self.sensitivity, "sigma": self.sigma, "tau": self.tau, "epsilon": self.epsilon,
            "delta": self.delta, "delta_gaussian": self.delta_gaussian, "delta_selection": self.delta_selection,
            "max_releases_per_client": 1,
        }


def calibrate(
    epsilon: float, delta: float, max_words: int, max_count: int = 1, gaussian_share: float = GAUSSIAN_SHARE,
) -> HistogramMechanism:
    """σ and τ for a total (``epsilon``, ``delta``) per document: the smallest σ whose dp-accounting ε at
    ``gaussian_share``·δ is ≤ ``epsilon`` (``mechanism_calibration.calibrate_dp_mechanism``, PLD), then τ with
    δ_sel = the rest.
    """
    if epsilon <= 0 or not 0 < delta < 1 or max_words < 1 or max_count < 1 or not 0 < gaussian_share < 1:
        raise ValueError(f"need epsilon > 0, 0 < delta < 1, k, c >= 1; got {epsilon}, {delta}, {max_words}, "
                         f"{max_count}, share {gaussian_share}")
    from scipy.stats import norm

    import dp_accounting
    from dp_accounting import mechanism_calibration

    d_gauss = gaussian_share * delta
    d_sel = delta - d_gauss
    if gaussian_epsilon(MIN_MULTIPLIER, d_gauss) <= epsilon:
        raise ValueError(f"epsilon {epsilon} is above what noise multiplier {MIN_MULTIPLIER} gives at delta "
                         f"{d_gauss:.3g}: no meaningful guarantee to calibrate for")
    multiplier = float(mechanism_calibration.calibrate_dp_mechanism(
        _accountant, dp_accounting.GaussianDpEvent, epsilon, d_gauss,
        bracket_interval=mechanism_calibration.LowerEndpointAndGuess(MIN_MULTIPLIER, 1.0), tol=1e-4,
    ))
    sensitivity = max_count * math.sqrt(max_words)
    sigma = multiplier * sensitivity
    tau = max_count + sigma * float(norm.isf(d_sel / max_words))
    return HistogramMechanism(
        max_words=max_words, max_count=max_count, sigma=sigma, tau=tau, epsilon=gaussian_epsilon(multiplier, d_gauss),
        delta_gaussian=d_gauss, delta_selection=selection_delta(sigma, tau, max_words, max_count),
    )


@dataclass
class WordRelease:
    """What one client sends in histogram mode: words (UTF-8 bytes of pre-tokenized words) and their noisy counts."""

    words: list[bytes]
    values: np.ndarray

    def __post_init__(self) -> None:
        self.values = np.asarray(self.values, dtype=np.float64)
        if len(self.words) != len(self.values):
            raise ValueError("words and values differ in length")


def client_histogram(
    pipe: CorpusPipeline, docs: Iterable[str | bytes], max_doc_bytes: int, mechanism: HistogramMechanism | None,
) -> tuple[dict[bytes, int], CorpusReport]:
    """A client's counts before noise: each document's first ``max_doc_bytes`` bytes of words, its first k distinct
    words, each at most c times; without a mechanism (``--no-privacy``) every word of every document, as counted.
    """
    if mechanism is None:
        return pipe.count_word_bytes(docs)
    return pipe.count_word_bytes(docs, max_doc_bytes, mechanism.max_words, mechanism.max_count)


def histogram_release(
    word_counts: Mapping[bytes, float], mechanism: HistogramMechanism | None, rng: np.random.Generator,
) -> WordRelease:
    """A client's one release: its (already bounded) counts plus N(0, σ²), only those above τ, in byte order.

    ``mechanism=None`` (``--no-privacy``): the exact non-zero counts of every word.
    """
    words = sorted(w for w, c in word_counts.items() if w and c > 0)
    counts = np.fromiter((word_counts[w] for w in words), dtype=np.float64, count=len(words))
    if mechanism is None:
        return WordRelease(words, counts)
    noisy = counts + rng.normal(0.0, mechanism.sigma, size=len(counts))
    keep = np.flatnonzero(noisy > mechanism.tau)
    return WordRelease([words[i] for i in keep], noisy[keep])


def sum_releases(releases: Iterable[WordRelease], theta: float) -> dict[bytes, float]:
    """The server's table: per word, the sum of the released noisy counts (0 where a client did not release it),
    words whose sum is > ``theta``. Summed in an order fixed by the releases' content (as
    :func:`~fedfraud.training.tokenizer.bpe.aggregate_arrays`), so every engine gets the same floats.
    """
    rels = sorted((r for r in releases if r.words), key=lambda r: (r.values.tobytes(), b"\0".join(r.words)))
    table: dict[bytes, float] = {}
    for rel in rels:
        for word, value in zip(rel.words, rel.values.tolist(), strict=True):
            table[word] = table.get(word, 0.0) + value
    return {w: v for w, v in table.items() if v > theta}


def pack_words(words: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Words as one uint8 array of their bytes back to back and an int32 array of their lengths (what travels)."""
    data = np.frombuffer(b"".join(words), dtype=np.uint8)
    return data, np.fromiter((len(w) for w in words), dtype=np.int32, count=len(words))


def unpack_words(data: np.ndarray, lengths: np.ndarray) -> list[bytes]:
    """Inverse of :func:`pack_words`."""
    raw = np.asarray(data, dtype=np.uint8).tobytes()
    ends = np.cumsum(np.asarray(lengths, dtype=np.int64)).tolist()
    return [raw[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def train_on_histogram(
    table: Mapping[bytes, float], target_tokens: int, *, merges_per_round: int, merges_growth: float,
    merges_ratio: float, seed: int, max_rounds: int = 1_000_000,
) -> FedBPEResult:
    """Exact BPE on the server's table with the project's merge loop (:class:`FedBPEServer` over one
    :class:`ClientState` holding the table, no noise, θ = 0, the batched schedule). It stops when no pair is left,
    i.e. every word of the table is one token: the vocabulary then holds fewer than ``target_tokens`` tokens and
    ``stop_reason`` says so; no merge comes from outside the released words.
    """
    server = FedBPEServer(
        target_tokens, theta=0.0, mode="batched", merges_per_round=merges_per_round, merges_growth=merges_growth,
        merges_ratio=merges_ratio, release=ReleaseParams(), seed=seed,
    )
    start = time.perf_counter()
    result = train_in_process({"server": ClientState(table)}, server, max_rounds=max_rounds)
    if result.stop_reason == "no vocabulary left":
        result.stop_reason = (
            f"the word table ran out of pairs at {result.vocab_size:,} tokens < {target_tokens:,}: every "
            f"released word ({len(table):,}) is one token; no merge is taken from outside the released words"
        )
    log.info("histogram BPE words=%d vocab=%d rounds=%d %.1f s", len(table), result.vocab_size, result.rounds,
             time.perf_counter() - start)
    return result


def train_from_releases(
    releases: Iterable[WordRelease], mechanism: HistogramMechanism | None, target_tokens: int, *, theta: float,
    merges_per_round: int, merges_growth: float, merges_ratio: float, seed: int, max_rounds: int = 1_000_000,
) -> FedBPEResult:
    """The server's whole side: sum the releases, keep sums > θ, train BPE, attach the privacy figures."""
    rels = list(releases)
    table = sum_releases(rels, theta)
    result = train_on_histogram(table, target_tokens, merges_per_round=merges_per_round, merges_growth=merges_growth,
                                merges_ratio=merges_ratio, seed=seed, max_rounds=max_rounds)
    result.privacy = {**(mechanism.privacy() if mechanism is not None else {"mechanism": "histogram"}),
                      "max_releases_per_client": 1, "released_words": sum(len(r.words) for r in rels),
                      "table_words": len(table), "theta": theta}
    return result

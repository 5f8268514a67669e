"""FedByteBPE core (paper Algorithms 4-5) in plain Python: client counting and server aggregation.

The Flower app (``server_app.py`` / ``client_app.py``) only moves the values
these functions produce; all merge logic lives here so it is testable without
Ray. Token ids are global and deterministic: ``0..255`` are the bytes, and each
accepted merge whose byte string is new gets the next id, so a client that
applied the same merge list holds the same ids as the server.

One round = single-token phase (K sampled clients release noisy unigram counts;
the server keeps ids whose sum is > theta) + pair phase (K sampled clients
release noisy counts of pairs whose left token was kept; the server keeps pairs
whose sum is > theta and picks the merge). ``mode="single"`` is the paper's one
merge per round; ``mode="batched"`` takes up to ``merges_per_round`` pairs in
rank order that cannot overlap in any word (no chosen pair's right token is
another's left token), so applying them in sequence is the same as applying
them at once and none changes another's count.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from fedfraud.training.tokenizer.pretokenize import unicode_to_bytes

__all__ = [
    "Merge",
    "Release",
    "ReleaseParams",
    "ClientState",
    "Vocabulary",
    "FedBPEServer",
    "FedBPEResult",
    "aggregate",
    "select_merges",
    "sample_clients",
    "reference_bpe",
    "train_in_process",
    "words_to_bytes",
    "pair_code",
]

log = logging.getLogger(__name__)

Pair = tuple[int, int]
Key = int | Pair


@dataclass(frozen=True)
class Merge:
    """One broadcast merge: ``left + right`` becomes token ``new_id``."""

    left: int
    right: int
    new_id: int


@dataclass(frozen=True)
class ReleaseParams:
    """What a client does before releasing counts: subsample (p), add Laplace(sensitivity/epsilon), keep top_n.

    With noise (``epsilon`` set) the release is *dense over a public domain*:
    every current token id (single phase) or every pair of the server's
    allowed tokens (pair phase) gets a noisy count, zero or not, so which keys
    a client holds is not revealed by which keys it sends. ``sensitivity`` is
    the L1 bound of one document's contribution to a release's counts (the
    corpus pipeline's ``max_doc_bytes``), so each release is ε-DP per document.
    Without noise the client sends its exact non-zero counts (the paper's
    algorithm, for tests and ``--no-privacy``).
    """

    p: float = 1.0
    epsilon: float | None = None
    sensitivity: float = 1.0
    top_n: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.p <= 1.0:
            raise ValueError(f"p must be in (0, 1], got {self.p}")
        if self.epsilon is not None and self.epsilon <= 0:
            raise ValueError(f"epsilon must be > 0 or None, got {self.epsilon}")
        if self.sensitivity <= 0:
            raise ValueError(f"sensitivity must be > 0, got {self.sensitivity}")

    @property
    def noise_scale(self) -> float:
        """Laplace scale b = sensitivity / ε (0 without noise)."""
        return 0.0 if self.epsilon is None else self.sensitivity / self.epsilon


_SHIFT = 32  # a pair (a, b) is packed as the int64 code a << 32 | b
_LOW = (1 << _SHIFT) - 1


def pair_code(left: int, right: int) -> int:
    """One int per pair, so counts live in int-keyed dicts and travel as one int64 array."""
    return left << _SHIFT | right


@dataclass
class Release:
    """What one client sends in one phase: token ids (``right`` only for pairs) and noisy counts.

    Arrays, not Python lists: they are what travels (an ``ArrayRecord``) and what the server sums with numpy.
    ``nvl``: no vocabulary left.
    """

    left: np.ndarray
    values: np.ndarray
    right: np.ndarray | None = None
    nvl: bool = False

    def __post_init__(self) -> None:
        self.left = np.asarray(self.left, dtype=np.int64)
        self.values = np.asarray(self.values, dtype=np.float64)
        if self.right is not None:
            self.right = np.asarray(self.right, dtype=np.int64)
        if len(self.left) != len(self.values) or (self.right is not None and len(self.right) != len(self.left)):
            raise ValueError("keys and values differ in length")

    @classmethod
    def nothing(cls, nvl: bool = True) -> Release:
        """An empty release (a client with no data, or nothing that passed the filter)."""
        return cls(np.zeros(0, np.int64), np.zeros(0, np.float64), None, nvl)

    @property
    def codes(self) -> np.ndarray:
        """Single ids, or pairs packed by :func:`pair_code`."""
        return self.left if self.right is None else (self.left << _SHIFT) | self.right

    @property
    def keys(self) -> list[Key]:
        """Keys as Python values: ids, or ``(left, right)`` pairs (for the audit log and tests)."""
        if self.right is None:
            return [int(k) for k in self.left]
        return list(zip(self.left.tolist(), self.right.tolist(), strict=True))

    def as_dict(self) -> dict[Key, float]:
        return dict(zip(self.keys, self.values.tolist(), strict=True))


def words_to_bytes(word_counts: Mapping[str, int]) -> dict[bytes, int]:
    """Byte-level words (``ByteLevel`` alphabet) -> raw byte strings."""
    table = unicode_to_bytes()
    out: dict[bytes, int] = {}
    for word, count in word_counts.items():
        key = bytes(table[c] for c in word)
        out[key] = out.get(key, 0) + count
    return out


class Vocabulary:
    """Token id <-> byte string, shared by construction between server and clients."""

    def __init__(self) -> None:
        self.tokens: list[bytes] = [bytes([b]) for b in range(256)]
        self.ids: dict[bytes, int] = {t: i for i, t in enumerate(self.tokens)}
        self.merges: list[Merge] = []

    def __len__(self) -> int:
        return len(self.tokens)

    def add_merge(self, left: int, right: int) -> Merge:
        """Record a merge; a byte string seen before keeps its id (as HF ``BpeTrainer`` does)."""
        joined = self.tokens[left] + self.tokens[right]
        new_id = self.ids.get(joined)
        if new_id is None:
            new_id = len(self.tokens)
            self.tokens.append(joined)
            self.ids[joined] = new_id
        merge = Merge(left, right, new_id)
        self.merges.append(merge)
        return merge

    def merge_bytes(self) -> list[tuple[bytes, bytes]]:
        return [(self.tokens[m.left], self.tokens[m.right]) for m in self.merges]


class ClientState:
    """One client's words as token-id sequences, with incrementally maintained unigram and pair counts."""

    def __init__(self, word_counts: Mapping[bytes, int]) -> None:
        items = [(w, c) for w, c in word_counts.items() if w and c > 0]
        self.words: list[list[int]] = [list(w) for w, _ in items]
        self.freqs = np.array([c for _, c in items], dtype=np.int64)
        self._freqs: list[int] = self.freqs.tolist()  # Python ints for the per-word loops
        self.applied = 0  # number of global merges applied so far
        self.vocab_size = 256  # ids 0..vocab_size-1 exist (bytes + merges seen): the public single-phase domain
        self.unigrams: Counter[int] = Counter()
        self.pairs: Counter[int] = Counter()  # keyed by pair_code
        self.where: dict[int, set[int]] = defaultdict(set)
        for i, word in enumerate(self.words):
            self._add(i, word, self._freqs[i])

    @property
    def empty(self) -> bool:
        return not self.words

    def _add(self, i: int, word: list[int], f: int, sign: int = 1) -> None:
        for t in word:
            self.unigrams[t] += sign * f
        for a, b in zip(word, word[1:], strict=False):
            code = a << _SHIFT | b
            self.pairs[code] += sign * f
            if sign > 0:
                self.where[code].add(i)

    def apply(self, merges: Sequence[Merge]) -> None:
        """ClientUpdateDataset: replace each ``left right`` by ``new_id`` in every word, in merge order."""
        if not merges:
            return
        for m in merges:
            left, right, new = m.left, m.right, m.new_id
            self.vocab_size = max(self.vocab_size, new + 1)
            # ``where`` keeps indices of words that once held the pair; a merge cannot re-create its own pair
            # (the new token differs from both parts), so the entry is dropped and stale indices are skipped.
            for i in self.where.pop(pair_code(left, right), ()):
                word = self.words[i]
                n = len(word)
                out, j = [], 0
                while j < n:
                    if j + 1 < n and word[j] == left and word[j + 1] == right:
                        out.append(new)
                        j += 2
                    else:
                        out.append(word[j])
                        j += 1
                if len(out) == n:
                    continue
                f = self._freqs[i]
                self._add(i, word, f, sign=-1)
                self.words[i] = out
                self._add(i, out, f)
            self.applied += 1
        for c in (self.unigrams, self.pairs):
            for k in [k for k, v in c.items() if v <= 0]:
                del c[k]

    def _subsampled(self, rng: np.random.Generator, p: float) -> tuple[Counter[int], Counter[int]]:
        """Counts over a fresh Binomial(f, p) sample of the word occurrences (RandomSampler(D_i, p))."""
        kept = rng.binomial(self.freqs, p)
        uni: Counter[int] = Counter()
        pairs: Counter[int] = Counter()
        for i in np.flatnonzero(kept):
            f = int(kept[i])
            word = self.words[i]
            for t in word:
                uni[t] += f
            for a, b in zip(word, word[1:], strict=False):
                pairs[a << _SHIFT | b] += f
        return uni, pairs

    def release(
        self, phase: Literal["single", "pair"], params: ReleaseParams, rng: np.random.Generator,
        allowed_left: Iterable[int] | None = None,
    ) -> Release:
        """ClientSendTuples: subsample, count, add Laplace noise, sort, keep the top ``top_n``.

        With noise even a client without documents sends a dense noisy release, so that removing its last
        document does not change the shape of what it sends.
        """
        if self.empty and params.epsilon is None:
            return Release.nothing()
        if params.p < 1.0:
            uni, pairs = self._subsampled(rng, params.p)
        else:
            uni, pairs = self.unigrams, self.pairs
        counts = uni if phase == "single" else pairs
        if params.epsilon is not None:
            return self._dense_release(phase, counts, params, rng, allowed_left)
        keys = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        values = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
        if phase == "pair":
            allowed = np.fromiter(() if allowed_left is None else allowed_left, dtype=np.int64)
            mask = np.isin(keys >> _SHIFT, allowed)
            keys, values = keys[mask], values[mask]
        if not len(keys):
            return Release.nothing()
        return self._top(phase, keys, values, params)

    def _dense_release(
        self, phase: str, counts: Counter[int], params: ReleaseParams, rng: np.random.Generator,
        allowed: Iterable[int] | None,
    ) -> Release:
        """Noisy counts of every key of the public domain: all token ids, or all pairs of allowed tokens."""
        if phase == "single":
            keys = np.arange(self.vocab_size, dtype=np.int64)
        else:
            tokens = np.unique(np.fromiter(() if allowed is None else allowed, dtype=np.int64))
            if not len(tokens):
                return Release.nothing(nvl=False)
            keys = ((tokens[:, None] << _SHIFT) | tokens[None, :]).ravel()
        values = np.fromiter((counts.get(int(k), 0) for k in keys), dtype=np.float64, count=len(keys))
        values += rng.laplace(0.0, params.noise_scale, size=len(keys))
        return self._top(phase, keys, values, params)

    @staticmethod
    def _top(phase: str, keys: np.ndarray, values: np.ndarray, params: ReleaseParams) -> Release:
        order = np.argsort(-values, kind="stable")
        if params.top_n is not None:
            order = order[: params.top_n]
        keys, values = keys[order], values[order]
        if phase == "single":
            return Release(keys, values)
        return Release(keys >> _SHIFT, values, keys & _LOW)


def aggregate(releases: Iterable[Release], theta: float) -> dict[Key, float]:
    """ServerAggregateTuples: sum the noisy counts per key and keep keys whose sum is > theta."""
    rels = [r for r in releases if len(r.left)]
    if not rels:
        return {}
    codes = np.concatenate([r.codes for r in rels])
    values = np.concatenate([r.values for r in rels])
    uniq, inverse = np.unique(codes, return_inverse=True)
    totals = np.bincount(inverse, weights=values, minlength=len(uniq))  # sums in arrival order, as a loop would
    keep = totals > theta
    kept_codes, kept_totals = uniq[keep].tolist(), totals[keep].tolist()
    if rels[0].right is None:
        return dict(zip(kept_codes, kept_totals, strict=True))
    return {(c >> _SHIFT, c & _LOW): v for c, v in zip(kept_codes, kept_totals, strict=True)}


def select_merges(
    pair_totals: Mapping[Pair, float], vocab: Vocabulary, limit: int, mode: Literal["single", "batched"]
) -> list[Pair]:
    """Rank pairs by total (ties: smaller left bytes, then right bytes) and pick one, or a disjoint batch."""
    ranked = sorted(pair_totals.items(), key=lambda kv: (-kv[1], vocab.tokens[kv[0][0]], vocab.tokens[kv[0][1]]))
    if mode == "single" or limit <= 1:
        return [ranked[0][0]] if ranked else []
    chosen: list[Pair] = []
    lefts: set[int] = set()
    rights: set[int] = set()
    for (a, b), _ in ranked:
        # (a, b) and (c, d) can overlap in a word only if b == c or d == a; a pair whose right token is the
        # left of a chosen pair would also have its count changed by that merge. Skip such pairs this round.
        if a in rights or b in lefts or (a == b and (a in lefts or a in rights)):
            continue
        chosen.append((a, b))
        lefts.add(a)
        rights.add(b)
        if len(chosen) >= limit:
            break
    return chosen


def sample_clients(ids: Sequence[str | int], fraction: float, rng: random.Random) -> list:
    """RandomSampler(C, K): ``max(1, round(K*N))`` clients uniformly without replacement."""
    n = max(1, round(fraction * len(ids)))
    return sorted(rng.sample(list(ids), n)) if n < len(ids) else list(ids)


@dataclass
class FedBPEResult:
    """Outcome of a federated run: merges in order, rounds used, why it stopped, privacy spent."""

    merges: list[tuple[bytes, bytes]]
    vocab_size: int
    rounds: int
    halted: bool
    stop_reason: str
    privacy: dict[str, object]
    history: list[dict[str, float]] = field(default_factory=list)


class FedBPEServer:
    """Server state of Algorithm 4: the vocabulary, the round loop's decisions and the privacy ledger."""

    def __init__(
        self,
        target_tokens: int,
        *,
        theta: float,
        mode: Literal["single", "batched"] = "single",
        merges_per_round: int = 1,
        merges_growth: float = 0.0,
        k_fraction: float = 1.0,
        release: ReleaseParams | None = None,
        pair_tokens: int = 128,
        seed: int = 0,
    ) -> None:
        if target_tokens < 256:
            raise ValueError(f"target vocabulary must be >= 256 tokens, got {target_tokens}")
        self.target_tokens = target_tokens
        self.theta = theta
        self.mode = mode
        self.merges_per_round = merges_per_round if mode == "batched" else 1
        self.merges_growth = merges_growth if mode == "batched" else 0.0
        self.k_fraction = k_fraction
        self.release = release or ReleaseParams()
        self.pair_tokens = pair_tokens
        self.vocab = Vocabulary()
        self.rng = random.Random(seed)
        self.rounds = 0
        self.releases_per_client: Counter[str] = Counter()
        self.history: list[dict[str, float]] = []
        self.stop_reason = ""

    @property
    def done(self) -> bool:
        return len(self.vocab) >= self.target_tokens or bool(self.stop_reason)

    @property
    def round_limit(self) -> int:
        """Merges allowed this round: ``merges_per_round``, or ``merges_growth × |vocab|`` once that is larger.

        Later merges have smaller and flatter counts, so letting the batch grow with the vocabulary costs little
        quality while the number of rounds grows with log(vocab) instead of linearly.
        """
        return max(self.merges_per_round, int(self.merges_growth * len(self.vocab)))

    def sample(self, clients: Sequence[str]) -> list[str]:
        picked = sample_clients(clients, self.k_fraction, self.rng)
        self.releases_per_client.update(picked)
        return picked

    def single_phase(self, releases: Iterable[Release]) -> list[int]:
        """Token ids U whose aggregated noisy unigram count is > theta; with noise, only the ``pair_tokens`` largest
        (the pair phase's public domain is U × U, released densely by every client).
        """
        kept = aggregate(releases, self.theta)
        if self.release.epsilon is not None and len(kept) > self.pair_tokens:
            kept = dict(sorted(kept.items(), key=lambda kv: -kv[1])[: self.pair_tokens])
        return sorted(int(k) for k in kept)  # type: ignore[arg-type]

    def pair_phase(self, releases: Iterable[Release]) -> list[Merge]:
        """Pick this round's merge(s) and extend the vocabulary; an empty list halts (no vocabulary left)."""
        rels = list(releases)
        totals = aggregate(rels, self.theta)
        budget = self.target_tokens - len(self.vocab)
        pairs = select_merges(totals, self.vocab, min(self.round_limit, budget), self.mode)  # type: ignore[arg-type]
        self.rounds += 1
        if not pairs:
            self.stop_reason = "no vocabulary left"
            return []
        merges = [self.vocab.add_merge(a, b) for a, b in pairs]
        self.history.append(
            {"round": self.rounds, "merges": len(merges), "vocab": len(self.vocab), "time": time.perf_counter()}
        )
        return merges

    def privacy(self) -> dict[str, object]:
        """What the accountant needs: the per-release mechanism and how many releases each client made."""
        return {
            "epsilon_per_release": self.release.epsilon,
            "sensitivity": self.release.sensitivity,
            "noise_scale": self.release.noise_scale,
            "p": self.release.p,
            "theta": self.theta,
            "k_fraction": self.k_fraction,
            "pair_tokens": self.pair_tokens,
            "max_releases_per_client": max(self.releases_per_client.values(), default=0),
        }

    def stop_at_round_limit(self) -> None:
        """Record why a loop that ran out of rounds stopped (otherwise the result would claim the target)."""
        if not self.done:
            self.stop_reason = f"max rounds ({self.rounds}) reached"

    def result(self) -> FedBPEResult:
        halted = bool(self.stop_reason)
        return FedBPEResult(
            merges=self.vocab.merge_bytes(),
            vocab_size=len(self.vocab),
            rounds=self.rounds,
            halted=halted,
            stop_reason=self.stop_reason or "target vocabulary reached",
            privacy=self.privacy(),
            history=self.history,
        )


def train_in_process(
    clients: Mapping[str, ClientState], server: FedBPEServer, *, seed: int = 0, max_rounds: int = 1_000_000
) -> FedBPEResult:
    """Algorithm 4 with direct calls instead of messages (tests, and the reference for the Flower app)."""
    names = sorted(clients)
    rngs = {name: np.random.default_rng([seed, i]) for i, name in enumerate(names)}
    pending: list[Merge] = []
    while not server.done and server.rounds < max_rounds:
        for name in names:  # ClientUpdateDataset for all clients (done lazily before they count)
            clients[name].apply(server.vocab.merges[clients[name].applied :])
        singles = [clients[c].release("single", server.release, rngs[c]) for c in server.sample(names)]
        kept = server.single_phase(singles)
        pairs = [clients[c].release("pair", server.release, rngs[c], kept) for c in server.sample(names)]
        pending = server.pair_phase(pairs)
        if not pending:
            break
    server.stop_at_round_limit()
    return server.result()


def reference_bpe(word_counts: Mapping[bytes, int], n_merges: int) -> list[tuple[bytes, bytes]]:
    """Deliberately naive centralized byte-level BPE (recounts every pair each step): the test oracle.

    Tie-break: highest count, then smallest left bytes, then smallest right bytes.
    """
    words = [[bytes([b]) for b in w] for w in word_counts]
    freqs = list(word_counts.values())
    merges: list[tuple[bytes, bytes]] = []
    for _ in range(n_merges):
        counts: Counter[tuple[bytes, bytes]] = Counter()
        for w, f in zip(words, freqs, strict=True):
            for pair in zip(w, w[1:], strict=False):
                counts[pair] += f
        if not counts:
            break
        best = min(counts.items(), key=lambda kv: (-kv[1], kv[0][0], kv[0][1]))[0]
        merges.append(best)
        for i, w in enumerate(words):
            out, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and (w[j], w[j + 1]) == best:
                    out.append(w[j] + w[j + 1])
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            words[i] = out
    return merges

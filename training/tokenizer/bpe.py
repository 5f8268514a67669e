"""FedByteBPE core (paper Algorithms 4-5) with numpy: client counting and server aggregation.

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
them at once and none changes another's count. Which and how many merges a
round takes is the server's post-processing of the round's releases: it
changes neither a release's privacy nor what a client sends.

A client's words are one flat array of token ids (no Python loop over words or
pairs): counts are ``np.bincount`` over it and a broadcast is applied in groups
of merges that can be applied at once (:func:`merge_groups`).
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
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
    "aggregate_arrays",
    "merge_groups",
    "rank_pairs",
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
        self._rows = np.zeros((0, 3), dtype=np.int64)  # self.merges as an array, extended on demand

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

    def merge_array(self, start: int = 0) -> np.ndarray:
        """Merges from ``start`` on as an ``(n, 3)`` int64 array (left, right, new id): what is broadcast."""
        done = len(self._rows)
        if done < len(self.merges):
            more = np.array([(m.left, m.right, m.new_id) for m in self.merges[done:]], dtype=np.int64)
            self._rows = np.concatenate([self._rows, more])
        return self._rows[start:]

    def merge_bytes(self) -> list[tuple[bytes, bytes]]:
        return [(self.tokens[m.left], self.tokens[m.right]) for m in self.merges]


@lru_cache(maxsize=8)
def _group_bounds(packed: bytes) -> tuple[tuple[int, int], ...]:
    """:func:`merge_groups` as ``(start, stop)`` rows, cached by content: a process that serves many nodes groups
    each broadcast once.
    """
    merges = np.frombuffer(packed, dtype=np.int64).reshape(-1, 3)
    bounds, start = [], 0
    for group in merge_groups(merges):
        bounds.append((start, start + len(group)))
        start += len(group)
    return tuple(bounds)


def merge_groups(merges: np.ndarray) -> list[np.ndarray]:
    """Split an ``(n, 3)`` merge list (left, right, new id) into consecutive groups that can be applied at once.

    A merge joins the current group unless applying it together with the group could differ from applying it
    after the group: its left token is a right token of the group or its right token a left one (an ``a b`` +
    ``b c`` chain), it is a self-pair ``a a`` touching a token the group uses, the group holds a self-pair on one
    of its tokens, or it uses a token the group creates (``new id``; a byte string seen before keeps its id, so
    that token may already exist). A server batch (:func:`select_merges`) is one group; a client that missed
    several rounds gets one group per round or fewer.
    """
    groups: list[np.ndarray] = []
    start = 0
    lefts: set[int] = set()
    rights: set[int] = set()
    created: set[int] = set()
    selfs: set[int] = set()
    rows = merges.tolist()
    for i, (a, b, n) in enumerate(rows):
        if (a in rights or b in lefts or a in created or b in created or a in selfs or b in selfs
                or (a == b and (a in lefts or a in rights))):
            groups.append(merges[start:i])
            start = i
            lefts, rights, created, selfs = set(), set(), set(), set()
        lefts.add(a)
        rights.add(b)
        created.add(n)
        if a == b:
            selfs.add(a)
    if start < len(rows):
        groups.append(merges[start:])
    return groups


class ClientState:
    """One client's words as one flat array of token ids, counted with numpy (no Python loop over words or pairs).

    ``_tok`` holds every word's token ids back to back and ``_wid`` the word each position belongs to, so a pair is
    two neighbouring positions of the same word and its count is the sum of the word frequencies at its positions
    (``np.bincount``). A merge batch is applied to all words at once: find the positions where one of the batch's
    pairs starts, write the new id there and drop the right-hand positions. Counts are computed when a release
    needs them, over the current array (a few hundred thousand positions per institution, milliseconds).
    """

    def __init__(self, word_counts: Mapping[bytes, float]) -> None:
        items = [(w, c) for w, c in word_counts.items() if w and c > 0]
        # counts are integers, except in a table of summed noisy counts (histogram mode's server): kept as floats
        exact = not any(isinstance(c, float) for _, c in items)
        self.freqs: np.ndarray = np.array([c for _, c in items], dtype=np.int64 if exact else np.float64)
        lengths = np.fromiter((len(w) for w, _ in items), dtype=np.int64, count=len(items))
        self._tok = np.frombuffer(b"".join(w for w, _ in items), dtype=np.uint8).astype(np.int64)
        self._wid = np.repeat(np.arange(len(items), dtype=np.int64), lengths)
        self._pairs_cache: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.applied = 0  # number of global merges applied so far
        self.vocab_size = 256  # ids 0..vocab_size-1 exist (bytes + merges seen): the public single-phase domain

    @classmethod
    def from_arrays(
        cls, tokens: np.ndarray, lengths: np.ndarray, freqs: np.ndarray, applied: int = 0, vocab_size: int = 256,
    ) -> ClientState:
        """Rebuild a state from :meth:`to_arrays` (e.g. a node's ``Context.state`` in another process)."""
        state = cls({})
        state.freqs = np.asarray(freqs, dtype=np.int64)
        state._tok = np.asarray(tokens, dtype=np.int64)
        state._wid = np.repeat(np.arange(len(state.freqs), dtype=np.int64), np.asarray(lengths, dtype=np.int64))
        if len(state._wid) != len(state._tok):
            raise ValueError("word lengths do not add up to the token array")
        state.applied, state.vocab_size = int(applied), int(vocab_size)
        return state

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Token ids, tokens per word and word frequencies, in the smallest integer types that hold them: everything
        :meth:`from_arrays` needs besides ``applied`` and ``vocab_size``.
        """
        lengths = np.bincount(self._wid, minlength=len(self.freqs))
        return {
            "tokens": self._tok.astype(np.uint16 if self.vocab_size <= 1 << 16 else np.int32),
            "lengths": lengths.astype(np.uint16 if not len(lengths) or lengths.max() < 1 << 16 else np.int32),
            "freqs": self.freqs.astype(np.int32 if not len(self.freqs) or self.freqs.max() < 1 << 31 else np.int64),
        }

    @property
    def empty(self) -> bool:
        return not len(self.freqs)

    @property
    def words(self) -> list[list[int]]:
        """Each word's current token ids (in the order of the counted corpus; for tests and inspection)."""
        cuts = np.flatnonzero(np.diff(self._wid)) + 1
        return [part.tolist() for part in np.split(self._tok, cuts)] if len(self._tok) else []

    def _weights(self, kept: np.ndarray | None = None) -> np.ndarray:
        """Per-position weight: the word's frequency (or its subsampled count)."""
        return (self.freqs if kept is None else kept)[self._wid].astype(np.float64)

    def _pair_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Left ids, right ids and the position of the left token, for every pair inside a word (cached until the
        next merge).
        """
        if self._pairs_cache is None:
            same = np.flatnonzero(self._wid[:-1] == self._wid[1:])
            self._pairs_cache = (self._tok[same], self._tok[same + 1], same)
        return self._pairs_cache

    def _unigram_counts(self, weights: np.ndarray) -> np.ndarray:
        """Count of every id ``0..vocab_size-1``."""
        return np.bincount(self._tok, weights=weights, minlength=self.vocab_size)

    def _pair_counts(self, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Distinct pair codes (sorted) and their counts."""
        left, right, pos = self._pair_arrays()
        codes, inverse = np.unique((left << _SHIFT) | right, return_inverse=True)
        return codes, np.bincount(inverse, weights=weights[pos], minlength=len(codes))

    @property
    def unigrams(self) -> dict[int, int]:
        """Non-zero token counts (for tests and inspection; releases count with numpy)."""
        counts = self._unigram_counts(self._weights())
        ids = np.flatnonzero(counts)
        return dict(zip(ids.tolist(), counts[ids].astype(np.int64).tolist(), strict=True))

    @property
    def pairs(self) -> dict[int, int]:
        """Non-zero pair counts keyed by :func:`pair_code` (for tests and inspection)."""
        codes, counts = self._pair_counts(self._weights())
        return dict(zip(codes.tolist(), counts.astype(np.int64).tolist(), strict=True))

    def apply(self, merges: Sequence[Merge] | np.ndarray) -> None:
        """ClientUpdateDataset: replace each ``left right`` by ``new_id`` in every word, in merge order.

        ``merges``: :class:`Merge` objects or an ``(n, 3)`` int array (left, right, new id), as broadcast. They are
        applied in groups (:func:`merge_groups`) whose result equals applying them one by one.
        """
        if len(merges) == 0:
            return
        if isinstance(merges, np.ndarray):
            arr = merges.astype(np.int64, copy=False).reshape(-1, 3)
        else:
            arr = np.array([(m.left, m.right, m.new_id) for m in merges], dtype=np.int64)
        self.vocab_size = max(self.vocab_size, int(arr[:, 2].max()) + 1)
        for a, b in _group_bounds(arr.tobytes()):
            self._apply_group(arr[a:b])
        self.applied += len(arr)

    def _apply_group(self, group: np.ndarray) -> None:
        if len(self._tok) < 2:
            return
        codes = (group[:, 0] << _SHIFT) | group[:, 1]
        order = np.argsort(codes, kind="stable")
        codes, new_ids = codes[order], group[order, 2]
        left, right, pos = self._pair_arrays()
        is_left = np.zeros(self.vocab_size, dtype=bool)
        is_left[group[:, 0]] = True
        cand = np.flatnonzero(is_left[left])  # positions whose left token starts some pair of the group
        here = (left[cand] << _SHIFT) | right[cand]
        idx = np.minimum(np.searchsorted(codes, here), len(codes) - 1)
        hit = codes[idx] == here
        starts, targets = pos[cand[hit]], new_ids[idx[hit]]
        if not len(starts):
            return
        # Two hits at neighbouring positions can only be one self-pair ``a a`` in a run (``a a a``): merge left to
        # right, i.e. keep every other position of each run of consecutive starts.
        if len(starts) > 1 and bool(np.any(np.diff(starts) == 1)):
            k = np.arange(len(starts))
            run_start = np.maximum.accumulate(np.where(np.r_[True, np.diff(starts) != 1], k, 0))
            keep = (k - run_start) % 2 == 0
            starts, targets = starts[keep], targets[keep]
        tok = self._tok.copy()
        tok[starts] = targets
        alive = np.ones(len(tok), dtype=bool)
        alive[starts + 1] = False
        self._tok, self._wid = tok[alive], self._wid[alive]
        self._pairs_cache = None

    def _subsampled_weights(self, rng: np.random.Generator, p: float) -> np.ndarray:
        """Weights over a fresh Binomial(f, p) sample of the word occurrences (RandomSampler(D_i, p))."""
        return self._weights(rng.binomial(self.freqs, p))

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
        weights = self._subsampled_weights(rng, params.p) if params.p < 1.0 else self._weights()
        allowed = np.unique(np.fromiter(() if allowed_left is None else allowed_left, dtype=np.int64))
        if params.epsilon is not None:
            return self._dense_release(phase, weights, params, rng, allowed)
        if phase == "single":
            counts = self._unigram_counts(weights)
            keys = np.flatnonzero(counts)
            values = counts[keys]
        else:
            keys, values = self._pair_counts(weights)
            mask = np.isin(keys >> _SHIFT, allowed) & (values > 0)
            keys, values = keys[mask], values[mask]
        if not len(keys):
            return Release.nothing()
        return self._top(phase, keys, values, params)

    def _dense_release(
        self, phase: str, weights: np.ndarray, params: ReleaseParams, rng: np.random.Generator, tokens: np.ndarray,
    ) -> Release:
        """Noisy counts of every key of the public domain: all token ids, or all pairs of allowed tokens."""
        if phase == "single":
            keys = np.arange(self.vocab_size, dtype=np.int64)
            values = self._unigram_counts(weights)[: self.vocab_size]
        else:
            if not len(tokens):
                return Release.nothing(nvl=False)
            n = len(tokens)
            keys = ((tokens[:, None] << _SHIFT) | tokens[None, :]).ravel()
            rank = np.full(max(self.vocab_size, int(tokens[-1]) + 1), -1, dtype=np.int64)
            rank[tokens] = np.arange(n)
            left, right, pos = self._pair_arrays()
            li, ri = rank[left], rank[right]
            inside = (li >= 0) & (ri >= 0)
            values = np.bincount(li[inside] * n + ri[inside], weights=weights[pos[inside]], minlength=n * n)
        values = values + rng.laplace(0.0, params.noise_scale, size=len(keys))
        return self._top(phase, keys, values, params)

    @staticmethod
    def _top(phase: str, keys: np.ndarray, values: np.ndarray, params: ReleaseParams) -> Release:
        """Keys by decreasing value (ties: the order given, i.e. by id or pair code), the first ``top_n``."""
        neg = -values
        if params.top_n is not None and params.top_n < len(neg):
            # the top_n of a stable sort without sorting everything: candidates up to the top_n-th value (ties
            # included, in key order), then a stable sort of those
            kth = np.partition(neg, params.top_n - 1)[params.top_n - 1]
            cand = np.flatnonzero(neg <= kth)
            order = cand[np.argsort(neg[cand], kind="stable")][: params.top_n]
        else:
            order = np.argsort(neg, kind="stable")
        keys, values = keys[order], values[order]
        if phase == "single":
            return Release(keys, values)
        return Release(keys >> _SHIFT, values, keys & _LOW)


def aggregate_arrays(releases: Iterable[Release], theta: float) -> tuple[np.ndarray, np.ndarray]:
    """ServerAggregateTuples on arrays: the distinct key codes (sorted) whose summed noisy count is > theta, and
    those sums (single ids, or pairs packed by :func:`pair_code`).

    The releases are summed in an order fixed by their content, not by when they arrived: floating-point sums
    depend on the order, and replies arrive in any order on Ray, so the sums (and the merges) are the same on every
    engine and every run.
    """
    rels = sorted((r for r in releases if len(r.left)), key=lambda r: (r.values.tobytes(), r.codes.tobytes()))
    if not rels:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    codes = np.concatenate([r.codes for r in rels])
    values = np.concatenate([r.values for r in rels])
    uniq, inverse = np.unique(codes, return_inverse=True)
    totals = np.bincount(inverse, weights=values, minlength=len(uniq))  # sums in the releases' content order
    keep = totals > theta
    return uniq[keep], totals[keep]


def aggregate(releases: Iterable[Release], theta: float) -> dict[Key, float]:
    """ServerAggregateTuples: sum the noisy counts per key and keep keys whose sum is > theta."""
    rels = [r for r in releases if len(r.left)]
    codes, totals = aggregate_arrays(rels, theta)
    if not rels or rels[0].right is None:
        return dict(zip(codes.tolist(), totals.tolist(), strict=True))
    return {(c >> _SHIFT, c & _LOW): v for c, v in zip(codes.tolist(), totals.tolist(), strict=True)}


def rank_pairs(codes: np.ndarray, totals: np.ndarray, vocab: Vocabulary) -> np.ndarray:
    """Order of pairs by total, descending (ties: smaller left bytes, then smaller right bytes)."""
    left, right = codes >> _SHIFT, codes & _LOW
    ids = np.unique(np.concatenate([left, right]))
    by_bytes = sorted(ids.tolist(), key=vocab.tokens.__getitem__)
    rank = np.zeros(int(ids[-1]) + 1 if len(ids) else 0, dtype=np.int64)
    rank[np.asarray(by_bytes, dtype=np.int64)] = np.arange(len(by_bytes))
    return np.lexsort((rank[right], rank[left], -totals))


def select_merges(
    pair_totals: Mapping[Pair, float] | tuple[np.ndarray, np.ndarray], vocab: Vocabulary, limit: int,
    mode: Literal["single", "batched"], min_ratio: float = 0.0,
) -> list[Pair]:
    """Rank pairs by total (ties: smaller left bytes, then right bytes) and pick one, or a conflict-free batch.

    ``pair_totals``: ``{(left, right): total}`` or the ``(codes, totals)`` arrays of :func:`aggregate_arrays`.
    Batched: up to ``limit`` pairs, or more when more than ``limit`` pairs have a total of at least ``min_ratio``
    times the best one (a flat ranking: the order among them says little, so one round takes them all).
    """
    if isinstance(pair_totals, tuple):
        codes, totals = pair_totals
    else:
        codes = np.fromiter((pair_code(a, b) for a, b in pair_totals), dtype=np.int64, count=len(pair_totals))
        totals = np.fromiter(pair_totals.values(), dtype=np.float64, count=len(pair_totals))
    if not len(codes):
        return []
    order = rank_pairs(codes, totals, vocab)
    ranked = codes[order]
    if mode == "single" or limit <= 1:
        return [(int(ranked[0]) >> _SHIFT, int(ranked[0]) & _LOW)]
    if min_ratio > 0:
        limit = max(limit, int(np.count_nonzero(totals >= min_ratio * totals[order[0]])))
    chosen: list[Pair] = []
    lefts: set[int] = set()
    rights: set[int] = set()
    for code in ranked.tolist():
        a, b = code >> _SHIFT, code & _LOW
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
        merges_ratio: float = 0.0,
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
        self.merges_ratio = merges_ratio if mode == "batched" else 0.0
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
        ids, totals = aggregate_arrays(releases, self.theta)
        if self.release.epsilon is not None and len(ids) > self.pair_tokens:
            ids = np.sort(ids[np.argsort(-totals, kind="stable")[: self.pair_tokens]])
        return ids.tolist()

    def pair_phase(self, releases: Iterable[Release]) -> list[Merge]:
        """Pick this round's merge(s) and extend the vocabulary; an empty list halts (no vocabulary left)."""
        rels = list(releases)
        totals = aggregate_arrays(rels, self.theta)
        budget = self.target_tokens - len(self.vocab)
        pairs = select_merges(totals, self.vocab, self.round_limit, self.mode, self.merges_ratio)[:budget]
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
    clients: Mapping[str, ClientState], server: FedBPEServer, *, max_rounds: int = 1_000_000
) -> FedBPEResult:
    """Algorithm 4 with direct calls instead of messages (tests, and the reference for the Flower app). Each client
    draws its noise from :func:`~fedfraud.training.tokenizer.noise.noise_rng`, as in the Flower app.
    """
    from fedfraud.training.tokenizer.noise import noise_rng

    names = sorted(clients)
    rngs = {name: noise_rng(i) for i, name in enumerate(names)}
    pending: list[Merge] = []
    while not server.done and server.rounds < max_rounds:
        for name in names:  # ClientUpdateDataset for all clients (done lazily before they count)
            clients[name].apply(server.vocab.merge_array(clients[name].applied))
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

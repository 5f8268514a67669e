"""What a bank's tokenizer ClientApp releases under: its own corpus and release parameters, never the server's.

A query names the phase, the round and the merges to apply. It also repeats the release parameters (ε, the
per-document bound, p, top-n, and in histogram mode k, c, σ, τ and the δ split), so that a bank can check them.
The bank answers only when they equal its own :class:`BankPolicy`, built from the bank's settings by the same
calibration the server uses. So a server cannot switch the noise off (ε = 0 is exact counts), weaken it, or widen a
document's contribution, and a bank makes at most ``max_releases`` releases in a run (one in histogram mode): each
draws fresh noise, so a server asking again would average it away. The corpus is the bank's own file: no query
names a path, so a server cannot point a bank at another file. A refusal answers one fixed text
(:data:`REFUSAL`); the details stay in the bank's log. Still the server's: the round number, the merges it
broadcasts and the pair domain (all public; the noise covers every key of the domain either way).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flwr.app import ConfigRecord, RecordDict

from fedfraud.training.tokenizer.histogram import HistogramMechanism, calibrate

__all__ = ["REFUSAL", "BankPolicy", "QueryRefused"]

#: The node state record counting this run's releases.
_RELEASES_KEY = "tokenizer-releases"

logger = logging.getLogger(__name__)

#: The only text a refused query's error reply carries.
REFUSAL = "the bank refused this query; see the bank's log"


class QueryRefused(RuntimeError):
    """A query the bank does not answer, with :data:`REFUSAL` as its only text."""


@dataclass(frozen=True)
class BankPolicy:
    """The bank's corpus and the release parameters it answers with (``epsilon`` 0: the bank's own choice of
    exact counts, ``--no-privacy``).
    """

    corpus_path: str
    epsilon: float
    max_doc_bytes: int
    p: float
    top_n: int
    ner: bool
    histogram: HistogramMechanism | None = None
    max_releases: int = 1

    def count_release(self, state: RecordDict) -> None:
        """Count one release of this run in the node's state; refuse one past ``max_releases`` (each release draws
        fresh noise, so a server asking again would average it away).
        """
        if _RELEASES_KEY not in state.config_records:
            state[_RELEASES_KEY] = ConfigRecord({"count": 0})
        record = state.config_records[_RELEASES_KEY]
        done = int(record["count"])  # type: ignore[call-overload]
        if done >= self.max_releases:
            _refuse(f"release {done + 1} asked, this bank makes at most {self.max_releases} in a run")
        record["count"] = done + 1

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> BankPolicy:
        """The policy of the run's settings (the trainer's kebab-case dict), σ and τ calibrated as the server does."""
        eps = float(settings["epsilon"] or 0.0)
        histogram = None
        if str(settings.get("mode", "")) == "histogram" and eps > 0:
            histogram = histogram_of(settings)
        # histogram mode releases once; the other modes twice a round (single tokens, pairs) up to max-rounds
        releases = 1 if str(settings.get("mode", "")) == "histogram" else 2 * int(settings["max-rounds"])
        return cls(str(settings["corpus-path"]), eps, int(settings["max-doc-bytes"]), float(settings["p"]),
                   int(settings["top-n"] or 0), bool(settings["ner"]), histogram, releases)

    def expected(self, phase: str) -> dict[str, Any]:
        """The release parameters a query of ``phase`` must name."""
        want: dict[str, Any] = {"epsilon": self.epsilon, "max-doc-bytes": self.max_doc_bytes, "ner": self.ner}
        if phase != "histogram":
            return want | {"p": self.p, "top-n": self.top_n}
        if self.histogram is not None:
            h = self.histogram
            want |= {"epsilon": h.epsilon, "k": h.max_words, "c": h.max_count, "sigma": h.sigma, "tau": h.tau,
                     "delta-gaussian": h.delta_gaussian, "delta-selection": h.delta_selection}
        return want

    def check(self, query: Mapping[str, Any]) -> None:
        """Refuse a query whose release parameters are not this bank's, or that names a corpus."""
        phase = str(query.get("phase", ""))
        if phase not in ("single", "pair", "histogram"):
            _refuse(f"unknown phase {phase!r}")
        if "corpus-path" in query:
            _refuse("the query names a corpus path; the bank reads only its own")
        for key, value in self.expected(phase).items():
            got = query.get(key)
            if got is None or not _same(got, value):
                _refuse(f"query {key}={got!r}, this bank releases with {value!r}")


def histogram_of(settings: Mapping[str, Any]) -> HistogramMechanism:
    """σ and τ of histogram mode for the settings' total (ε, δ) per document and bound (k, c)."""
    delta = float(settings.get("delta") or 0.0)
    if not 0 < delta < 1:
        raise ValueError("histogram mode needs the setting 'delta' (total δ per document) in (0, 1)")
    return calibrate(float(settings["epsilon"]), delta, int(settings["histogram-words"]),
                     int(settings["histogram-count"]))


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, bool) or isinstance(got, bool):
        return bool(got) == want and isinstance(got, bool) == isinstance(want, bool)
    if isinstance(want, float):
        return isinstance(got, int | float) and math.isclose(float(got), want, rel_tol=1e-12, abs_tol=0.0)
    return bool(got == want)


def _refuse(why: str) -> None:
    logger.error("tokenizer_query_refused %s", why)
    raise QueryRefused(REFUSAL)

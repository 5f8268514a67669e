"""Skewed banks for labelled studies (``ingest.skew``, ``eval ... --skew``): banks whose fraud rates differ.

Real issuers differ in customer mix *and* in how much fraud they see. The ``region`` partition gives the first
(banks by home state, :mod:`fedfraud.training.data.partition`); this module adds the second. Bank ``k`` of ``n``
gets the target fraud rate ``low * (high / low) ** (k / (n - 1))`` (log-spaced; the default ``(0.002, 0.05)``
gives 0.2, 0.45, 1.0, 2.2, 5.0 % of transactions for 5 banks), reached by thinning the bank *by cardholder*:

* **lower** a bank's rate: take its fraud-touched cardholders in the order of a stable hash
  (``blake2b("fedfraud-skew:" + cardholder_id)``) and *clean* them one by one (drop their fraud rows, keep their
  genuine history: the card was never compromised) until the rate is at or below the target. In both
  generators nearly every card has a fraud episode (Sparkov: 99 %), so dropping whole fraud-touched cardholders
  would empty the bank; cleaning keeps its size and customer mix. A card with only fraud rows leaves the bank.
* **raise** it: take the cardholders whose own fraud share is below the target, in the same hash order, and
  drop them whole until the rate reaches the target (dropping clean rows inside a history would distort the
  velocity features). This shrinks the bank and tilts it toward less active cards: a documented selection.

Pure function of (cardholder, labels, target): the same data gives the same banks; a cardholder stays in its
bank (or leaves the study); the rows kept are untouched and stay in file order. It needs labels, so it is a
study option for labelled data, never a production partitioner. :class:`BankSkew` reports per bank what was
cleaned or dropped and the rate achieved (within one cardholder's frauds of the target).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from fedfraud.core.errors import UserError
from fedfraud.feature_store.layout import CARDHOLDERS_FILE, MANIFEST_FILE, TRANSACTIONS_FILE, bank_dir, list_banks
from fedfraud.training.data.partition import stable_units

__all__ = ["DEFAULT_SKEW", "BankSkew", "describe_skew", "skew_dataset", "skew_mask", "skew_rates", "skew_summary"]

logger = logging.getLogger(__name__)

#: ``--skew``: the lowest and highest bank fraud rate (share of transactions).
DEFAULT_SKEW: tuple[float, float] = (0.002, 0.05)


@dataclass(frozen=True)
class BankSkew:
    """What thinning did to one bank: target, rate before/after, rows and cardholders kept, cleaned, dropped."""

    bank: int
    target: float
    rate_before: float
    rate: float
    rows_before: int
    rows: int
    frauds_before: int
    frauds: int
    cardholders_before: int
    cardholders: int
    cleaned: int  # cardholders whose fraud rows were dropped (genuine history kept)
    dropped: int  # cardholders dropped whole (raising the rate; plus cleaned fraud-only cards)


def skew_rates(banks: int, low: float = DEFAULT_SKEW[0], high: float = DEFAULT_SKEW[1]) -> tuple[float, ...]:
    """Target fraud rate of each bank: log-spaced from ``low`` (bank 0) to ``high`` (last bank)."""
    if banks < 1 or not 0 < low <= high < 1:
        raise ValueError(f"skew needs 0 < low <= high < 1 and at least one bank, got {low}, {high}, {banks} banks")
    if banks == 1:
        return (float(low),)
    return tuple(float(r) for r in np.geomspace(low, high, banks))


def skew_mask(cardholder_ids: pd.Series, labels: pd.Series | np.ndarray, target: float, bank: int = 0
              ) -> tuple[np.ndarray, BankSkew]:
    """Rows of one bank to keep so that its fraud rate meets ``target`` (see the module docstring), and the report.

    Raises :class:`UserError` when the rate cannot be raised to ``target`` (no cardholder at or above it).
    """
    y = np.asarray(labels, dtype=np.float64)
    if np.isnan(y).any():
        raise UserError(f"--skew needs labels: {int(np.isnan(y).sum())} transactions of bank {bank} have no "
                        "is_fraud (skewed banks are set by their fraud rate, a labelled-study option)")
    y = y > 0
    codes, uniques = pd.factorize(pd.Series(cardholder_ids).astype(str), sort=False)
    n = np.bincount(codes, minlength=len(uniques)).astype(np.int64)
    f = np.bincount(codes, weights=y, minlength=len(uniques)).astype(np.int64)
    N, F = int(n.sum()), int(f.sum())
    keep = np.ones(len(y), dtype=bool)
    cleaned = np.zeros(len(uniques), dtype=bool)
    dropped = np.zeros(len(uniques), dtype=bool)
    if N and F / N > target:  # clean fraud-touched cardholders in hash order
        cand = np.flatnonzero(f > 0)
        cand = cand[np.argsort(stable_units(uniques[cand], "fedfraud-skew"), kind="stable")]
        cf = np.cumsum(f[cand])
        ok = (F - cf) <= target * np.maximum(N - cf, 1)
        k = int(np.argmax(ok)) + 1 if ok.any() else len(cand)
        cleaned[cand[:k]] = True
        keep &= ~(cleaned[codes] & y)
        dropped |= cleaned & (f == n)
    elif N and F / N < target:  # drop cardholders below the target, in hash order
        cand = np.flatnonzero(f < target * n)
        if len(cand) == len(uniques):
            raise UserError(f"--skew: bank {bank} cannot reach a fraud rate of {100 * target:.2g} % (no cardholder "
                            f"at or above it; it has {100 * F / N:.2g} %)")
        cand = cand[np.argsort(stable_units(uniques[cand], "fedfraud-skew"), kind="stable")]
        cn, cf = np.cumsum(n[cand]), np.cumsum(f[cand])
        ok = (F - cf) >= target * (N - cn)
        k = int(np.argmax(ok)) + 1 if ok.any() else len(cand)
        dropped[cand[:k]] = True
        keep &= ~dropped[codes]
    rows, frauds = int(keep.sum()), int((y & keep).sum())
    report = BankSkew(
        bank=int(bank), target=float(target), rate_before=F / N if N else 0.0, rate=frauds / rows if rows else 0.0,
        rows_before=N, rows=rows, frauds_before=F, frauds=frauds, cardholders_before=len(uniques),
        cardholders=int(len(np.unique(codes[keep]))), cleaned=int(cleaned.sum()), dropped=int(dropped.sum()))
    return keep, report


def skew_dataset(root: Path, low: float, high: float) -> list[BankSkew]:
    """Thin every bank of the dataset ``root`` **in place** to its target rate; records the result in its manifest.

    Rewrites ``bank_<k>/transactions.parquet`` (same schema and row order, fewer rows), drops the cardholders that
    left from ``bank_<k>/cardholders.parquet``, and adds ``skew`` (one :class:`BankSkew` per bank) to
    ``manifest.json`` with the new per-bank counts. Call it on a copy: :func:`~fedfraud.training.fraud.dataset.
    materialize` does.
    """
    root = Path(root)
    banks = list_banks(root)
    rates = skew_rates(len(banks), low, high)
    reports = []
    for bank, target in zip(banks, rates, strict=True):
        path = bank_dir(root, bank) / TRANSACTIONS_FILE
        table = pq.read_table(path)
        if "is_fraud" not in table.column_names:
            raise UserError(f"--skew needs labels: bank {bank} of {root} has no is_fraud column")
        if table.num_rows == 0:
            raise UserError(f"--skew: bank {bank} of {root} holds no transactions (with partition region the data's "
                            "home states may fall in fewer regions than banks; try --partition hash or fewer --banks)")
        holders = table.column("cardholder_id").to_pandas()
        keep, report = skew_mask(holders, table.column("is_fraud").to_pandas().astype("float64"), target, bank)
        if not keep.all():
            pq.write_table(table.filter(pa.array(keep)), path, compression="zstd")
            extra = bank_dir(root, bank) / CARDHOLDERS_FILE
            if extra.exists():
                people = pq.read_table(extra)
                kept = set(holders[keep].astype(str))
                mask = people.column("cardholder_id").to_pandas().astype(str).isin(kept).to_numpy()
                pq.write_table(people.filter(pa.array(mask)), extra, compression="zstd")
        reports.append(report)
        logger.info("skew bank=%d target=%.4f rate %.4f -> %.4f rows %d -> %d cleaned=%d dropped=%d", bank, target,
                    report.rate_before, report.rate, report.rows_before, report.rows, report.cleaned, report.dropped)
    manifest_path = root / MANIFEST_FILE
    manifest = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.exists() else {}
    manifest["skew"] = {"low": low, "high": high, "banks": [asdict(r) for r in reports]}
    for r in reports:
        manifest.setdefault("per_bank", {})[str(r.bank)] = {"rows": r.rows, "cardholders": r.cardholders,
                                                            "fraud": r.frauds}
    manifest["total_accepted"] = sum(r.rows for r in reports)
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return reports


def skew_summary(root: Path) -> dict[int, BankSkew] | None:
    """The :class:`BankSkew` of each bank recorded in ``root``'s manifest, None when the dataset is not skewed."""
    path = Path(root) / MANIFEST_FILE
    if not path.exists():
        return None
    skew = json.loads(path.read_text(encoding="utf-8")).get("skew")
    if not skew:
        return None
    return {int(b["bank"]): BankSkew(**b) for b in skew["banks"]}


def describe_skew(reports: dict[int, BankSkew] | list[BankSkew] | None) -> str:
    """One line per study report: each bank's target, rate before → after, rows and cardholders kept."""
    if not reports:
        return ""
    items = sorted(reports.values() if isinstance(reports, dict) else reports, key=lambda r: r.bank)
    return "; ".join(
        f"bank {r.bank}: target {100 * r.target:.2f} %, fraud rate {100 * r.rate_before:.2f} → {100 * r.rate:.2f} %, "
        f"rows {r.rows_before} → {r.rows}, cardholders {r.cardholders_before} → {r.cardholders} "
        f"({r.cleaned} cleaned, {r.dropped} dropped)" for r in items)

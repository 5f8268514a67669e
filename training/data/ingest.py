"""CSV → canonical multi-bank dataset: the pipeline behind ``fedfraud ingest``.

read_header → pick loader (by name or by header) → stream chunks →
:class:`~fedfraud.feature_store.schema.Validator` (the only judge of rows) →
partition accepted rows by cardholder → :class:`~fedfraud.training.data.writer.DatasetWriter`.
``accepted + rejected == data rows in the file`` always holds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd

from fedfraud.core.errors import UserError
from fedfraud.feature_store.schema import DEMOGRAPHIC_SOURCE_COLUMNS, ValidationResult, Validator, demographics_of
from fedfraud.training.data import sparkov, tabformer
from fedfraud.training.data.config import BanksConfig, IngestConfig
from fedfraud.training.data.csvio import REGION_HINT, CsvHeader, RawChunk, read_header
from fedfraud.training.data.partition import partitioner, share_banks
from fedfraud.training.data.writer import DatasetSummary, DatasetWriter

__all__ = ["LOADERS", "IngestReport", "detect_format", "ingest_csv", "loader", "validate_chunk"]

logger = logging.getLogger(__name__)

#: Format name → loader module. Each exposes ``FORMAT_NAME``, ``matches(columns)``
#: and ``read_chunks(header, chunk_rows, progress)``.
LOADERS: dict[str, ModuleType] = {sparkov.FORMAT_NAME: sparkov, tabformer.FORMAT_NAME: tabformer}


@dataclass(frozen=True)
class IngestReport:
    """Outcome of one ingest: counts, throughput and where the dataset went."""

    accepted: int
    rejected: int
    per_bank: dict[int, int]
    rejects_by_reason: dict[str, int]
    seconds: float
    rows_per_s: float
    format: str = ""
    out: Path | None = None

    def __post_init__(self) -> None:
        if self.accepted < 0 or self.rejected < 0:
            raise ValueError("counts must be non-negative")
        if sum(self.per_bank.values()) != self.accepted:
            raise ValueError("per-bank rows must sum to accepted")
        if sum(self.rejects_by_reason.values()) != self.rejected:
            raise ValueError("rejects by reason must sum to rejected")

    @classmethod
    def from_summary(cls, summary: DatasetSummary, fmt: str) -> IngestReport:
        """Build the report from what the writer wrote."""
        total = summary.accepted + summary.rejected
        return cls(
            accepted=summary.accepted,
            rejected=summary.rejected,
            per_bank={b.bank: b.rows for b in summary.banks},
            rejects_by_reason=dict(sorted(summary.rejects_by_reason.items())),
            seconds=summary.seconds,
            rows_per_s=total / summary.seconds if summary.seconds > 0 else float("inf"),
            format=fmt,
            out=summary.out,
        )


def loader(name: str) -> ModuleType:
    """Resolve a format name to its loader module; an unknown name lists the valid ones."""
    try:
        return LOADERS[name]
    except KeyError:
        raise UserError(f"unknown format {name!r}; choose one of {sorted(LOADERS)} or 'auto'") from None


def detect_format(header: CsvHeader) -> str:
    """Name of the loader whose columns the header has; :class:`UserError` if none does."""
    found = [name for name, module in LOADERS.items() if module.matches(header.columns)]
    if not found:
        shown = ", ".join(header.columns[:6]) + (", ..." if len(header.columns) > 6 else "")
        raise UserError(
            f"{header.path}: no recognisable header (saw: {shown}); expected a Sparkov/Kaggle or TabFormer CSV"
        )
    return found[0]


def validate_chunk(validator: Validator, chunk: RawChunk) -> tuple[ValidationResult, np.ndarray]:
    """Validate one chunk; returns the result (reject rows as file row numbers) and the accepted mask.

    Reject rows are renumbered with ``chunk.rows``, so each points at its data row in the file.
    """
    result = validator.validate(chunk.frame, row_offset=0)
    positions = result.rejects["row"].to_numpy(dtype=np.int64)
    ok = np.ones(len(chunk.frame), dtype=bool)
    ok[positions] = False
    rejects = result.rejects.assign(row=chunk.rows[positions])
    return ValidationResult(accepted=result.accepted, rejects=rejects), ok


def _assigner(config: IngestConfig) -> Callable[[pd.Series, pd.Series | None, int], np.ndarray]:
    """The partition function: by mode, or by ``bank_shares`` when unequal bank sizes are asked for."""
    if config.bank_shares is None:
        return partitioner(config.partition)
    shares = config.bank_shares

    def by_shares(ids: pd.Series, hints: pd.Series | None, banks: int) -> np.ndarray:
        del hints, banks
        return share_banks(ids, shares)

    return by_shares


def ingest_csv(path: Path, out: Path, config: IngestConfig, progress: bool = True,
               banks_layout: BanksConfig | None = None) -> IngestReport:
    """Turn a Sparkov/Kaggle or TabFormer CSV into ``out/bank_<k>/transactions.parquet`` + manifest + rejects.

    ``banks_layout`` (the config's ``banks`` section) says which banks hold private columns: a bank holding
    ``demographics`` also gets ``bank_<k>/cardholders.parquet`` when the file has those columns (Sparkov's
    ``dob``, ``gender``, ``city_pop``, ``job``); the manifest records every bank's private sets. Without it no
    private column is kept (the layout before issue 39).
    """
    path = Path(path)
    header = read_header(path)
    fmt = detect_format(header) if config.format == "auto" else config.format
    module = loader(fmt)
    if not module.matches(header.columns):
        raise UserError(f"{path}: header does not have the {fmt} columns")
    assign = _assigner(config)
    started = time.perf_counter()
    validator = Validator(dedupe=True)
    writer = DatasetWriter(out, config.banks)
    layout = banks_layout.layout(list(range(config.banks))) if banks_layout is not None else {}
    holders = [k for k, sets in layout.items() if "demographics" in sets]
    keep_demographics = bool(holders) and any(c in header.columns for c in DEMOGRAPHIC_SOURCE_COLUMNS)
    demographics: dict[int, list[pd.DataFrame]] = {k: [] for k in holders}
    for chunk in module.read_chunks(header, config.chunk_rows, progress=progress):
        result, ok = validate_chunk(validator, chunk)
        hints = chunk.frame[REGION_HINT][ok].reset_index(drop=True) if REGION_HINT in chunk.frame else None
        banks = assign(result.accepted["cardholder_id"], hints, config.banks)
        writer.add(result.accepted, banks)
        writer.add_rejects(result.rejects)
        if keep_demographics:  # only the banks that hold them keep them
            for k in holders:
                mine = banks == k
                if mine.any():
                    demographics[k].append(demographics_of(chunk.frame[ok].reset_index(drop=True)[mine],
                                                           result.accepted["cardholder_id"][mine]))
    for k, parts in demographics.items():
        if parts:
            writer.write_cardholders(k, pd.concat(parts, ignore_index=True))
    summary = writer.finish(
        {"format": fmt, "source": str(path.resolve()), "partition": config.partition,
         "bank_shares": list(config.bank_shares) if config.bank_shares else None, "chunk_rows": config.chunk_rows,
         **({"private_features": {str(k): list(v) for k, v in layout.items()},
             "demographics_kept": keep_demographics} if layout else {})}
    )
    seconds = time.perf_counter() - started
    report = IngestReport.from_summary(summary, fmt)
    logger.info("ingest format=%s accepted=%d rejected=%d seconds=%.2f rows_per_s=%.0f", fmt, report.accepted,
                report.rejected, seconds, report.rows_per_s)
    return report

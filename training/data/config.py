"""Typed configuration for data generation and ingest."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class GeneratorConfig(BaseModel):
    """Synthetic multi-bank transaction generator (``fedfraud generate``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    banks: int = Field(5, ge=1, le=64)
    cardholders: int = Field(1000, ge=1)
    days: int = Field(60, ge=1)
    seed: int = 7
    fraud_rate: float = Field(0.005, ge=0.0, le=0.5, description="share of transactions that are fraud")
    merchants_per_region: int = Field(120, ge=4)
    start: str = Field("2026-01-01", description="first day (UTC), ISO date")


class IngestConfig(BaseModel):
    """CSV → canonical per-bank parquet (``fedfraud ingest``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["auto", "sparkov", "tabformer"] = "auto"
    banks: int = Field(5, ge=1, le=64)
    partition: Literal["hash", "region"] = Field(
        "hash", description="hash: IID by cardholder; region: non-IID, banks by the cardholder's home region"
    )
    chunk_rows: int = Field(200_000, ge=1_000, description="rows read per chunk; bounds memory")

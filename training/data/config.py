"""Typed configuration for data generation and ingest."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


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
    bank_shares: tuple[float, ...] | None = Field(
        None,
        description=(
            "share of cardholders per bank (hash partition only), e.g. (0.3, 0.25, 0.2, 0.2, 0.05): lets a study "
            "include a deliberately small bank; None means equal shares"
        ),
    )

    @model_validator(mode="after")
    def _shares(self) -> IngestConfig:
        if self.bank_shares is None:
            return self
        if len(self.bank_shares) != self.banks:
            raise ValueError(f"bank_shares has {len(self.bank_shares)} entries for {self.banks} banks")
        if any(s <= 0 for s in self.bank_shares) or abs(sum(self.bank_shares) - 1.0) > 1e-6:
            raise ValueError("bank_shares must be positive and sum to 1")
        if self.partition != "hash":
            raise ValueError("bank_shares needs partition: hash")
        return self

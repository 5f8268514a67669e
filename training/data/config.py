"""Typed configuration for data generation and ingest."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel, model_validator
from pydantic_core import PydanticUndefined


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
    skew: tuple[float, float] | None = Field(
        None,
        description=(
            "labelled studies only: (lowest, highest) fraud rate of the banks, log-spaced from bank 0 to the last; "
            "each bank is thinned by cardholder to its rate (fedfraud.training.data.skew); `eval ... --skew` sets "
            "(0.002, 0.05) with partition: region. None: the banks keep the data's own rates"
        ),
    )

    @model_validator(mode="after")
    def _shares(self) -> IngestConfig:
        if self.skew is not None:
            low, high = self.skew
            if not 0 < low <= high < 1:
                raise ValueError("skew must be (lowest, highest) fraud rates with 0 < lowest <= highest < 1")
            if self.bank_shares is not None:
                raise ValueError("skew and bank_shares cannot be combined (skewed banks come from the partition)")
        if self.bank_shares is None:
            return self
        if len(self.bank_shares) != self.banks:
            raise ValueError(f"bank_shares has {len(self.bank_shares)} entries for {self.banks} banks")
        if any(s <= 0 for s in self.bank_shares) or abs(sum(self.bank_shares) - 1.0) > 1e-6:
            raise ValueError("bank_shares must be positive and sum to 1")
        if self.partition != "hash":
            raise ValueError("bank_shares needs partition: hash")
        return self


#: Private column sets a bank may hold on top of the shared fraud feature row (``banks.<k>.private_features``):
#: ``demographics``: the cardholder's age at the transaction, gender, city population and a hashed job (Sparkov's
#: ``dob``, ``gender``, ``city_pop``, ``job``, kept by ``ingest`` in ``bank_<k>/cardholders.parquet``);
#: ``merchant_history``: the cardholder's history at the merchant (``merchant_new``, ``merchant_visits`` of the
#: fraud feature row, which then leave the shared set).
PrivateFeatureSet = Literal["demographics", "merchant_history"]
PRIVATE_FEATURE_SETS: tuple[str, ...] = ("demographics", "merchant_history")

#: The demo layout: three schemas across five banks (shared only; + demographics; + merchant history).
DEFAULT_BANK_LAYOUT: dict[int, tuple[str, ...]] = {
    0: (), 1: ("demographics",), 2: ("demographics",), 3: ("merchant_history",), 4: ("merchant_history",),
}


class BankSchema(BaseModel):
    """The columns one bank holds beyond the shared set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    private_features: tuple[PrivateFeatureSet, ...] = Field(
        (), description="private column sets of this bank on top of the shared fraud feature row")

    @model_validator(mode="after")
    def _distinct(self) -> BankSchema:
        if len(set(self.private_features)) != len(self.private_features):
            raise ValueError("private_features lists a set twice")
        return self


class BanksConfig(RootModel[dict[int, BankSchema]]):
    """``banks.<k>``: what bank k holds (heterogeneous banks, FED-SPFD, issue 39).

    A bank not listed holds the shared set only. Entries given in the file or by ``--set banks.<k>...`` replace
    that bank's entry of the demo layout (:data:`DEFAULT_BANK_LAYOUT`) and leave the other banks' entries as they
    are, so one override changes one bank.
    """

    model_config = ConfigDict(frozen=True)
    root: dict[int, BankSchema] = Field(
        default_factory=lambda: {k: BankSchema(private_features=v) for k, v in DEFAULT_BANK_LAYOUT.items()})

    @model_validator(mode="before")
    @classmethod
    def _over_defaults(cls, data: Any) -> Any:
        if data is None or data is PydanticUndefined:  # the field's default: the demo layout
            return data
        if not isinstance(data, dict):
            raise ValueError("banks must map a bank number to its schema, e.g. banks.3.private_features=[...]")
        merged: dict[Any, Any] = {k: {"private_features": list(v)} for k, v in DEFAULT_BANK_LAYOUT.items()}
        for key, value in data.items():
            try:
                bank = int(key)
            except (TypeError, ValueError):
                raise ValueError(f"banks.{key}: a bank is a number 0..63") from None
            if not 0 <= bank < 64:
                raise ValueError(f"banks.{key}: a bank is a number 0..63")
            merged[bank] = value.model_dump() if isinstance(value, BankSchema) else value
        return merged

    def private_features(self, bank: int) -> tuple[str, ...]:
        """The private column sets of ``bank`` (none for a bank not listed)."""
        schema = self.root.get(int(bank))
        return tuple(schema.private_features) if schema is not None else ()

    def layout(self, banks: list[int]) -> dict[int, tuple[str, ...]]:
        """``bank → private sets`` of ``banks`` (what a manifest and a model card record)."""
        return {b: self.private_features(b) for b in banks}

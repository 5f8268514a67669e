"""The one typed configuration object, loaded from one YAML file and overridable on the CLI.

Each component owns its section's model (``fedfraud.feature_store.config``,
``fedfraud.training.data.config``, ...); this module only composes them. Precedence,
lowest first: model defaults < ``fedfraud.yaml`` (or ``--config PATH``) <
``--set section.key=value`` < a subcommand's own flags.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fedfraud.core.errors import ConfigError
from fedfraud.feature_store.config import EgoGraphConfig, EncoderConfig, PrivacyConfig
from fedfraud.feature_store.store_config import FeatureStoreConfig
from fedfraud.training.data.config import BanksConfig, GeneratorConfig, IngestConfig
from fedfraud.training.embeddings.config import Hin2VecConfig
from fedfraud.training.fraud.config import FraudConfig
from fedfraud.training.anomaly.config import AnomalyConfig
from fedfraud.training.federated.config import FederatedConfig
from fedfraud.training.merchant_risk.config import MerchantNoiseConfig, MerchantRiskConfig
from fedfraud.training.retrain.config import RetrainConfig
from fedfraud.training.tokenizer.config import TokenizerConfig
from fedfraud.serving.config import ServingConfig

__all__ = ["FedfraudConfig", "load_config", "apply_overrides", "DEFAULT_CONFIG_FILE"]

DEFAULT_CONFIG_FILE = Path("fedfraud.yaml")


class FedfraudConfig(BaseModel):
    """Every knob of the system, grouped by the component that reads it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    generate: GeneratorConfig = Field(default_factory=GeneratorConfig)
    ingest: IngestConfig = Field(default_factory=IngestConfig)
    encoder: EncoderConfig = Field(default_factory=EncoderConfig)
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    egograph: EgoGraphConfig = Field(default_factory=EgoGraphConfig)
    # -- sections added by later components go below this line --
    fraud: FraudConfig = Field(default_factory=FraudConfig)
    features: FeatureStoreConfig = Field(default_factory=FeatureStoreConfig)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    anomaly: AnomalyConfig = Field(default_factory=AnomalyConfig)
    federated: FederatedConfig = Field(default_factory=FederatedConfig)
    serving: ServingConfig = Field(default_factory=ServingConfig)
    retrain: RetrainConfig = Field(default_factory=RetrainConfig)
    merchant_risk: MerchantRiskConfig = Field(default_factory=MerchantRiskConfig)
    merchant_noise: MerchantNoiseConfig = Field(default_factory=MerchantNoiseConfig)
    hin2vec: Hin2VecConfig = Field(default_factory=Hin2VecConfig)
    banks: BanksConfig = Field(default_factory=BanksConfig)  # which columns each bank holds (issue 39)


def _parse_value(raw: str) -> Any:
    """Parse an override value as YAML so ``3``, ``0.5``, ``true`` and ``[a, b]`` get their types."""
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` strings to a nested dict (returns a new dict)."""
    out: dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        dotted, raw = item.split("=", 1)
        parts = [p for p in dotted.strip().split(".") if p]
        if len(parts) < 2:
            raise ConfigError(f"override {item!r} must name a section and a key, e.g. privacy.epsilon_max=5")
        node = out
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {} if child is None else child
                if not isinstance(child, dict):
                    raise ConfigError(f"override {item!r}: {part!r} is not a section")
                node[part] = child
            node = child
        node[parts[-1]] = _parse_value(raw)
    return out


def _one_line(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    extra = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{where}: {first['msg']}{extra}"


def load_config(path: Path | None = None, overrides: list[str] | None = None) -> FedfraudConfig:
    """Load the config file (``fedfraud.yaml`` if present, else defaults) and apply overrides."""
    data: dict[str, Any] = {}
    explicit = path is not None
    path = path or DEFAULT_CONFIG_FILE
    if path.exists():
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML ({exc.__class__.__name__})") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: top level must be a mapping of sections")
        data = loaded
    elif explicit:
        raise ConfigError(f"config file {path} does not exist")
    data = apply_overrides(data, overrides or [])
    try:
        return FedfraudConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"invalid configuration: {_one_line(err)}") from None


def update_section(config: FedfraudConfig, section: str, **values: Any) -> FedfraudConfig:
    """Return ``config`` with the non-None ``values`` set in ``section`` (CLI flags win)."""
    values = {k: v for k, v in values.items() if v is not None}
    if not values:
        return config
    current = getattr(config, section).model_dump()
    current.update(values)
    try:
        new_section = type(getattr(config, section)).model_validate(current)
    except ValidationError as err:
        raise ConfigError(f"invalid {section} option: {_one_line(err)}") from None
    return config.model_copy(update={section: new_section})

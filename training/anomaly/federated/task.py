"""Flower task of the federated anomaly model: settings, model, per-bank data and the train/test functions.

Settings travel as one flat dict of kebab-case keys (what
``[tool.flwr.app.config]`` and ``context.run_config`` hold): the fields of
``AnomalyConfig`` and ``FederatedConfig`` under their own names
(``local-epochs``, ``proximal-mu``, ...), the fields of the privacy, encoder
and ego-graph sections prefixed (``privacy-epsilon-max``, ``encoder-dim``,
``egograph-max-nodes``) and the run keys ``data-dir``, ``out-dir``,
``resume``, ``num-banks``, ``publish``. The ServerApp forwards them to the
clients in every train/evaluate message, so a client needs no other source.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from pydantic import BaseModel, ValidationError

from fedfraud.core.errors import ConfigError
from fedfraud.feature_store.config import EgoGraphConfig, EncoderConfig, PrivacyConfig
from fedfraud.training.anomaly.config import AnomalyConfig
from fedfraud.training.anomaly.data import BankData, load_bank_data
from fedfraud.training.anomaly.dpsgd import CardholderDP, plan_noise, steps_per_round
from fedfraud.training.anomaly.engine import (
    TrainStats,
    evaluate_fraud,
    evaluate_selection,
    evaluate_task,
    sources_of,
    train_model,
)
from fedfraud.training.anomaly.model import AnomalyModel, pick_device
from fedfraud.training.anomaly.pool import pooling_names
from fedfraud.training.anomaly.run import checkpoint_dir
from fedfraud.training.federated.config import FederatedConfig

if TYPE_CHECKING:
    from fedfraud.config import FedfraudConfig

__all__ = [
    "MODEL_KEYS",
    "RunSettings",
    "bank_data",
    "build_model",
    "cardholder_dp",
    "initial_model",
    "local_test",
    "local_train",
    "lr_factor",
    "on_node",
    "public_slice",
    "total_dp_steps",
]

logger = logging.getLogger(__name__)

_SECTIONS: dict[str, tuple[str, type[BaseModel]]] = {
    "anomaly": ("", AnomalyConfig),
    "federated": ("", FederatedConfig),
    "privacy": ("privacy-", PrivacyConfig),
    "encoder": ("encoder-", EncoderConfig),
    "egograph": ("egograph-", EgoGraphConfig),
}
_RUN_DEFAULTS: dict[str, Any] = {
    "data-dir": "data/demo",
    "out-dir": "artifacts",
    "resume": False,
    "num-banks": 0,
    "publish": True,
    "cache-dir": "",
    "registry-dir": "",
}
#: Keys the server adds to train/evaluate messages (not settings): round numbers, FedProx μ, DP clipping norm.
_MESSAGE_KEYS = ("proximal-mu", "server-round", "fraud-eval", "global-round", "clipping_norm")  # fraud-eval: an older
# server's key, accepted and ignored (every evaluation scores the frauds now)
#: Settings a resumed run must share with its checkpoint (they shape the model or its data).
MODEL_KEYS: tuple[str, ...] = (
    "pooling",
    "layers",
    "hidden",
    "ratio",
    "disc-hidden",
    "readout",
    "heads",
    "ablate",
    "data-dir",
    "encoder-dim",
    "encoder-variant",
    "encoder-merchant-buckets",
    "egograph-max-nodes",
    "privacy-epsilon-max",
    "privacy-epsilon-min",
    "privacy-mechanism",
    "privacy-geo-epsilon-per-km",
    "privacy-hour-epsilon",
)


def _kebab(name: str) -> str:
    return name.replace("_", "-")


def _leaves(
    model: type[BaseModel], prefix: str, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, tuple[str, ...], Any]]:
    """(flat key, attribute path, field info) of every scalar setting; a nested section's name prefixes its keys
    (``federated.dp.clipping_norm`` → ``dp-clipping-norm``).
    """
    for name, info in model.model_fields.items():
        if info.exclude:  # a secret (privacy.secret_seed): each ClientApp reads its own, no message carries it
            continue
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            yield from _leaves(kind, f"{prefix}{_kebab(name)}-", (*path, name))
        else:
            yield prefix + _kebab(name), (*path, name), info


@dataclass(frozen=True)
class RunSettings:
    """All settings of one anomaly training run, typed."""

    anomaly: AnomalyConfig
    federated: FederatedConfig
    privacy: PrivacyConfig
    encoder: EncoderConfig
    egograph: EgoGraphConfig
    data_dir: Path
    out_dir: Path
    resume: bool = False
    num_banks: int = 0
    publish: bool = True
    cache: str = ""
    registry: str = ""  # where the model is published; "" → out_dir (a retrain cycle keeps checkpoints apart)

    def __post_init__(self) -> None:
        # the pooling name is checked here, where torch is loaded anyway, against the operators' own registry
        if self.anomaly.pooling.strip().lower() not in pooling_names():
            raise ConfigError(f"unknown pooling {self.anomaly.pooling!r}; valid: {', '.join(pooling_names())}")
        if self.federated.dsfl.public_cardholders and self.anomaly.cardholder_dp.enabled:
            raise ConfigError("dsfl-public-cardholders with cardholder-level DP-SGD: the public slice's transitions "
                              "would be sampled as if they were the bank's cardholders; use one or the other")

    @classmethod
    def from_config(cls, cfg: FedfraudConfig, data_dir: Path, out_dir: Path, resume: bool = False) -> RunSettings:
        """The settings of a run from the typed config's sections (CLI, demo and benchmarks build runs here)."""
        return cls(
            anomaly=cfg.anomaly,
            federated=cfg.federated,
            privacy=cfg.privacy,
            encoder=cfg.encoder,
            egograph=cfg.egograph,
            data_dir=Path(data_dir),
            out_dir=Path(out_dir),
            resume=resume,
        )

    @staticmethod
    def defaults() -> dict[str, Any]:
        """Every key with its default value (the pydantic defaults; pyproject's app config must agree)."""
        flat: dict[str, Any] = {}
        for prefix, model in _SECTIONS.values():
            for key, _, info in _leaves(model, prefix):
                flat[key] = info.get_default(call_default_factory=True)
        return {**flat, **_RUN_DEFAULTS}

    @classmethod
    def from_flat(cls, flat: dict[str, Any]) -> RunSettings:
        """Parse a flat kebab-case dict (missing keys take defaults); unknown keys or bad values → ConfigError."""
        merged = {**cls.defaults(), **dict(flat)}
        known = set(cls.defaults())
        extra = sorted(k for k in merged if k not in known and k not in _MESSAGE_KEYS)
        if extra:
            raise ConfigError(f"unknown anomaly run setting {extra[0]!r}")
        sections: dict[str, BaseModel] = {}
        for section, (prefix, model) in _SECTIONS.items():
            values: dict[str, Any] = {}
            for key, path, _ in _leaves(model, prefix):
                node = values
                for part in path[:-1]:
                    node = node.setdefault(part, {})
                node[path[-1]] = merged[key]
            try:
                sections[section] = model.model_validate(values)
            except ValidationError as err:
                first = err.errors()[0]
                where = prefix + "-".join(_kebab(str(p)) for p in first["loc"]) if first["loc"] else section
                raise ConfigError(f"invalid setting {where}: {first['msg']}") from None
        return cls(
            data_dir=Path(str(merged["data-dir"])),
            out_dir=Path(str(merged["out-dir"])),
            resume=bool(merged["resume"]),
            num_banks=int(merged["num-banks"]),
            publish=bool(merged["publish"]),
            cache=str(merged["cache-dir"]),
            registry=str(merged["registry-dir"]),
            **sections,  # type: ignore[arg-type]
        )

    def to_flat(self) -> dict[str, Any]:
        """The flat kebab-case dict (values are ConfigRecord-compatible scalars)."""
        flat: dict[str, Any] = {}
        for section, (prefix, model) in _SECTIONS.items():
            dumped = getattr(self, section).model_dump()
            for key, path, _ in _leaves(model, prefix):
                value = dumped
                for part in path:
                    value = value[part]
                flat[key] = value
        flat.update(
            {
                "data-dir": str(self.data_dir),
                "out-dir": str(self.out_dir),
                "resume": self.resume,
                "num-banks": self.num_banks,
                "publish": self.publish,
                "cache-dir": self.cache,
                "registry-dir": self.registry,
            }
        )
        return flat

    def config_dump(self) -> dict[str, Any]:
        """Nested config for the registry (full, by section)."""
        return {s: getattr(self, s).model_dump() for s in _SECTIONS} | {"data_dir": str(self.data_dir)}

    @property
    def registry_dir(self) -> Path:
        """The model registry the run publishes to (``registry-dir``, else ``out-dir``)."""
        return Path(self.registry) if self.registry else self.out_dir

    @property
    def cache_dir(self) -> Path:
        """Bank-internal cache of built ego-graph pairs (private features only); ``cache-dir`` or under out-dir."""
        return Path(self.cache) if self.cache else checkpoint_dir(self.out_dir, "cache")


def build_model(settings: RunSettings) -> AnomalyModel:
    """The anomaly model, initialised from ``anomaly.seed`` (every process builds the same initial weights)."""
    torch.manual_seed(settings.anomaly.seed)
    return AnomalyModel(settings.anomaly, settings.encoder, settings.egograph.max_nodes)


def initial_model(settings: RunSettings) -> AnomalyModel:
    """The run's starting weights: :func:`build_model`'s, or the published model ``anomaly.init_from`` names
    (public pretraining; same architecture). Only where a run starts (the server, the in-process trainers): a
    client receives the weights in every message, and the registry folder need not exist at a bank.
    """
    model = build_model(settings)
    if settings.anomaly.init_from:
        from fedfraud.training.anomaly.scorer import AnomalyScorer

        source = AnomalyScorer.from_registry(settings.anomaly.init_from, device="cpu")
        try:
            model.load_state_dict(source.model.state_dict())
        except RuntimeError as err:
            raise ConfigError(f"anomaly.init_from {settings.anomaly.init_from}: {source.tag} does not fit "
                              f"this run's architecture ({str(err).splitlines()[0]})") from None
        logger.info("anomaly model initialised from %s (%s)", settings.anomaly.init_from, source.tag)
    return model


_BANKS: OrderedDict[tuple[Any, ...], BankData] = OrderedDict()
_MAX_CACHED = 5


def bank_data(settings: RunSettings, bank: int) -> BankData:
    """This bank's data, kept in the (client) process across rounds and cached on disk across processes."""
    key = (
        str(settings.data_dir),
        bank,
        settings.anomaly.model_dump_json(),
        settings.encoder.model_dump_json(),
        settings.privacy.model_dump_json(),
        settings.egograph.model_dump_json(),
    )
    if key in _BANKS:
        _BANKS.move_to_end(key)
        return _BANKS[key]
    data = load_bank_data(
        settings.data_dir,
        bank,
        settings.anomaly,
        settings.encoder,
        settings.privacy,
        settings.egograph,
        cache_dir=settings.cache_dir,
    )
    _BANKS[key] = data
    while len(_BANKS) > _MAX_CACHED:
        _BANKS.popitem(last=False)
    return data


def public_slice(settings: RunSettings, bank: int) -> BankData | None:
    """DSFL's shared public slice as ``bank`` sees it, or None (not ``aggregation: dsfl``, or no slice asked for).

    The slice is a small dataset of the project's own generator with a public seed, so every bank can rebuild
    the same one (nothing is sent; in the paper the server hands it out). It is generated once into the cache
    folder (written aside, then renamed: banks in other processes may race) and featurised with the bank's own
    featurizer under ``bank_<k>`` (a link to the slice), like the bank's own data.
    """
    fed = settings.federated
    if fed.aggregation != "dsfl" or not fed.dsfl.public_cardholders:
        return None
    from fedfraud.training.data.config import GeneratorConfig
    from fedfraud.training.data.synthetic import generate_dataset

    root = settings.cache_dir / f"dsfl-public-{fed.dsfl.public_cardholders}-{fed.dsfl.public_seed}"
    if not (root / "manifest.json").exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        aside = Path(tempfile.mkdtemp(dir=root.parent, prefix=".dsfl-public-"))
        generate_dataset(aside, GeneratorConfig(banks=1, cardholders=fed.dsfl.public_cardholders,
                                                seed=fed.dsfl.public_seed), raw_csv=False, progress=False)
        try:
            os.rename(aside, root)
        except OSError:  # another bank renamed its identical copy first
            shutil.rmtree(aside, ignore_errors=True)
    link = root / f"bank_{bank}"
    if bank and not link.exists():
        try:
            link.symlink_to("bank_0", target_is_directory=True)
        except FileExistsError:
            pass
    return bank_data(replace(settings, data_dir=root), bank)


def on_node(settings: RunSettings, bank: int, node_config: Any) -> RunSettings:
    """The run's settings as this SuperNode sees them: its own bank folder wins over the server's ``data-dir``.

    In a deployment the ServerApp does not know where a bank keeps its data, so
    each SuperNode is started with ``--node-config "partition-id=k
    data-dir=<root>/bank_k [cache-dir=...]"``: the folder of its own bank only
    (named ``bank_<k>`` like every dataset's layout). In the simulation the node
    config has no ``data-dir`` and the settings are returned unchanged.
    """
    own = str(node_config.get("data-dir", "") or "")
    if not own:
        return settings
    folder = Path(own)
    if folder.name != f"bank_{bank}":
        raise ConfigError(f"node data-dir {folder} must be bank {bank}'s folder, named bank_{bank}")
    cache = str(node_config.get("cache-dir", "") or "")
    return replace(settings, data_dir=folder.parent, cache=cache or settings.cache)


def lr_factor(cfg: AnomalyConfig, round_: int, rounds: int) -> float:
    """Learning-rate multiplier of round ``round_`` (1-based) of ``rounds``: 1, or cosine down to ``lr_min_factor``."""
    if cfg.lr_schedule == "constant" or rounds <= 1:
        return 1.0
    progress = min(max(round_ - 1, 0) / (rounds - 1), 1.0)
    return cfg.lr_min_factor + (1.0 - cfg.lr_min_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def local_train(
    model: AnomalyModel,
    bank: BankData,
    settings: RunSettings,
    round_: int,
    proximal_mu: float,
    poisoned: bool = False,
) -> TrainStats:
    """E local epochs of ``samples_per_epoch`` pairs with the FedProx term, seeded by (seed, bank, round);
    ``poisoned``: on wrong targets (a simulated ``flip-targets`` bank). Under DSFL with a public slice the pairs
    are drawn from the bank's and the slice's, in proportion to their sizes.
    """
    cfg = settings.anomaly
    shared = public_slice(settings, bank.bank)
    stats, _ = train_model(
        model,
        sources_of([bank] if shared is None else [bank, shared], cfg, settings.egograph.max_nodes),
        epochs=cfg.local_epochs,
        samples_per_epoch=cfg.samples_per_epoch,
        batch_size=cfg.batch_size,
        lr=cfg.lr * lr_factor(cfg, round_, settings.federated.rounds),
        seed=[cfg.seed, bank.bank, round_],
        proximal_mu=proximal_mu,
        aux_weight=cfg.aux_weight,
        poisoned=poisoned,
        dp=cardholder_dp(settings),
    )
    return stats


def total_dp_steps(settings: RunSettings) -> int:
    """Local DP-SGD steps per bank over the whole run (the accountant's count, from public settings only)."""
    cfg = settings.anomaly
    return settings.federated.rounds * steps_per_round(cfg.local_epochs, cfg.samples_per_epoch, cfg.batch_size)


def cardholder_dp(settings: RunSettings) -> CardholderDP | None:
    """The bank's DP-SGD plan (noise calibrated for every step of every round), or None when it is off."""
    dp = settings.anomaly.cardholder_dp
    if not dp.enabled:
        return None
    return CardholderDP(dp, plan_noise(dp, total_dp_steps(settings)))


def local_test(model: AnomalyModel, bank: BankData) -> dict[str, float]:
    """Validation loss (model selection), test-task metrics and real-label fraud metrics, every round: the published
    round is chosen on validation loss alone, and its card must report that round's own test figures.
    """
    return {**evaluate_selection(model, bank), **evaluate_task(model, bank), **evaluate_fraud(model, bank)}


def device_for_client() -> torch.device:
    """CUDA when the client was given a GPU (Ray sets CUDA_VISIBLE_DEVICES), else CPU."""
    return pick_device("auto")

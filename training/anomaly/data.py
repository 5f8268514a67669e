"""One bank's anomaly-training data, built inside the bank from its own parquet.

:func:`load_bank_data` replays the bank's transactions through
:func:`fedfraud.feature_store.egograph.iter_snapshot_pairs` (the same code serving
uses) and keeps bounded, seeded samples:

* ``train``: real transitions of training cardholders (reservoir of
  ``max_train_pairs``), from which each local epoch draws ``samples_per_epoch``;
* ``test`` + ``test_negatives``: real transitions of test cardholders and one
  fixed negative each — the negative-sampling test task;
* ``fraud_eval``: every fraud transition of test cardholders plus a reservoir
  of ``max_eval_normal`` normal ones, with weights that undo the subsampling,
  for the real-label evaluation. Labels are never used for training.

Only private features (L', T', merchant buckets) are kept; the result is
cached on disk (bank-internal) so a second process or a resumed run does not
rebuild it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import torch
from torch_geometric.data import Data

from fedfraud.core.errors import UserError
from fedfraud.feature_store.config import EgoGraphConfig, EncoderConfig, PrivacyConfig
from fedfraud.feature_store.egograph import SnapshotPair, active_cardholders, iter_snapshot_pairs
from fedfraud.feature_store.events import HISTORY_SIZE, RAW_EVENT_SIZE
from fedfraud.feature_store.privacy import PrivateFeaturizer, mu_gdp
from fedfraud.training.anomaly.config import AnomalyConfig
from fedfraud.training.anomaly.negatives import FeaturePool, NegativeSampler
from fedfraud.training.safe_load import NUMPY_ARRAYS, UnsafeFileError, load_torch_file
from fedfraud.feature_store.layout import TRANSACTIONS_FILE, bank_dir, list_banks, read_bank, split_of

__all__ = ["BankData", "BankPrivacy", "PairSet", "check_dataset", "load_bank_data"]

logger = logging.getLogger(__name__)

_CACHE_VERSION = 3


@dataclass(frozen=True)
class PairSet:
    """Aligned G_{t-1} and G_t graphs with the newest transaction's raw event and the history before it."""

    previous: list[Data]
    current: list[Data]
    events: np.ndarray
    priors: np.ndarray
    labels: np.ndarray | None = None  # is_fraud per pair, for evaluation only (never read by training)
    cardholders: np.ndarray | None = None  # pseudonym per pair, for intervals over cardholders
    transactions: np.ndarray | None = None  # transaction_id per pair, to join side labels (scenarios) and baselines

    def __post_init__(self) -> None:
        n = len(self.previous)
        if len(self.current) != n or self.events.shape != (n, RAW_EVENT_SIZE) or self.priors.shape != (
            n,
            HISTORY_SIZE,
        ):
            raise ValueError(
                f"PairSet: {n} previous, {len(self.current)} current graphs, events {self.events.shape}, "
                f"priors {self.priors.shape}"
            )

    @classmethod
    def of(cls, pairs: list[SnapshotPair]) -> PairSet:
        """A PairSet of snapshot pairs."""
        events = np.array([p.event for p in pairs]).reshape(len(pairs), RAW_EVENT_SIZE)
        priors = np.array([p.prior for p in pairs]).reshape(len(pairs), HISTORY_SIZE)
        labels = np.array([bool(p.is_fraud) for p in pairs], dtype=bool)
        holders = np.array([p.cardholder for p in pairs], dtype=object)
        ids = np.array([p.transaction_id for p in pairs], dtype=object)
        return cls([p.previous for p in pairs], [p.current for p in pairs], events, priors, labels, holders, ids)

    def __len__(self) -> int:
        return len(self.current)


@dataclass(frozen=True)
class BankPrivacy:
    """μ-GDP of the bank's feature release over its cardholders' personal ε (thesis §4.4.2)."""

    cardholders: int
    mu_gdp: float
    epsilon_min: float
    epsilon_mean: float
    epsilon_max: float
    delta: float


@dataclass(frozen=True)
class BankData:
    """Everything one client trains and evaluates on; built and kept inside the bank."""

    bank: int
    train: PairSet
    val: PairSet
    test: PairSet
    test_negatives: list[Data]
    fraud_eval: PairSet
    fraud_labels: np.ndarray
    fraud_weights: np.ndarray
    pool: FeaturePool
    privacy: BankPrivacy
    counts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.train) == 0:
            raise UserError(f"bank {self.bank} has no training transitions (too few active training cardholders)")
        if len(self.test) == 0:
            raise UserError(f"bank {self.bank} has no test transitions (no active test cardholders)")
        if len(self.test_negatives) != len(self.test):
            raise ValueError("one test negative per test pair is required")
        n = len(self.fraud_eval)
        if self.fraud_labels.shape != (n,) or self.fraud_weights.shape != (n,):
            raise ValueError("fraud_labels and fraud_weights must have one entry per fraud_eval pair")


class _Reservoir:
    """Uniform sample of at most ``cap`` items of a stream (Algorithm R), seeded."""

    def __init__(self, cap: int, rng: np.random.Generator) -> None:
        self.cap, self.rng, self.items, self.seen = cap, rng, [], 0

    def offer(self, item: object) -> None:
        self.seen += 1
        if len(self.items) < self.cap:
            self.items.append(item)
        else:
            j = int(self.rng.integers(self.seen))
            if j < self.cap:
                self.items[j] = item


class _PerCardholderReservoir:
    """At most ``cap`` items per cardholder, each cardholder's a uniform sample of its own stream.

    Under cardholder-level DP the training pool must not couple cardholders: with one shared reservoir, adding a
    cardholder changes which of the others' transitions are kept. Here a cardholder's kept transitions are drawn
    from its own transitions only (the shared generator changes the draws, not their distribution).
    """

    def __init__(self, cap: int, rng: np.random.Generator) -> None:
        self.cap, self.rng, self.seen = cap, rng, 0
        self.by_holder: dict[str, _Reservoir] = {}

    def offer(self, item: SnapshotPair) -> None:
        self.seen += 1
        holder = str(item.cardholder)
        if holder not in self.by_holder:
            self.by_holder[holder] = _Reservoir(self.cap, self.rng)
        self.by_holder[holder].offer(item)

    @property
    def items(self) -> list[SnapshotPair]:
        return [p for r in self.by_holder.values() for p in r.items]


def check_dataset(data_dir: Path, min_transactions_per_month: float = 0.0) -> list[int]:
    """Banks of ``data_dir`` after cheap checks, so bad input fails with one line before Ray starts.

    Raises :class:`UserError` for a missing directory, no banks, or a bank
    without rows or without any cardholder active enough to give a transition.
    """
    data_dir = Path(data_dir)
    banks = list_banks(data_dir)
    for bank in banks:
        path = bank_dir(data_dir, bank) / TRANSACTIONS_FILE
        if pq.ParquetFile(path).metadata.num_rows == 0:
            raise UserError(f"bank {bank} ({path}) has no transactions")
        frame = read_bank(data_dir, bank, columns=["cardholder_id", "timestamp"])
        active = active_cardholders(frame, min_transactions_per_month)
        counts = frame["cardholder_id"].value_counts().reindex(active).fillna(0)
        splits = {split_of(str(c)) for c in counts.index[counts >= 2]}
        for split in ("train", "test"):
            if split not in splits:
                raise UserError(
                    f"bank {bank} ({path}) has no active {split} cardholder with a transition "
                    f"({len(active)} active cardholders; the split is 75/25 by cardholder)"
                )
    return banks


def _fingerprint(path: Path, *parts: object) -> str:
    st = path.stat()
    blob = json.dumps(
        [_CACHE_VERSION, str(path.resolve()), st.st_size, st.st_mtime_ns, *parts], sort_keys=True, default=str
    )
    return hashlib.blake2b(blob.encode(), digest_size=12).hexdigest()


def _build(
    frame: pd.DataFrame,
    bank: int,
    cfg: AnomalyConfig,
    encoder_cfg: EncoderConfig,
    privacy_cfg: PrivacyConfig,
    ego_cfg: EgoGraphConfig,
    progress: bool,
) -> BankData:
    featurizer = PrivateFeaturizer.for_bank(encoder_cfg, privacy_cfg, bank)
    rng = np.random.default_rng([cfg.seed, bank, 0])
    dp = cfg.cardholder_dp
    train: _Reservoir | _PerCardholderReservoir
    train, val, test, normal = (
        _PerCardholderReservoir(dp.pool_per_cardholder, rng) if dp.enabled else _Reservoir(cfg.max_train_pairs, rng),
        _Reservoir(cfg.max_test_pairs, rng),
        _Reservoir(cfg.max_test_pairs, rng),
        _Reservoir(cfg.max_eval_normal, rng),
    )
    fraud: list[SnapshotPair] = []
    splitter = functools.partial(split_of, val_fraction=cfg.val_fraction)
    for pair in iter_snapshot_pairs(frame, featurizer, ego_cfg, progress=progress, split_of=splitter):
        if pair.split != "test":
            (train if pair.split == "train" else val).offer(pair)
            continue
        test.offer(pair)
        if pair.is_fraud:
            fraud.append(pair)
        elif pair.is_fraud is not None:
            normal.offer(pair)

    train_set, val_set, test_set = PairSet.of(train.items), PairSet.of(val.items), PairSet.of(test.items)
    if len(train_set) == 0 or len(test_set) == 0:
        split = "training" if len(train_set) == 0 else "test"
        raise UserError(f"bank {bank} has no {split} transitions (no active {split} cardholder)")
    pool = FeaturePool.from_graphs(train_set.current, seed=cfg.seed + bank)
    test_pool = FeaturePool.from_graphs(test_set.current, seed=cfg.seed + bank + 1)
    sampler = NegativeSampler.from_config(test_pool, cfg, ego_cfg.max_nodes)
    negatives = [s.graph for s in sampler.sample(test_set.current, np.random.default_rng([cfg.seed, bank, 1]))]
    weight_normal = normal.seen / max(len(normal.items), 1)
    eval_items = fraud + normal.items
    holders = frame["cardholder_id"].astype(str).unique()
    eps = featurizer.epsilon(holders)
    privacy = BankPrivacy(
        cardholders=len(holders),
        mu_gdp=mu_gdp(eps, privacy_cfg.delta),
        epsilon_min=float(eps.min()),
        epsilon_mean=float(eps.mean()),
        epsilon_max=float(eps.max()),
        delta=privacy_cfg.delta,
    )
    return BankData(
        bank=bank,
        train=train_set,
        val=val_set,
        test=test_set,
        test_negatives=negatives,
        fraud_eval=PairSet.of(eval_items),
        fraud_labels=np.r_[np.ones(len(fraud), dtype=bool), np.zeros(len(normal.items), dtype=bool)],
        fraud_weights=np.r_[np.ones(len(fraud)), np.full(len(normal.items), weight_normal)],
        pool=pool,
        privacy=privacy,
        counts={
            "train_pairs_seen": train.seen,
            "val_pairs_seen": val.seen,
            "test_pairs_seen": test.seen,
            "fraud_test_pairs": len(fraud),
            "normal_test_pairs_seen": normal.seen,
        },
    )


def _cache_types() -> list[Any]:
    """The types a bank-data cache holds besides tensors and plain values (:func:`load_torch_file`'s allow-list):
    our frozen dataclasses, PyG's graph containers and numpy arrays; unpickling any of them only sets attributes.
    """
    from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import GlobalStorage

    return [BankData, BankPrivacy, PairSet, FeaturePool, Data, GlobalStorage, DataEdgeAttr, DataTensorAttr,
            *NUMPY_ARRAYS]


def load_bank_data(
    data_dir: Path,
    bank: int,
    cfg: AnomalyConfig,
    encoder_cfg: EncoderConfig,
    privacy_cfg: PrivacyConfig,
    ego_cfg: EgoGraphConfig,
    cache_dir: Path | None = None,
    progress: bool = False,
) -> BankData:
    """Build (or load from ``cache_dir``) one bank's :class:`BankData`."""
    path = bank_dir(Path(data_dir), bank) / TRANSACTIONS_FILE
    if not path.exists():
        raise UserError(f"{path} does not exist")
    relevant = cfg.model_dump(
        include={
            "max_train_pairs",
            "max_test_pairs",
            "max_eval_normal",
            "perturb_min",
            "perturb_max",
            "newest_share",
            "val_fraction",
            "seed",
        }
    )
    if cfg.cardholder_dp.enabled:  # another training pool (per cardholder); other runs keep their cache keys
        relevant["cardholder_pool"] = cfg.cardholder_dp.pool_per_cardholder
    secrets = PrivateFeaturizer.for_bank(encoder_cfg, privacy_cfg, bank).fingerprint  # another secret: other features
    key = _fingerprint(path, relevant, encoder_cfg.model_dump(), privacy_cfg.model_dump(), ego_cfg.model_dump(),
                       secrets)
    cache = Path(cache_dir) / f"bank_{bank}-{key}.pt" if cache_dir is not None else None
    if cache is not None and cache.exists():
        try:
            data = load_torch_file(cache, _cache_types(), "bank-data cache")
            if not isinstance(data, BankData):
                raise TypeError(f"holds a {type(data).__name__}, not BankData")
            logger.info("bank_data bank=%d source=cache path=%s", bank, cache)
            return data
        except UnsafeFileError as exc:  # written by someone else: never unpickled, rebuilt over
            logger.error("bank_data bank=%d %s; rebuilding it", bank, exc)
        except Exception as exc:  # a torn or stale cache is rebuilt, never trusted
            logger.warning("bank_data bank=%d cache unreadable (%s); rebuilding", bank, exc.__class__.__name__)
    start = time.perf_counter()
    frame = read_bank(Path(data_dir), bank)
    if frame.empty:
        raise UserError(f"bank {bank} ({path}) has no transactions")
    data = _build(frame, bank, cfg, encoder_cfg, privacy_cfg, ego_cfg, progress)
    logger.info(
        "bank_data bank=%d train=%d test=%d fraud_eval=%d fraud=%d seconds=%.1f",
        bank,
        len(data.train),
        len(data.test),
        len(data.fraud_eval),
        int(data.fraud_labels.sum()),
        time.perf_counter() - start,
    )
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".pt", dir=cache.parent)
        with os.fdopen(fd, "wb") as fh:
            torch.save(data, fh)
        os.replace(tmp, cache)  # atomic: a concurrent reader sees the old file or the new one
    return data

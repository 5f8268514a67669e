"""Batch scoring and backtesting (``fedfraud score``): every transaction of a CSV or an ingested dataset.

The same code serves both paths: each cardholder's transactions are replayed
through :class:`fedfraud.feature_store.egograph.EgoGraphState` (what serving folds per
transaction) and scored by :class:`fedfraud.training.anomaly.scorer.AnomalyScorer`
(what serving loads); the fraud model, when the registry has one, gets the
same :class:`fedfraud.training.fraud.features.FraudFeatureState` rows serving builds (a model trained with
``--features +hin2vec`` also the columns of :func:`~fedfraud.training.embeddings.embed.causal_embeddings`, equal
to serving's: ``tests/integration/test_hin2vec_serving.py``).
A test checks that serving and batch scoring give identical anomaly scores.

Memory is bounded: a bank is scored in groups of whole cardholders of about
``chunk_rows`` rows, and rows are written as they are scored. A CSV is first
ingested (validated, bad rows rejected with reasons) into a temporary dataset
treated as one bank's data.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from fedfraud.core.errors import UserError
from fedfraud.feature_store.config import PrivacyConfig
from fedfraud.feature_store.privacy import PrivateFeaturizer, check_feature_mechanism
from fedfraud.feature_store.layout import MANIFEST_FILE, REJECTS_FILE, list_banks, read_bank
from fedfraud.serving.fraud_stage import reads_demographics

__all__ = ["ScoreReport", "score_path"]

logger = logging.getLogger(__name__)

_SUFFIXES = (".csv", ".parquet")


@dataclass
class ScoreReport:
    """What a scoring run did: rows in, rows written, rejects, models and speed."""

    rows: int = 0
    scored: int = 0
    rejected: int = 0
    seconds: float = 0.0
    models: dict[str, str] = field(default_factory=dict)
    rejects_path: Path | None = None

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else math.inf


class _Writer:
    """Appends scored rows to a ``.csv`` or ``.parquet`` file, one chunk at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._parquet: pq.ParquetWriter | None = None
        self._csv_started = False

    def write(self, frame: pd.DataFrame) -> None:
        if self.path.suffix == ".parquet":
            table = pa.Table.from_pandas(frame, preserve_index=False)
            if self._parquet is None:
                self._parquet = pq.ParquetWriter(self.path, table.schema)
            self._parquet.write_table(table.cast(self._parquet.schema))
        else:
            frame.to_csv(self.path, mode="a" if self._csv_started else "w", header=not self._csv_started, index=False)
            self._csv_started = True

    def close(self) -> None:
        if self._parquet is not None:
            self._parquet.close()


def _cardholder_chunks(frame: pd.DataFrame, chunk_rows: int) -> Iterator[pd.DataFrame]:
    """Groups of whole cardholders of about ``chunk_rows`` rows (a cardholder's history is never split)."""
    holders = frame["cardholder_id"].astype(str)
    sizes = holders.value_counts(sort=False)
    group = (sizes.cumsum() // max(chunk_rows, 1)).to_dict()
    keys = holders.map(group)
    for _, part in frame.groupby(keys.to_numpy(), sort=True):
        yield part


def _merchant_columns(registry: Path, data: Path, encoder_cfg: Any, privacy_cfg: PrivacyConfig,
                      fraud_kind: str = "fraud") -> tuple[dict[int, np.ndarray], tuple[str, ...]] | None:
    """Per bank (file order), the merchant-risk columns a fraud model trained with them reads, and their names;
    None for a model without. The releases are replayed over the scored data (its banks), as training replays them.
    """
    from fedfraud.serving.fraud_stage import merchant_risk_for
    from fedfraud.training.merchant_risk.config import MerchantNoiseConfig
    from fedfraud.training.merchant_risk.features import dataset_columns
    from fedfraud.training.registry import ModelRegistry, RegistryError

    try:
        config = ModelRegistry(registry).get(fraud_kind, "champion").config
    except RegistryError:
        return None
    risk = merchant_risk_for(config)
    if risk is None:
        return None
    from fedfraud.training.merchant_risk.features import merchant_names

    noise = MerchantNoiseConfig.model_validate(config.get("merchant_noise") or {})
    return dataset_columns(data, encoder_cfg, privacy_cfg, risk, noise), tuple(merchant_names(risk))


def _load_models(registry: Path, fraud_kind: str = "fraud") -> tuple[Any, Any, Any, dict[str, str]]:
    from fedfraud.serving.fraud_stage import fraud_config_for, load_fraud_model
    from fedfraud.training.anomaly.scorer import AnomalyScorer
    from fedfraud.training.registry import ModelRegistry, RegistryError

    reg = ModelRegistry(registry)
    try:
        scorer = AnomalyScorer.from_registry(reg, "champion")  # what serving decides with
    except RegistryError:
        raise UserError(f"no anomaly model in registry {registry}: run `fedfraud train anomaly` first") from None
    models = {"anomaly": scorer.tag}
    fraud = fraud_cfg = None
    try:
        fraud_version = reg.get(fraud_kind, "champion")
    except RegistryError:
        logger.info("score registry=%s has no %s model: writing the anomaly score alone", registry, fraud_kind)
    else:
        fraud, _ = load_fraud_model(reg, str(fraud_version.version), fraud_kind)  # serving's loader
        fraud_cfg = fraud_config_for(fraud_version.config, None)
        models["fraud"] = fraud_version.tag
    return scorer, fraud, fraud_cfg, models


def _hin2vec_model(registry: Path, fraud_kind: str, encoder_dim: int) -> Any:
    """The G-HIN2Vec encoder the champion fraud model's columns come from (the version its registry config pins,
    the one serving loads), None for a model without them.
    """
    from fedfraud.training.embeddings.features import pinned_hin2vec
    from fedfraud.training.registry import ModelRegistry

    return pinned_hin2vec(registry, ModelRegistry(registry).get(fraud_kind, "champion").config, encoder_dim)


_WORKER: dict[str, Any] = {}


def _init_worker(registry: Path, privacy: dict[str, Any]) -> None:
    """Load the models once per worker process (torch on one thread: the processes are the parallelism)."""
    import torch

    torch.set_num_threads(1)
    scorer, fraud, fraud_cfg, _ = _load_models(registry)
    hin2vec = _hin2vec_model(registry, "fraud", scorer.encoder_cfg.dim) if fraud is not None else None
    _WORKER.update(scorer=scorer, fraud=fraud, fraud_cfg=fraud_cfg, hin2vec=hin2vec,
                   privacy=PrivacyConfig.model_validate(privacy))


def _score_in_worker(part: pd.DataFrame, bank: int, merchant: np.ndarray | None,
                     merchant_names: tuple[str, ...] = ()) -> pd.DataFrame:
    w = _WORKER
    return _score_chunk(part, bank, w["scorer"], w["fraud"], w["fraud_cfg"], w["privacy"], merchant, w["hin2vec"],
                        merchant_names)


def _score_chunk(
    part: pd.DataFrame, bank: int, scorer: Any, fraud: Any, fraud_cfg: Any, privacy_cfg: PrivacyConfig,
    merchant: np.ndarray | None = None, hin2vec: Any = None, merchant_names: tuple[str, ...] = (),
) -> pd.DataFrame:
    featurizer = PrivateFeaturizer.for_bank(scorer.encoder_cfg, privacy_cfg, bank)
    anomaly = scorer.score_frame(part, featurizer)
    out = pd.DataFrame(
        {
            "transaction_id": part["transaction_id"].astype(str).to_numpy(),
            "cardholder": featurizer.pseudonyms(part["cardholder_id"].astype(str)),
            "bank": bank,
            "timestamp": part["timestamp"].to_numpy(),
            "anomaly_score": anomaly,
        }
    )
    if fraud is not None:
        from fedfraud.training.fraud.features import build_features

        private = featurizer.transform(part)
        features = build_features(part, private, fraud_cfg, anomaly, transitions=fraud.transitions)
        X = features.X if merchant is None else np.hstack([features.X, merchant]).astype(np.float32)
        names = (*features.names, *(merchant_names if merchant is not None else ()))
        if hin2vec is not None:  # last, as training's with_embeddings; a chunk holds whole cardholders (causal)
            from fedfraud.training.embeddings.embed import causal_embeddings, embedding_names

            X = np.hstack([X, causal_embeddings(part, featurizer, hin2vec.model, scorer.ego_cfg)])
            names = (*names, *embedding_names(X.shape[1] - len(names)))
        if reads_demographics(fraud):  # the bank's stored rows (_with_demographics), the age at each transaction
            from fedfraud.feature_store.demographics import (
                DEMOGRAPHIC_FEATURES,
                DEMOGRAPHIC_FIELDS,
                demographic_columns,
            )
            from fedfraud.feature_store.encoders import timestamps_us

            stored = part.reindex(columns=list(DEMOGRAPHIC_FIELDS)).to_numpy(dtype=np.float64)
            X = np.hstack([X, demographic_columns(timestamps_us(part["timestamp"]), stored)])
            names = (*names, *DEMOGRAPHIC_FEATURES)
        if tuple(fraud.input_names) != names:  # a model reading a subset or another order (FED-SPFD): by name
            X = X[:, [names.index(n) for n in fraud.input_names]]
        decisions = _decide(fraud, X, part, featurizer)
        out["fraud_score"] = [d.score for d in decisions]
        out["decision"] = ["fraud" if d.decision else "legit" for d in decisions]
        out["top_reasons"] = [
            json.dumps([{"feature": r.feature, "contribution": round(r.contribution, 4)} for r in d.top_reasons])
            for d in decisions
        ]
    return out


def _with_demographics(data: Path, bank: int, fraud: Any) -> pd.DataFrame:
    """Bank ``bank``'s canonical rows, with its cardholders' stored demographic fields as columns when ``fraud``
    reads demographic columns (NaN for a cardholder, or a bank, without a row); the rows' index is kept.
    """
    frame = read_bank(data, bank)
    if fraud is None or not reads_demographics(fraud):
        return frame
    from fedfraud.feature_store.demographics import DEMOGRAPHIC_FIELDS
    from fedfraud.feature_store.layout import read_cardholders

    holders = read_cardholders(data, bank)
    if holders is None:
        logger.warning("score bank=%d has no cardholders.parquet: its demographic columns are NaN", bank)
        return frame.assign(**{f: np.nan for f in DEMOGRAPHIC_FIELDS})
    table = holders.assign(cardholder_id=holders["cardholder_id"].astype(str)).set_index("cardholder_id")
    return frame.join(table[list(DEMOGRAPHIC_FIELDS)], on=frame["cardholder_id"].astype(str))


def _decide(fraud: Any, X: np.ndarray, part: pd.DataFrame, featurizer: PrivateFeaturizer) -> list[Any]:
    """The fraud model's decisions of ``part``'s rows (file order). A GNN replays them in arrival order through
    the scorer serving restores per micro-batch (:class:`~fedfraud.training.fraud.gnn.online.OnlineGraphScorer`);
    ``part`` is then the whole bank, so every merchant neighbourhood is complete.
    """
    from fedfraud.serving.graph_fraud import reads_neighbours

    if not reads_neighbours(fraud):
        return fraud.predict_batch(X)
    from fedfraud.feature_store.cardholder import merchant_key
    from fedfraud.feature_store.encoders import timestamps_us
    from fedfraud.training.fraud.gnn.online import OnlineGraphScorer

    order = np.lexsort((part["transaction_id"].astype(str).to_numpy(), timestamps_us(part["timestamp"])))
    holders = featurizer.pseudonyms(part["cardholder_id"].astype(str))
    merchants = [merchant_key(int(h)) for h in featurizer.merchant_hash(part["merchant_id"].astype(str))]
    decided = OnlineGraphScorer(fraud).decide(X[order], [holders[i] for i in order], [merchants[i] for i in order])
    out: list[Any] = [None] * len(order)
    for k, i in enumerate(order):
        out[i] = decided[k]
    return out


def _ordered(
    chunks: Iterator[tuple[pd.DataFrame, int, np.ndarray | None]], pool: Any, workers: int, scorer: Any, fraud: Any,
    fraud_cfg: Any, privacy_cfg: PrivacyConfig, hin2vec: Any = None, merchant_names: tuple[str, ...] = (),
) -> Iterator[pd.DataFrame]:
    """Scored chunks in input order: in this process, or ``2 × workers`` at a time in the pool."""
    if pool is None:
        for part, bank, merchant in chunks:
            yield _score_chunk(part, bank, scorer, fraud, fraud_cfg, privacy_cfg, merchant, hin2vec, merchant_names)
        return
    from collections import deque

    in_flight: deque[Any] = deque()
    for part, bank, merchant in chunks:
        in_flight.append(pool.submit(_score_in_worker, part, bank, merchant, merchant_names))
        if len(in_flight) >= 2 * workers:
            yield in_flight.popleft().result()
    while in_flight:
        yield in_flight.popleft().result()


def score_path(
    path: Path,
    registry: Path,
    out: Path,
    *,
    bank: int = 0,
    privacy_cfg: PrivacyConfig | None = None,
    chunk_rows: int = 50_000,
    workers: int = 1,
    progress: bool = True,
    fraud_kind: str = "fraud",
) -> ScoreReport:
    """Score a CSV (as bank ``bank``'s data) or an ingested dataset directory into ``out`` (.csv or .parquet).

    ``workers`` > 1 scores chunks of whole cardholders in that many processes
    (each loads the models once); rows are still written in chunk order. ``fraud_kind``: the registry kind that
    decides (:func:`fedfraud.serving.graph_fraud.fraud_kind` of ``fraud.variant``); a GNN (``fraud-gnn``) reads
    its merchants' neighbours across cardholders, so it scores each bank whole, in this process.
    """
    path, out = Path(path), Path(out)
    if out.suffix not in _SUFFIXES:
        raise UserError(f"--out must end in .csv or .parquet, got {out.name!r}")
    if not path.exists():
        raise UserError(f"{path} does not exist")
    privacy_cfg = privacy_cfg or PrivacyConfig()
    scorer, fraud, fraud_cfg, models = _load_models(Path(registry), fraud_kind)
    hin2vec = _hin2vec_model(Path(registry), fraud_kind, scorer.encoder_cfg.dim) if fraud is not None else None
    if hin2vec is not None:
        models["hin2vec"] = hin2vec.tag
    owner = getattr(fraud, "bank", None)
    if owner is not None and not path.is_dir() and bank != owner:
        raise UserError(f"{models['fraud']} is bank {owner}'s model: score this CSV with --bank {owner}")
    if fraud_kind != "fraud" and fraud is not None:
        chunk_rows, workers = 2**62, 1  # whole banks: merchant neighbourhoods span cardholders
    from fedfraud.training.registry import ModelRegistry

    reg = ModelRegistry(registry)
    for tag in models.values():  # the models' features must be computed the way they were trained on
        check_feature_mechanism(tag, reg.get_ref(tag).privacy, privacy_cfg)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = ScoreReport(models=models)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fedfraud-score-") as tmp:
        if path.is_dir():
            data, banks = path, list_banks(path)
        else:
            from fedfraud.training.data.config import IngestConfig
            from fedfraud.training.data.ingest import ingest_csv

            ingest = ingest_csv(path, Path(tmp), IngestConfig(banks=1), progress=progress)
            report.rejected = ingest.rejected
            if ingest.rejected:
                report.rejects_path = out.with_name(out.stem + ".rejects.jsonl")
                report.rejects_path.write_bytes((Path(tmp) / REJECTS_FILE).read_bytes())
            data, banks = Path(tmp), [0]
        if not (data / MANIFEST_FILE).exists() and not path.is_dir():
            raise UserError(f"{path}: nothing was ingested")
        if owner is not None and path.is_dir():  # a per-bank model (FED-SPFD) scores its own bank's rows only
            if owner not in banks:
                raise UserError(f"{models['fraud']} is bank {owner}'s model; {path} has banks {banks}")
            banks = [owner]
        writer = _Writer(out)
        total = sum(pq.ParquetFile(data / f"bank_{b}" / "transactions.parquet").metadata.num_rows for b in banks)
        found = (_merchant_columns(Path(registry), data, scorer.encoder_cfg, privacy_cfg, fraud_kind)
                 if fraud is not None else None)
        merchant, merchant_names = found if found is not None else (None, ())
        chunks = (
            (part, bank if not path.is_dir() else k, None if merchant is None else merchant[k][part.index.to_numpy()])
            for k in banks
            for part in _cardholder_chunks(_with_demographics(data, k, fraud), chunk_rows)
        )
        pool = None
        if workers > 1:
            import concurrent.futures
            import multiprocessing

            pool = concurrent.futures.ProcessPoolExecutor(
                workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker,
                initargs=(Path(registry), privacy_cfg.model_dump()),
            )
        try:
            with tqdm(total=total, unit="tx", desc="score", disable=not progress) as bar:
                for scored in _ordered(chunks, pool, workers, scorer, fraud, fraud_cfg, privacy_cfg, hin2vec,
                                       merchant_names):
                    writer.write(scored)
                    report.rows += len(scored)
                    report.scored += int(np.isfinite(scored["anomaly_score"]).sum())
                    bar.update(len(scored))
        finally:
            writer.close()
            if pool is not None:
                pool.shutdown(cancel_futures=True)
    report.seconds = time.perf_counter() - start
    logger.info("score rows=%d scored=%d rejected=%d seconds=%.1f rows_per_s=%.0f", report.rows, report.scored,
                report.rejected, report.seconds, report.rows_per_s)
    return report

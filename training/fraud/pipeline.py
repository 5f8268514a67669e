"""End-to-end jobs behind the CLI: data (dir or CSV) → features with AS → train → evaluate / publish."""

from __future__ import annotations

import dataclasses
import json
import logging
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from fedfraud.feature_store.privacy import feature_ldp_card
from fedfraud.training.fraud.dataset import dataset_features, labelled_banks, materialize
from fedfraud.training.fraud.features import ANOMALY_FEATURE, PREVIOUS_FEATURES, TRANSITION_FEATURE, FraudFeatures
from fedfraud.training.fraud.metrics import classification_metrics
from fedfraud.training.registry import ModelRegistry, ModelVersion
from fedfraud.training.retrain.drift import DRIFT_FILE

if TYPE_CHECKING:
    from fedfraud.config import FedfraudConfig
    from fedfraud.training.fraud.evaluate import StudyReport
    from fedfraud.training.fraud.model import FraudModel

__all__ = ["load_fraud_banks", "stacking_study", "train_and_publish"]

logger = logging.getLogger(__name__)


def load_fraud_banks(cfg: FedfraudConfig, data: Path, registry: Path, anomaly_version: str, stack: ExitStack,
                     require_labels: bool) -> tuple[dict[int, FraudFeatures], dict[str, Any]]:
    """Features of every bank of ``data`` with the registry's anomaly model as the AS column.

    ``stack`` keeps a CSV's temporary dataset alive for as long as the caller needs it.
    """
    from fedfraud.training.anomaly.scorer import AnomalyScorer

    scorer = AnomalyScorer.from_registry(registry, anomaly_version)
    tag = scorer.tag
    root = stack.enter_context(materialize(data, cfg.ingest, cfg.banks))  # a CSV keeps each bank's private columns
    banks = dataset_features(root, cfg.fraud, cfg.encoder, cfg.privacy, scorer, require_labels=require_labels)
    if cfg.fraud.merchant_risk_features:
        from fedfraud.training.merchant_risk.features import dataset_columns, with_merchant_columns

        encoder = getattr(scorer, "encoder_cfg", cfg.encoder)
        merchant = dataset_columns(root, encoder, cfg.privacy, cfg.merchant_risk, cfg.merchant_noise)
        banks = {b: with_merchant_columns(f, merchant[b], cfg.merchant_risk) for b, f in banks.items()}
    if "hin2vec" in cfg.fraud.extra_features:  # the stacked G-HIN2Vec embedding (fedfraud.training.embeddings)
        from fedfraud.training.embeddings.features import bank_embedding_columns, with_embeddings
        from fedfraud.training.embeddings.publish import load_hin2vec

        h2v = load_hin2vec(registry, cfg.fraud.hin2vec_version)
        encoder = getattr(scorer, "encoder_cfg", cfg.encoder)
        banks = {b: with_embeddings(f, bank_embedding_columns(root, b, h2v.model, encoder, cfg.privacy, cfg.egograph))
                 for b, f in banks.items()}
        hin2vec_tag = h2v.tag
    else:
        hin2vec_tag = None
    rows = sum(len(b) for b in banks.values())
    col = next(iter(banks.values())).names.index(ANOMALY_FEATURE)
    info: dict[str, Any] = {
        "data": str(data), "root": root, "rows": rows, "anomaly_model": tag,
        "frauds": int(sum(np.nansum(b.label) for b in banks.values())),
        "as_coverage": float(sum(np.isfinite(b.X[:, col]).sum() for b in banks.values()) / max(rows, 1)),
    }
    if hin2vec_tag is not None:  # the exact encoder: serving and batch scoring load this one, not `latest`
        info["hin2vec_model"] = hin2vec_tag
    return banks, info



def stacking_study(cfg: FedfraudConfig, data: Path, registry: Path, anomaly_version: str = "latest",
                   anomaly_source: str = "crossfit", controls: bool = True, with_bagging: bool = False,
                   seeds: int | None = None, reps: int | None = None, num_cpus: int = 2) -> StudyReport:
    """``fedfraud eval stacking``: Local / FL / Central and stacked scores, with cardholder-bootstrap intervals.

    ``anomaly_source``: ``crossfit`` (AS cross-fitted over cardholder folds with the default adapter of
    :mod:`fedfraud.training.fraud.stacking`), ``registry`` (the published anomaly model: in-sample on its own
    training cardholders, kept only for comparison) or ``none``.
    """
    from fedfraud.core.errors import UserError
    from fedfraud.training.fraud.dataset import anomaly_scores_for, bank_features
    from fedfraud.training.fraud.evaluate import run_study
    from fedfraud.training.fraud.stacking import (
        anomaly_fit_and_score,
        cardholder_folds,
        crossfit_anomaly_scores,
        permuted_within_bank,
        spend_ratio_fit_and_score,
    )

    if anomaly_source not in ("crossfit", "registry", "none"):
        raise UserError(f"--anomaly-score {anomaly_source!r}: choose crossfit, registry or none")
    fc = cfg.fraud
    seeds = fc.eval_seeds if seeds is None else seeds
    with ExitStack() as stack:
        root = stack.enter_context(materialize(data, cfg.ingest))
        frames = labelled_banks(root, data)
        ids = list(frames)
        banks = {b: bank_features(root, b, fc, cfg.encoder, cfg.privacy, None) for b in ids}
        folds = cardholder_folds({b: f["cardholder_id"].astype(str).to_numpy() for b, f in frames.items()},
                                 fc.stacking_folds, fc.seed)
        sources: dict[str, list[dict[int, np.ndarray]]] = {}
        as_note = "none"
        if anomaly_source == "crossfit":
            fit = anomaly_fit_and_score(cfg, rounds=fc.crossfit_anomaly_rounds)
            sources["AS"] = [crossfit_anomaly_scores(frames, folds, fit)]
            an = cfg.anomaly
            as_note = (f"cross-fitted over {fc.stacking_folds} cardholder folds, default adapter (anomaly readout "
                       f"{an.readout}, centralized, {fc.crossfit_anomaly_rounds} round(s) x {an.local_epochs} epochs x "
                       f"{an.samples_per_epoch} transitions per bank)")
        elif anomaly_source == "registry":
            from fedfraud.feature_store.privacy import PrivateFeaturizer
            from fedfraud.training.anomaly.scorer import AnomalyScorer

            scorer = AnomalyScorer.from_registry(registry, anomaly_version)
            tag = scorer.tag
            sources["AS"] = [{b: anomaly_scores_for(f, PrivateFeaturizer.for_bank(scorer.encoder_cfg, cfg.privacy, b),
                                                    scorer) for b, f in frames.items()}]
            as_note = f"published {tag} (NOT cross-fitted: in-sample on its training cardholders)"
        if "AS" in sources:
            finite = sum(int(np.isfinite(a).sum()) for a in sources["AS"][0].values())
            as_note += f"; AS coverage {finite / max(sum(len(f) for f in frames.values()), 1):.3f}"
        if controls:
            pos = crossfit_anomaly_scores(frames, folds, spend_ratio_fit_and_score)
            sources["Pos"] = [pos]
            sources["Perm"] = [permuted_within_bank(pos, fc.seed + k) for k in range(seeds)]
        rows = sum(len(b) for b in banks.values())
        manifest_shares = cfg.ingest.bank_shares
        info: dict[str, Any] = {
            "data": f"{data}" + (f" (bank shares {','.join(f'{s:g}' for s in manifest_shares)})"
                                 if manifest_shares and not Path(data).is_dir() else ""),
            "rows": rows, "as_source": as_note,
        }
        if cfg.ingest.skew is not None:
            from fedfraud.training.data.skew import describe_skew, skew_summary

            info["skew"] = describe_skew(skew_summary(root))
        names = next(iter(banks.values())).names
        # the positive control's base lacks the amount-velocity columns (amount_1h, amount_24h, amount_7d)
        ablate = tuple(n for n in names if n.startswith("amount_") and n[len("amount_"):][:1].isdigit())
        ablate = ablate if controls else ()
        # today's base next to the strong one (FL−prev, FL−prev+AS), on the same replicates: stacking before/after
        previous = tuple(n for n in names if n in PREVIOUS_FEATURES)
        return run_study(banks, fc, sources, seeds=seeds, reps=reps, with_bagging=with_bagging, ablate=ablate,
                         num_cpus=num_cpus, info=info, weaker_base=previous)


def _train_variant(cfg: FedfraudConfig, banks: dict[int, FraudFeatures], bank: int) -> FraudModel:
    from fedfraud.training.fraud.train import train_centralized, train_federated, train_local

    fc = cfg.fraud
    if fc.variant == "local":
        if bank not in banks:
            from fedfraud.core.errors import UserError

            raise UserError(f"--bank {bank} is not in the data (banks: {sorted(banks)})")
        return train_local(banks[bank], fc.use_anomaly_score, fc, bank)
    if fc.variant == "centralized":
        return train_centralized(banks, fc.use_anomaly_score, fc)
    if fc.variant == "federated-dp":
        from fedfraud.training.fraud.dp_boost import train_dp_model

        if len(banks) < 3:
            from fedfraud.core.errors import UserError

            raise UserError(f"--variant federated-dp needs at least 3 banks (SecAgg+ sums a majority of them); the "
                            f"data has {len(banks)}")

        return train_dp_model(banks, fc)
    if fc.variant == "federated-bagging":
        key = "as" if fc.use_anomaly_score else "base"
        return train_federated(banks, fc, (key,))[key]
    from fedfraud.training.fraud.federated.hist import HistJob, federated_hist_train

    extra = None
    if fc.use_anomaly_score:
        col = next(iter(banks.values())).names.index(ANOMALY_FEATURE)
        extra = {"AS": {b: d.X[:, col] for b, d in banks.items()}}
    job = HistJob("model", "AS" if fc.use_anomaly_score else None, fc.seed)
    return federated_hist_train(banks, fc, [job], extra_columns=extra, tls=fc.federated_tls,
                                timeout_s=fc.federated_timeout_s)["model"]


def _drift_reference(model: Any, banks: dict[int, FraudFeatures], bank: int, root: Path, days: float) -> Any:
    """Deciles of every input and of the fraud score on ``bank``'s own rows of the last ``days``, of cardholders
    held out of training (all banks' if it has none): what serving's drift gauges compare the live stream with.

    Recent rows only: counts and velocities grow with how long a card has been
    observed, so a reference that starts where the data starts would show drift
    by construction. The reference stays with the bank's model version.
    """
    from fedfraud.feature_store.layout import read_bank
    from fedfraud.training.retrain.drift import DriftReference

    ids = [bank] if bank in banks else sorted(banks)
    parts = []
    for b in ids:
        ts = read_bank(root, b, columns=["timestamp"])["timestamp"]  # FraudFeatures rows are in file order
        recent = (ts >= ts.max() - pd.Timedelta(days=days)).to_numpy()
        feats = banks[b]
        parts.append(FraudFeatures(feats.X[recent], feats.names, feats.transaction_id[recent],
                                   feats.cardholder[recent], feats.label[recent], feats.split[recent]))
    # held-out cardholders: the model's scores on its own training rows are more confident than live ones
    held_out = FraudFeatures.concat(parts).of_split("valid", "test")
    X = np.column_stack([held_out.X, model.scores(held_out.X)])
    return DriftReference.from_matrix([*held_out.names, "fraud_score"], X)


def _scenario_metrics(test: FraudFeatures, bank: np.ndarray, scores: np.ndarray, labels_root: Path
                      ) -> dict[str, float]:
    """Test ROC-AUC of each fraud scenario's frauds against every legitimate test row (the generator's labels)."""
    from fedfraud.training.data.scenarios import scenario_aucs, scenario_column

    rows = pd.DataFrame({"bank": bank, "transaction_id": test.transaction_id.astype(str), "is_fraud": test.label,
                         "fraud_score": scores})
    scenario = scenario_column(rows, labels_root, None)
    if scenario is None:
        return {}
    aucs = scenario_aucs(rows, ["fraud_score"], scenario)
    return {f"test_roc_auc_{name}": v["fraud_score"] for name, v in aucs.items()}


def train_and_publish(cfg: FedfraudConfig, data: Path, out: Path, bank: int = 0,
                      anomaly_version: str = "latest", labels_root: Path | None = None
                      ) -> tuple[ModelVersion, dict[str, Any]]:
    """``fedfraud train fraud``: train ``cfg.fraud.variant`` and publish it as kind ``fraud`` under ``out``.

    ``labels_root``: a generated dataset whose ``labels.parquet`` names each fraud's scenario; the card then
    carries the test ROC-AUC per scenario (``test_roc_auc_<scenario>``).
    The GNN variants (``fedavg-gnn``, ``fedrpda``) publish kind ``fraud-gnn`` (:mod:`fedfraud.training.fraud.gnn`);
    ``fed-spfd`` publishes ``bank``'s model as kind ``fraud-spfd`` (:mod:`fedfraud.training.fraud.spfd`).
    """
    if cfg.fraud.variant == "fed-spfd":  # heterogeneous banks: kind fraud-spfd, one model per serving bank
        from fedfraud.training.fraud.spfd.publish import train_and_publish_spfd

        with ExitStack() as stack:
            banks, info = load_fraud_banks(cfg, data, out, anomaly_version, stack, require_labels=True)
            return train_and_publish_spfd(cfg, banks, info, out, bank)
    if cfg.fraud.variant in ("fedavg-gnn", "fedrpda"):
        from fedfraud.training.fraud.gnn.publish import train_and_publish_gnn

        with ExitStack() as stack:  # the same inputs as the XGBoost model, then each bank's transaction graph
            banks, info = load_fraud_banks(cfg, data, out, anomaly_version, stack, require_labels=True)
            return train_and_publish_gnn(cfg, banks, info, out, bank)
    with ExitStack() as stack:
        banks, info = load_fraud_banks(cfg, data, out, anomaly_version, stack, require_labels=True)
        model = _train_variant(cfg, banks, bank)
        if cfg.fraud.variant == "federated-dp":  # reads no shared column, so it ships no bank's table either
            model.transitions = None
        elif bank in banks:  # serving computes the surprise with the publishing bank's own table, as its rows were
            model.transitions = banks[bank].transitions
        elif TRANSITION_FEATURE in model.used:
            from fedfraud.core.errors import UserError

            raise UserError(f"--bank {bank} is not in the data (banks: {sorted(banks)}): the fraud model ships that "
                            "bank's category-transition table, fitted on its training rows")
        scored_banks = sorted(banks) if cfg.fraud.variant != "local" else [bank]
        tests = [banks[b].of_split("test") for b in scored_banks]
        test = FraudFeatures.concat(tests)
        test_scores = model.scores(test.X)
        m = classification_metrics(test.label, test_scores, model.threshold, cfg.fraud.fpr_target)
        metrics: dict[str, Any] = {
            "test_f1": m.f1, "test_pr_auc": m.pr_auc, "test_recall_at_fpr": m.recall_at_fpr,
            "test_precision": m.precision, "test_recall": m.recall, "test_rows": m.n, "test_frauds": m.n_pos,
            "valid_f1": float(model.meta.get("valid_f1", float("nan"))), "threshold": model.threshold,
        }
        if labels_root is not None:
            bank_of = np.repeat(scored_banks, [len(t) for t in tests])
            metrics.update(_scenario_metrics(test, bank_of, test_scores, labels_root))
            if cfg.fraud.merchant_risk_features:  # the ablation: what the merchant columns add, same rows
                from fedfraud.training.fraud.train import train_centralized
                from fedfraud.training.merchant_risk.features import merchant_names

                drop = set(merchant_names(cfg.merchant_risk))
                keep = [i for i, n in enumerate(test.names) if n not in drop]
                strip = {b: dataclasses.replace(f, X=f.X[:, keep], names=tuple(f.names[i] for i in keep))
                         for b, f in banks.items()}
                for name, mdl in (("central", train_centralized(banks, cfg.fraud.use_anomaly_score, cfg.fraud)),
                                  ("central_without_merchant_risk",
                                   train_centralized(strip, cfg.fraud.use_anomaly_score, cfg.fraud))):
                    cols = keep if name.endswith("merchant_risk") else list(range(len(test.names)))
                    part = _scenario_metrics(test, bank_of, mdl.scores(test.X[:, cols]), labels_root)
                    metrics.update({f"{k}_{name}": v for k, v in part.items()})
        ldp = feature_ldp_card(cfg.privacy)
        privacy = {
            "inputs": f"noised L'/T' ({str(ldp['mechanism']).split(':', 1)[0]} mechanism, feature_ldp) + the bank's "
                      "own amount, MCC, timestamp and merchant bucket; AS from the federated anomaly model",
            "feature_ldp": ldp,
            "epsilon_range": [cfg.privacy.epsilon_min, cfg.privacy.epsilon_max], "delta": cfg.privacy.delta,
            "leaves_a_bank": (
                "federated (histogram): per-feature quantile sketches (bin boundaries), per-node gradient/hessian "
                "histograms summed by the server, training fraud/legit counts and validation score histograms; "
                "federated-bagging: XGBoost trees and validation score histograms; federated-dp: masked, noised "
                "candidate histograms, per-leaf gradient/hessian sums and validation score histograms (client_dp); "
                "never rows"
            ),
        }
        if cfg.fraud.merchant_risk_features:
            from fedfraud.training.merchant_risk.release import release_privacy_card

            privacy["merchant_risk_release"] = release_privacy_card(cfg.merchant_risk, cfg.merchant_noise, len(banks))
        if cfg.fraud.variant != "local" and bank in banks:
            # the bank's-eye figure: what joining the federation buys this bank on its own test cardholders
            from fedfraud.training.fraud.train import train_local

            own = banks[bank].of_split("test")
            if 0 < own.label.sum() < len(own):
                local = train_local(banks[bank], cfg.fraud.use_anomaly_score, cfg.fraud, bank)
                for name, mdl in (("federation", model), ("local", local)):
                    mm = classification_metrics(own.label, mdl.scores(own.X), mdl.threshold, cfg.fraud.fpr_target)
                    metrics[f"bank{bank}_{name}_pr_auc"] = mm.pr_auc
                    metrics[f"bank{bank}_{name}_recall_at_fpr"] = mm.recall_at_fpr
                metrics[f"bank{bank}_test_frauds"] = int(own.label.sum())
        config = {"fraud": cfg.fraud.model_dump(), "encoder": cfg.encoder.model_dump(),
                  "anomaly_model": info["anomaly_model"], "data": info["data"], "banks": sorted(banks)}
        if "hin2vec_model" in info:  # the exact encoder, read back by hin2vec_version_for (serving, batch scoring)
            from fedfraud.training.embeddings.features import HIN2VEC_MODEL_KEY

            config[HIN2VEC_MODEL_KEY] = info["hin2vec_model"]
        if cfg.fraud.merchant_risk_features:  # serving reads the same columns (serving.fraud_stage.merchant_risk_for)
            config["merchant_risk"] = cfg.merchant_risk.model_dump(mode="json")
            config["merchant_noise"] = cfg.merchant_noise.model_dump(mode="json")
        reference = _drift_reference(model, banks, bank, info["root"], cfg.retrain.drift_reference_days)
        files = {DRIFT_FILE: json.dumps(reference.to_json()).encode()}
        version = model.publish(ModelRegistry(out), config=config, metrics=metrics, privacy=privacy, files=files)
    logger.info("fraud_train published=%s variant=%s test_f1=%.4f test_pr_auc=%.4f", version.tag,
                cfg.fraud.variant, m.f1, m.pr_auc)
    return version, metrics

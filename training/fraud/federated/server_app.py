"""Fraud ServerApp: FedXgbBagging over the banks, one model per feature set, federated threshold.

Why bagging, not cyclic: in FedXgbCyclic one bank at a time boosts the whole
model, so a round costs one bank's turn and the ensemble drifts towards
whichever bank trained last (our banks are non-IID by design: different
regions, spend levels and fraud mixes); 5 banks need 5x the rounds for the
same number of trees. In FedXgbBagging every bank adds one tree per round to
the same global model in parallel, so all banks shape every round and a round
costs one round trip. Summing one tree per bank makes each round a step about
#banks times larger than centralized boosting, which ``federated_eta_scaling``
compensates by dividing eta by the number of banks.

Threshold: on the final round the strategy asks each bank for the histogram of
its validation scores (positives and negatives separately, ``threshold_bins``
bins); the server sums them and applies the same max-F1 rule as local training
(:func:`fedfraud.training.fraud.metrics.threshold_from_histograms`). Only counts leave
a bank, never scores of individual transactions.

Settings (kebab-case) come from :func:`build_server_app`. Results: a simulation passes ``on_result`` and
receives one :class:`FederatedFraudResult` per feature set in its own process (``run_simulation`` runs the
ServerApp in a thread of its caller); a deployed run (``flwr run``) sets ``result-dir`` and finds
``<feature-set>.model.json`` and ``<feature-set>.json`` there.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedXgbBagging

from fedfraud.training.fraud.config import FraudConfig
from fedfraud.training.fraud.metrics import threshold_from_histograms

__all__ = [
    "DEFAULT_SETTINGS",
    "FederatedFraudResult",
    "FinalRoundHistogramBagging",
    "app",
    "build_server_app",
    "threshold_from_replies",
]

log = logging.getLogger(__name__)


def threshold_from_replies(records: list[RecordDict], weighted_by_key: str) -> MetricRecord:
    """Sum the banks' validation histograms and pick the max-F1 threshold (a weighted mean would be meaningless)."""
    pos: np.ndarray | None = None
    neg: np.ndarray | None = None
    total = 0
    for rec in records:
        hist = rec["hist"]
        p, n = hist["pos"].numpy().astype(np.int64), hist["neg"].numpy().astype(np.int64)
        pos = p if pos is None else pos + p
        neg = n if neg is None else neg + n
        total += int(next(iter(rec.metric_records.values()))[weighted_by_key])  # type: ignore[call-overload]
    if pos is None or neg is None:
        return MetricRecord({})
    threshold, f1 = threshold_from_histograms(pos, neg)
    return MetricRecord(
        {weighted_by_key: total, "threshold": threshold, "valid-f1": f1, "valid-frauds": int(pos.sum())}
    )


class FinalRoundHistogramBagging(FedXgbBagging):
    """FedXgbBagging that evaluates only after the last round (histograms for the threshold)."""

    def __init__(self, num_rounds: int, **kwargs: Any) -> None:
        super().__init__(evaluate_metrics_aggr_fn=threshold_from_replies, **kwargs)
        self.num_rounds = num_rounds

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        if server_round < self.num_rounds:
            return []
        return super().configure_evaluate(server_round, arrays, config, grid)


@dataclass(frozen=True)
class FederatedFraudResult:
    """One feature set's global model (XGBoost JSON bytes) and the threshold the banks' histograms chose."""

    feature_set: str
    model: bytes
    threshold: float
    valid_f1: float
    rounds: int
    banks: int
    valid_rows: int
    seconds: float

    def save(self, folder: Path) -> None:
        """``<feature-set>.model.json`` and ``<feature-set>.json``: what a deployed run leaves its operator."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{self.feature_set}.model.json").write_bytes(self.model)
        info = {k: v for k, v in asdict(self).items() if k not in ("model", "feature_set")}
        (folder / f"{self.feature_set}.json").write_text(json.dumps(info), encoding="utf-8")


def _feature_sets(value: Any) -> list[str]:
    """A list (simulation settings) or a comma-separated string (a run config holds no lists)."""
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(v) for v in value]


def build_server_app(
    settings: dict[str, Any], on_result: Callable[[dict[str, FederatedFraudResult]], None] | None = None
) -> ServerApp:
    """A ServerApp that trains one global model per entry of ``settings["feature-sets"]``.

    ``on_result`` receives the models in the caller's process (simulation); a non-empty ``result-dir`` setting
    also saves them there (deployment, where the ServerApp runs in another process).
    """
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        s = {**settings, **dict(context.run_config)}
        nodes = int(s["num-supernodes"])
        rounds = int(s["num-rounds"])
        results: dict[str, FederatedFraudResult] = {}
        for feature_set in _feature_sets(s["feature-sets"]):
            use_as = feature_set == "as"
            config = ConfigRecord({
                "features-dir": str(s["features-dir"]),
                "fraud-config": str(s["fraud-config"]) or FraudConfig().model_dump_json(),
                "use-anomaly-score": use_as,
                "eta": float(s["eta"]),
                "threshold-bins": int(s["threshold-bins"]),
            })
            strategy = FinalRoundHistogramBagging(
                rounds, min_train_nodes=nodes, min_evaluate_nodes=nodes, min_available_nodes=nodes,
            )
            started = time.perf_counter()
            result = strategy.start(
                grid=grid,
                initial_arrays=ArrayRecord([np.frombuffer(b"", dtype=np.uint8)]),
                num_rounds=rounds,
                train_config=config,
                evaluate_config=config,
            )
            final = result.evaluate_metrics_clientapp.get(rounds)
            if final is None or "threshold" not in final:
                raise RuntimeError("no validation histograms came back from the banks")
            done = FederatedFraudResult(
                feature_set=feature_set, model=result.arrays["0"].numpy().tobytes(),
                threshold=float(final["threshold"]), valid_f1=float(final["valid-f1"]),  # type: ignore[arg-type]
                rounds=rounds, banks=nodes, valid_rows=int(final["num-examples"]),  # type: ignore[call-overload]
                seconds=time.perf_counter() - started,
            )
            results[feature_set] = done
            if str(s["result-dir"]):
                done.save(Path(str(s["result-dir"])))
            log.info("fraud_federated feature_set=%s rounds=%d threshold=%.4f valid_f1=%.4f seconds=%.1f",
                     feature_set, rounds, done.threshold, done.valid_f1, done.seconds)
        if on_result is not None:
            on_result(results)

    return app


#: Settings of ``flwr run`` on a deployed federation (``apps/fraud/pyproject.toml`` and ``--run-config``
#: override them). ``features-dir`` is unused there: each SuperNode reads ``fraud-features.npz`` of its own
#: ``data-dir``.
DEFAULT_SETTINGS: dict[str, Any] = {
    "features-dir": "",
    "result-dir": "artifacts/fraud-federated",
    "fraud-config": "",  # FraudConfig as JSON; "" = its defaults
    "feature-sets": "base,as",
    "num-supernodes": 3,
    "num-rounds": FraudConfig().federated_rounds,
    "eta": FraudConfig().eta,
    "threshold-bins": FraudConfig().threshold_bins,
}

#: The app ``flwr run apps/fraud <connection>`` loads (the simulation builds its own with :func:`build_server_app`).
app = build_server_app(DEFAULT_SETTINGS)

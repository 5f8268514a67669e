"""Real Flower simulations on Ray (2 banks): a 1-round run, then a resumed 2nd round; what the server receives.

Two simulations for the whole module (Flower + Ray start-up dominates); the
tests inspect their outputs.
"""

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from fedfraud.training.anomaly.run import Checkpoint, checkpoint_dir
from fedfraud.training.anomaly.scorer import AnomalyScorer
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.feature_store.layout import bank_dir
from fedfraud.training.data.synthetic import generate_dataset
from fedfraud.training.anomaly.centralized import run_centralized
from fedfraud.training.anomaly.federated.task import RunSettings, build_model
from fedfraud.training.anomaly.federated.trainer import run_federated
from fedfraud.training.registry import ModelRegistry
from tests.integration.tiny_run import TINY_RUN

pytestmark = pytest.mark.integration

SMALL = {
    **TINY_RUN,
    "pooling": "sag",
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fed")
    data, out = root / "data", root / "artifacts"
    generate_dataset(
        data, GeneratorConfig(banks=2, cardholders=16, days=21, fraud_rate=0.03, seed=6), raw_csv=False, progress=False
    )
    seen: dict[str, list] = {"first": [], "resumed": []}
    flat = {**SMALL, "data-dir": str(data), "out-dir": str(out)}
    first = run_federated(
        RunSettings.from_flat({**flat, "rounds": 1}),
        observer=lambda kind, rnd, replies: seen["first"].append((kind, rnd, replies)),
    )
    after_first = Checkpoint.load(checkpoint_dir(out, "federated"))
    resumed = run_federated(
        RunSettings.from_flat({**flat, "rounds": 2, "resume": True}),
        observer=lambda kind, rnd, replies: seen["resumed"].append((kind, rnd, replies)),
    )
    return {
        "data": data,
        "out": out,
        "first": first,
        "resumed": resumed,
        "seen": seen,
        "after_first": after_first,
        "settings": RunSettings.from_flat(flat),
    }


def test_rounds_produce_metrics_and_loss(runs):
    first = runs["first"]
    assert first.rounds == 1 and first.banks == 2
    # next-event readout: the test loss and, for model selection, the validation loss of every bank
    assert math.isfinite(first.summary["loss_mean"]) and "val_loss_mean" in first.summary
    history = Checkpoint.load(checkpoint_dir(runs["out"], "federated")).history
    assert [r.round for r in history] == [1, 2]
    assert set(history[0].per_bank) == {0, 1}
    # local training lowered the banks' loss within the round (mean over banks: one bank's two short
    # epochs on a few dozen samples can tie)
    for kind, _, replies in runs["seen"]["first"]:
        if kind == "train":
            metrics = [r.content["metrics"] for r in replies]
            assert np.mean([m["train-loss"] for m in metrics]) < np.mean([m["train-loss-first"] for m in metrics])
    # the last round evaluates against real fraud labels
    assert "fraud_roc_auc_mean" in runs["resumed"].summary


def test_resume_continues_from_checkpoint(runs):
    assert runs["after_first"].round == 1
    rounds_seen = sorted({rnd for _, rnd, _ in runs["seen"]["resumed"]})
    assert rounds_seen == [2]  # round 1 was not redone
    final = Checkpoint.load(checkpoint_dir(runs["out"], "federated"))
    assert final.round == 2
    assert json.dumps(final.history[0].to_json()) == json.dumps(runs["after_first"].history[0].to_json())
    assert runs["resumed"].rounds == 2 and runs["resumed"].version == "anomaly:v2"


def test_server_receives_only_parameters_and_scalar_metrics(runs):
    expected = {k: v.shape for k, v in build_model(runs["settings"]).state_dict().items()}
    raw = set()
    for bank in (0, 1):
        frame = pd.read_parquet(bank_dir(runs["data"], bank) / "transactions.parquet")
        raw |= set(frame["lat"].astype(np.float32).tolist()) | set(frame["lon"].astype(np.float32).tolist())
        epoch = frame["timestamp"].astype("int64") // 1_000_000
        raw |= set(epoch.astype(np.float32).tolist())
    raw_arr = np.array(sorted(raw), dtype=np.float32)
    replies = [(kind, r) for run in runs["seen"].values() for kind, _, rs in run for r in rs]
    assert len(replies) == 8  # 2 rounds × (train + evaluate) × 2 banks
    for kind, reply in replies:
        assert not reply.has_error()
        content = reply.content
        assert set(content.keys()) == ({"arrays", "metrics"} if kind == "train" else {"metrics"})
        assert not content.config_records
        for value in content["metrics"].values():
            assert isinstance(value, int | float)
            assert not np.isin(np.float32(value), raw_arr) or value in (0, 1)
        if kind == "train":
            state = content["arrays"].to_torch_state_dict()
            assert {k: v.shape for k, v in state.items()} == expected
            values = torch.cat([v.reshape(-1).float() for v in state.values()]).numpy()
            assert not np.isin(values, raw_arr).any()


def test_published_model_loads_and_scores(runs):
    # the resumed run's version by its tag: in random order the centralized test may have published a later one
    tag = runs["resumed"].version
    version = ModelRegistry(runs["out"]).get("anomaly", tag.rsplit(":", 1)[-1])
    assert set(version.privacy["mu_gdp_per_bank"]) == {"0", "1"}
    assert version.metrics["rounds"] == 2 and version.config["mode"] == "federated"
    scorer = AnomalyScorer.from_registry(runs["out"], tag.rsplit(":", 1)[-1])
    checkpoint = Checkpoint.load(checkpoint_dir(runs["out"], "federated"))
    selected, state = checkpoint.selected  # the round with the lowest validation loss, not necessarily the last
    assert version.metrics["selected_round"] == selected in (1, 2)
    # the card's figures are the published weights' own: every round scores the test cardholders' frauds, and the
    # metrics and card text come from the selected round's record, not the last one's
    chosen = next(r for r in checkpoint.history if r.round == selected)
    assert all("fraud_roc_auc_mean" in r.summary for r in checkpoint.history)
    assert {k: version.metrics[k] for k in chosen.summary} == pytest.approx(chosen.summary, nan_ok=True)
    assert f"round {selected} of 2" in version.model_card
    for k, v in scorer.model.state_dict().items():
        assert torch.equal(v.cpu(), state[k])


def test_centralized_upper_bound_runs(runs):
    settings = RunSettings.from_flat({**runs["settings"].to_flat(), "rounds": 1, "local-epochs": 2})
    result = run_centralized(settings, threads=1)
    assert result.mode == "centralized" and result.rounds == 1
    assert math.isfinite(result.summary["loss_mean"]) and result.version is not None


def test_the_server_cannot_name_the_merchants_a_bank_trained_on(runs):
    """The merchant table gets sparse updates: a bank's reply changes only the rows its batches touched. With the
    public unkeyed hash the server could name those merchants; under the federation's key it cannot.
    """
    from fedfraud.feature_store.encoders import merchant_bucket
    from fedfraud.feature_store.privacy import PrivateFeaturizer

    settings = runs["settings"]
    initial = build_model(settings).state_dict()["encoder.merchant.weight"]
    buckets = initial.shape[0]
    checked = 0
    for kind, rnd, replies in runs["seen"]["first"]:
        if kind != "train" or rnd != 1:
            continue
        for reply in replies:  # the real message a bank sent
            bank = int(reply.content["metrics"]["partition-id"])
            table = reply.content["arrays"].to_torch_state_dict()["encoder.merchant.weight"]
            changed = set(np.flatnonzero((table != initial).any(dim=1).numpy()).tolist())
            merchants = pd.read_parquet(bank_dir(runs["data"], bank) / "transactions.parquet")["merchant_id"].unique()
            featurizer = PrivateFeaturizer.for_bank(settings.encoder, settings.privacy, bank)
            keyed = set(featurizer.merchant(merchants).tolist())
            public = set(merchant_bucket(merchants, settings.encoder).tolist())  # what the server can compute
            assert changed and changed <= keyed  # the bank's own rows moved, nothing else
            chance = len(public) / buckets
            hit = len(changed & public) / len(changed)
            assert hit < chance + 0.25, f"{hit:.0%} of the moved rows are public-hash rows of the bank's merchants"
            checked += 1
    assert checked == 2

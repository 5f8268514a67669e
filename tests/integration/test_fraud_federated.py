"""Fraud model end to end.

* histogram federation (real ``xgboost.federated`` server + one worker process per bank, mutual TLS)
  builds the centralized model's trees: same predictions to 1e-6 on integer features;
* what leaves a bank, read off the real gRPC requests by a recording proxy between one bank and the server;
* ``eval stacking`` on a Sparkov-layout CSV prints the study tables; CLI errors are one line.
"""

import numpy as np
import pandas as pd
import pytest
import torch

from fedfraud.cli.app import main
from fedfraud.feature_store.config import EgoGraphConfig, EncoderConfig, PrivacyConfig
from fedfraud.training.anomaly.config import AnomalyConfig
from fedfraud.training.anomaly.model import AnomalyModel
from fedfraud.training.anomaly.scorer import publish_anomaly_model
from fedfraud.training.data.config import GeneratorConfig, IngestConfig
from fedfraud.training.data.ingest import ingest_csv
from fedfraud.training.data.synthetic import RAW_CSV, generate_dataset
from fedfraud.training.fraud.config import FraudConfig
from fedfraud.training.anomaly.scorer import AnomalyScorer
from fedfraud.training.fraud.dataset import bank_features
from fedfraud.training.fraud.features import FraudFeatures
from fedfraud.training.fraud.federated.hist import HistJob, federated_hist_train
from fedfraud.training.fraud.federated.wire import RecordingProxy
from fedfraud.training.fraud.model import FraudModel
from fedfraud.training.fraud.train import train_centralized
from fedfraud.training.registry import ModelRegistry

pytestmark = pytest.mark.integration

FAST = ["--set", "fraud.num_boost_round=20", "--set", "fraud.threshold_bins=200"]
NAMES = ("f0", "f1", "f2", "anomaly_score")


def _integer_banks(sizes, levels=6, seed=0):
    """Banks whose features take ``levels`` (< max_bin) distinct values, so the merged sketch is exact."""
    rng = np.random.default_rng(seed)
    banks = {}
    for b, n in enumerate(sizes):
        X = rng.integers(0, levels, size=(n, len(NAMES))).astype(np.float32)
        y = (rng.random(n) < 0.03 + 0.05 * X[:, 0] + 0.04 * (X[:, 1] == b)).astype(np.float32)
        split = np.where(rng.random(n) < 0.2, "valid", "train").astype(object)
        ids = np.asarray([f"b{b}-{i}" for i in range(n)], dtype=object)
        banks[b] = FraudFeatures(X, NAMES, ids, ids, y, split)
    return banks


def test_histogram_federation_equals_centralized():
    cfg = FraudConfig(num_boost_round=12, max_depth=3, nthread=1, threshold_bins=100)
    banks = _integer_banks((700, 500, 300))
    fl = federated_hist_train(banks, cfg, [HistJob("base"), HistJob("as", "score")], tls=True, timeout_s=180,
                              extra_columns={"score": {b: d.X[:, 3] for b, d in banks.items()}})
    X = np.concatenate([d.X for d in banks.values()])
    for key, use_as in (("base", False), ("as", True)):
        central = train_centralized(banks, use_as, cfg)
        assert fl[key].uses_anomaly_score is use_as and fl[key].meta["tls"] is True
        np.testing.assert_allclose(fl[key].scores(X), central.scores(X), rtol=0, atol=1e-6)
        assert fl[key].booster.get_dump() == central.booster.get_dump()  # the very same trees
        # federated threshold: the lower edge of the max-F1 bin of the summed validation histograms
        assert abs(fl[key].threshold - central.threshold) <= 1 / cfg.threshold_bins


def test_what_leaves_a_bank_on_the_wire(free_port):
    """Bank 0's every request to the server, decoded: control values, quantile sketch, per-node gradient
    histograms, our two sums; nothing per row. Plaintext so the proxy can read it (TLS hides it in production).
    """
    levels, depth = 5, 2
    cfg = FraudConfig(num_boost_round=2, max_depth=depth, nthread=1, threshold_bins=10)
    banks = _integer_banks((3000, 2000), levels=levels, seed=1)
    proxy = RecordingProxy(free_port)
    try:
        federated_hist_train(banks, cfg, [HistJob("base")], tls=False, timeout_s=180, port=free_port,
                             worker_address={0: f"127.0.0.1:{proxy.port}"})
    finally:
        proxy.close()
    messages = proxy.messages()
    buffers = [m.send_buffer for m in messages]
    train = banks[0].of_split("train")
    n_features, total_bins = 3, 3 * levels
    assert len(messages) > 10
    # 1. nothing row-sized: the largest buffer is far below one float per training row, and no id is sent
    assert max(len(b) for b in buffers) <= 16 * total_bins * 2 < 4 * len(train)
    assert b"b0-" not in bytes(proxy.sent)
    # 2. our global class counts (for scale_pos_weight) as two doubles
    pos, neg = float(train.label.sum()), float((train.label == 0).sum())
    assert any(len(b) == 16 and np.array_equal(np.frombuffer(b, "<f8"), [pos, neg]) for b in buffers)
    # 3. the root gradient histogram of the first tree: per (feature, bin) Σ w(p − y) and Σ w p(1 − p), p = 0.5
    pos_all = sum(float(d.of_split("train").label.sum()) for d in banks.values())
    neg_all = sum(float((d.of_split("train").label == 0).sum()) for d in banks.values())
    spw = min(max(neg_all / pos_all, 1.0), cfg.max_scale_pos_weight)
    w = np.where(train.label == 1, spw, 1.0)
    expected = np.zeros((total_bins, 2))
    for f in range(n_features):
        for v in range(levels):
            rows = train.X[:, f] == v
            expected[f * levels + v] = [np.sum(w[rows] * (0.5 - train.label[rows])), np.sum(w[rows] * 0.25)]
    histograms = [np.frombuffer(b, "<f8").reshape(-1, 2) for b in buffers if len(b) == 16 * total_bins]
    # gradients are float32 per row, summed in float64: equal to float32 precision
    assert histograms and np.allclose(histograms[0], expected, rtol=1e-5, atol=1e-4)
    # ... which is what it reveals: the bank's count of frauds and of legit rows per (feature, value)
    grad, hess = histograms[0][:, 0], histograms[0][:, 1]
    frauds = (hess / 0.25 - 2 * grad) / (2 * spw)  # from H = (n_neg + spw n_pos)/4 and G = (n_neg − spw n_pos)/2
    true_frauds = [np.sum(train.label[train.X[:, f] == v]) for f in range(n_features) for v in range(levels)]
    assert np.allclose(frauds, true_frauds, atol=1e-3)
    # 4. the quantile sketch (float32 summaries) carries the feature values: the bin boundaries
    sketch = [np.frombuffer(b, "<f4") for m, b in zip(messages, buffers, strict=True) if m.fields.get(4) == 1]
    assert sketch and set(range(levels)) <= set(np.concatenate(sketch).tolist())
    # 5. per node histograms only: at most one per node of each tree, plus the validation histograms (int64)
    assert len(histograms) <= cfg.num_boost_round * (2**depth - 1)
    valid_hist = [np.frombuffer(b, "<i8") for b in buffers if len(b) == 8 * 2 * cfg.threshold_bins]
    assert valid_hist and valid_hist[-1].sum() == int(np.sum(banks[0].split == "valid"))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("fraud")
    data = root / "data"
    generate_dataset(data, GeneratorConfig(banks=2, cardholders=60, days=15, seed=11, fraud_rate=0.03), raw_csv=True,
                     progress=False)
    registry = root / "artifacts"
    torch.manual_seed(0)
    acfg, ego = AnomalyConfig(pooling="topk", layers=2, hidden=16, disc_hidden=16), EgoGraphConfig()
    model = AnomalyModel(acfg, EncoderConfig(), ego.max_nodes)  # untrained but the real architecture and scorer
    publish_anomaly_model(ModelRegistry(registry), model.state_dict(), anomaly_cfg=acfg, encoder_cfg=EncoderConfig(),
                          ego_cfg=ego, config={}, metrics={}, privacy={}, card="test model")
    return {"root": root, "data": data, "csv": data / RAW_CSV, "registry": registry}


def test_eval_stacking_on_sparkov_csv(world, capsys):
    code = main(["--log-level", "WARNING", *FAST, "eval", "stacking", "--data", str(world["csv"]),
                 "--format", "sparkov", "--bank-shares", "0.7,0.3", "--registry", str(world["registry"]),
                 "--anomaly-score", "registry", "--seeds", "2", "--reps", "50"])
    out = capsys.readouterr().out
    assert code == 0, out
    for title in ("**Pooled over all banks' test cardholders**", "**Differences, pooled**", "**Bank's-eye view**",
                  "| FL − Local |", "| FL+AS − FL |", "| FL+Pos − FL |", "| FL+Perm − FL |", "**Targets**",
                  "| FL−prev+AS − FL−prev |", "| FL − FL−prev |", "issue 34: over the strong base",
                  "test frauds=", "mutual TLS", "anomaly:v1 (NOT cross-fitted"):
        assert title in out, title
    rows = [line for line in out.splitlines() if line.startswith("| 0 |") or line.startswith("| 1 |")]
    assert len(rows) == 2  # the bank's-eye table


def test_csv_without_labels_is_one_line_error(world, tmp_path, capsys):
    raw = pd.read_csv(world["csv"], sep="|", dtype=str, keep_default_na=False)
    unlabelled = tmp_path / "unlabelled.csv"
    raw.drop(columns=["is_fraud"]).to_csv(unlabelled, sep="|", index=False)
    code = main(["--log-level", "ERROR", "eval", "stacking", "--data", str(unlabelled),
                 "--registry", str(world["registry"]), "--anomaly-score", "none"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: evaluation needs labels")
    # ... but scoring unlabelled transactions works, with the default (histogram-federated) variant
    assert main(["--log-level", "WARNING", *FAST, "train", "fraud", "--data", str(world["data"]), "--out",
                 str(world["registry"])]) == 0
    ingested = tmp_path / "ingested"
    ingest_csv(unlabelled, ingested, IngestConfig(banks=2), progress=False)
    scorer = AnomalyScorer.from_registry(world["registry"])
    feats = bank_features(ingested, 0, FraudConfig(), EncoderConfig(), PrivacyConfig(), scorer)
    assert not feats.has_labels and np.isfinite(feats.X[:, -1]).mean() > 0.5
    model = FraudModel.from_registry(world["registry"])
    assert model.variant == "federated" and model.meta["protocol"] == "xgboost-federated-hist"
    # the published model ships bank 0's own category-transition table, fitted on its training rows
    labelled = bank_features(world["data"], 0, FraudConfig(), EncoderConfig(), PrivacyConfig(), scorer)
    assert model.transitions is not None and model.transitions == labelled.transitions
    assert "mcc_transition_surprise" in model.used
    # the model reads the merchant-risk columns after the row (the releases replayed over the scored data, as
    # `fedfraud score` does); unlabelled rows make releases with no fraud in them
    from fedfraud.serving.fraud_stage import merchant_risk_for
    from fedfraud.training.merchant_risk.config import MerchantNoiseConfig
    from fedfraud.training.merchant_risk.features import dataset_columns

    config = ModelRegistry(world["registry"]).get("fraud", "latest").config
    risk = merchant_risk_for(config)
    assert risk is not None
    merchant = dataset_columns(ingested, EncoderConfig(), PrivacyConfig(), risk,
                               MerchantNoiseConfig.model_validate(config["merchant_noise"]))[0]
    decisions = model.predict_batch(np.hstack([feats.X, merchant])[:25])
    assert len(decisions) == 25 and all(0 <= d.score <= 1 and len(d.top_reasons) == 3 for d in decisions)


def test_bad_anomaly_source_and_missing_model_are_one_line_errors(world, tmp_path, capsys):
    code = main(["--log-level", "ERROR", "eval", "stacking", "--data", str(world["data"]),
                 "--anomaly-score", "magic"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: --anomaly-score")
    code = main(["--log-level", "ERROR", "eval", "stacking", "--data", str(world["data"]),
                 "--registry", str(tmp_path / "empty"), "--anomaly-score", "registry"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "fedfraud train anomaly" in err[0]


def test_dp_variant_publishes_its_cardholder_epsilon_on_the_card(world, tmp_path, capsys):
    """``--variant federated-dp`` end to end from the generator's CSV split over 3 banks: the published model's
    card states its (ε, δ) per cardholder, and the model scores through the same code as the default."""
    import shutil

    registry = tmp_path / "registry"
    shutil.copytree(world["registry"], registry)
    assert main(["--log-level", "WARNING", "--set", "ingest.format=sparkov", "--set", "ingest.banks=3",
                 "--set", "fraud.dp.trees=6", "--set", "fraud.dp.epsilon=4", "train", "fraud", "--data",
                 str(world["csv"]), "--out", str(registry), "--variant", "federated-dp"]) == 0
    version = ModelRegistry(registry).get("fraud", "latest")
    dp = version.privacy["client_dp"]
    assert dp["dp"] == "on" and dp["epsilon"] <= 4 * (1 + 1e-3) and dp["releases"] == 8 and dp["banks"] == 3
    assert dp["noise_source"] == "OS entropy"
    assert version.privacy["formal_guarantee"].startswith("(4.00, 1e-05)-DP per training cardholder")
    assert version.privacy["client_dp"]["epsilon_validation_cardholders"] <= 4 * (1 + 1e-3)
    assert "(4.00, 1e-05)-DP per training cardholder" in (version.path / "MODEL_CARD.md").read_text(encoding="utf-8")
    model = FraudModel.from_registry(registry)
    assert model.variant == "federated-dp" and len(model.booster.get_dump()) == 6
    # only the cardholder's own history: no column computed from other cardholders, no bank's transition table
    assert "anomaly_score" not in model.used and "mcc_transition_surprise" not in model.used
    assert not any(n.startswith(("merchant_bank_", "merchant_fed_")) for n in model.used)
    assert model.transitions is None and dp["columns"] == list(model.used)
    # two banks cannot run SecAgg+: one line, nothing published
    assert main(["--log-level", "WARNING", "train", "fraud", "--data", str(world["data"]), "--out", str(registry),
                 "--variant", "federated-dp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "error: --variant federated-dp needs at least 3 banks (SecAgg+ sums a majority of them); " \
        "the data has 2"
    assert ModelRegistry(registry).get("fraud", "latest").version == version.version


# a whole Flower simulation on Ray (~17 s) for a variant kept for comparison only: `make test-long` (CI)
@pytest.mark.slow
@pytest.mark.long
def test_bagging_variant_is_still_selectable(world):
    assert main(["--log-level", "WARNING", *FAST, "train", "fraud", "--data", str(world["data"]), "--out",
                 str(world["registry"]), "--variant", "federated-bagging", "--rounds", "3"]) == 0
    model = FraudModel.from_registry(world["registry"])
    assert model.variant == "federated" and model.meta["rounds"] == 3 and "protocol" not in model.meta


def test_default_anomaly_adapter_crossfits_with_the_anomaly_api(world):
    from fedfraud.config import load_config
    from fedfraud.feature_store.layout import list_banks, read_bank
    from fedfraud.training.fraud.stacking import anomaly_fit_and_score, cardholder_folds, crossfit_anomaly_scores

    frames = {b: read_bank(world["data"], b) for b in list_banks(world["data"])}
    # a fold seed whose complement folds keep train and test cardholders in both tiny banks
    folds = cardholder_folds({b: f["cardholder_id"].to_numpy() for b, f in frames.items()}, k=2, seed=1)
    small = load_config(None, ["anomaly.local_epochs=1", "anomaly.samples_per_epoch=64"])  # a test-sized budget
    scores = crossfit_anomaly_scores(frames, folds, anomaly_fit_and_score(small, rounds=1))
    for b, f in frames.items():
        s = scores[b]
        assert s.shape == (len(f),) and np.isfinite(s).mean() > 0.5
        assert np.nanmin(s) >= 0 and np.nanmax(s) <= 1  # AS in [0, 1)


def test_server_refuses_a_bank_with_an_untrusted_certificate(tmp_path, free_port):
    """Mutual TLS is enforced: the server fails the TLS handshake of a worker whose client certificate it does not
    trust (gRPC logs it on the server's side; the worker keeps retrying and produces no model), and the same
    server then trains with a worker that holds the trusted certificate."""
    import json
    import subprocess
    import sys
    import time

    from fedfraud.core.net import wait_for_port
    from fedfraud.training.fraud.federated.hist import _child_env, make_tls_files
    from fedfraud.training.fraud.model import xgb_params

    good, bad = make_tls_files(tmp_path / "a"), make_tls_files(tmp_path / "b")
    banks = _integer_banks((200,))
    np.savez(tmp_path / "rank_0.npz", X=banks[0].X, label=banks[0].label, split=banks[0].split.astype(str),
             names=np.asarray(NAMES))
    env = {**_child_env(), "GRPC_VERBOSITY": "ERROR"}  # gRPC's default: handshake failures are logged
    server_log = tmp_path / "server.log"
    with open(server_log, "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "fedfraud.training.fraud.federated.hist", "server", "--port", str(free_port),
             "--world", "1", "--timeout", "60", "--server-key", str(good.server_key), "--server-cert",
             str(good.server_cert), "--client-cert", str(good.client_cert)], env=env, stdout=log,
            stderr=subprocess.STDOUT)

    def worker(name: str, files) -> subprocess.Popen:
        spec = {"rank": 0, "world": 1, "address": f"localhost:{free_port}", "data": str(tmp_path / "rank_0.npz"),
                "out": str(tmp_path / name), "params": {**xgb_params(FraudConfig(), 1.0), "nthread": 1},
                "rounds": 2, "cap": 200.0, "bins": 10, "jobs": [{"name": "m", "as_key": None, "seed": 1, "drop": []}],
                "tls": {"server_cert": str(good.server_cert), "client_key": str(files.client_key),
                        "client_cert": str(files.client_cert)}}
        (tmp_path / name).mkdir()
        (tmp_path / f"{name}.json").write_text(json.dumps(spec), encoding="utf-8")
        return subprocess.Popen([sys.executable, "-m", "fedfraud.training.fraud.federated.hist", "worker",
                                 str(tmp_path / f"{name}.json")], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)

    try:
        wait_for_port(free_port, server, "federated XGBoost server", timeout_s=30)
        untrusted = worker("untrusted", bad)
        try:
            deadline = time.monotonic() + 60  # the refusal shows within seconds of the worker's start
            while b"CERTIFICATE_VERIFY_FAILED" not in server_log.read_bytes():
                assert time.monotonic() < deadline, server_log.read_text(errors="replace")[-2000:]
                assert untrusted.poll() is None or untrusted.returncode != 0
                time.sleep(0.2)
            assert untrusted.poll() is None or untrusted.returncode != 0  # refused, still retrying (or failed)
        finally:
            untrusted.kill()
            untrusted.wait()
        assert not (tmp_path / "untrusted" / "rank_0.m.json").exists()
        # the server was refusing that certificate, not every bank: a trusted worker joins and trains
        trusted = worker("trusted", good)
        assert trusted.wait(timeout=60) == 0
        assert (tmp_path / "trusted" / "rank_0.m.json").exists()
    finally:
        server.kill()
        server.wait()

"""A real Flower Deployment Engine federation on this machine: a SuperLink and 3 SuperNodes as processes.

One federation for the module (TLS, SuperNode authentication, per-bank keys from
``generate_federation_files``). Each SuperNode is given only its own bank's
folder. The anomaly app (the repository's Flower app) and the federated fraud app
(``apps/fraud``: FedXgbBagging) each run 2 rounds through ``flwr run`` (``-m long``). A SuperNode whose
key is not registered and a plaintext SuperNode are refused by a SuperLink of the same kind (TLS, SuperNode
authentication, bank 0's key registered) that runs without the banks' SuperNodes: a refusal needs none.
Flower starts one process per message (import of torch and PyG each time), so
the long tests take minutes, not seconds.
"""

from __future__ import annotations

import http.client
import json
import ssl
import subprocess
import tomllib
from pathlib import Path

import numpy as np
import pytest

from fedfraud.feature_store.layout import bank_dir
from fedfraud.core.pki import write_ssh_key_pair
from fedfraud.training.data.config import GeneratorConfig
from fedfraud.training.data.synthetic import generate_dataset
from fedfraud.training.fraud.config import FraudConfig
from fedfraud.training.fraud.features import FraudFeatures
from fedfraud.training.fraud.federated.task import NODE_FEATURES_FILE
from tests.integration.test_federated_anomaly import SMALL as SIMULATION_SMALL
from fedfraud.training.federated.deployment import Federation, flwr_env, generate_federation_files, run_app
from fedfraud.training.federated.ledger import PrivacyLedger
from fedfraud.training.registry import ModelRegistry
from tests.unit.test_anomaly_dp_app import training_cardholders

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BANKS = [0, 1, 2]
# the simulation test's tiny model, less what is not a Flower app setting (Ray's resources)
APP_KEYS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
SMALL = {k: v for k, v in SIMULATION_SMALL.items() if k in APP_KEYS} | {"local-epochs": 1}
NAMES = ("f0", "f1", "f2", "anomaly_score")


def _fraud_features(bank: int, n: int, seed: int) -> FraudFeatures:
    rng = np.random.default_rng(seed)
    X = rng.integers(0, 6, size=(n, len(NAMES))).astype(np.float32)
    y = (rng.random(n) < 0.05 + 0.05 * X[:, 0]).astype(np.float32)
    split = np.where(rng.random(n) < 0.25, "valid", "train").astype(object)
    ids = np.asarray([f"b{bank}-{i}" for i in range(n)], dtype=object)
    return FraudFeatures(X, NAMES, ids, ids, y, split)


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    root = tmp_path_factory.mktemp("federation")
    data = root / "data"
    generate_dataset(data, GeneratorConfig(banks=3, cardholders=60, days=21, fraud_rate=0.03, seed=6),
                     raw_csv=False, progress=False)
    for bank, n in zip(BANKS, (400, 300, 200), strict=True):
        _fraud_features(bank, n, seed=bank).save(str(bank_dir(data, bank) / NODE_FEATURES_FILE))
    files = generate_federation_files(root / "federation", banks=len(BANKS))
    with Federation(files, data, BANKS) as fed:
        yield fed


@pytest.fixture(scope="module")
def superlink(tmp_path_factory):
    """The refusal tests' SuperLink: TLS and SuperNode authentication as in :func:`federation`, bank 0's key
    registered, no SuperNode started (nor data generated: a refused SuperNode never reads any)."""
    root = tmp_path_factory.mktemp("superlink")
    files = generate_federation_files(root / "federation", banks=len(BANKS))
    with Federation(files, root / "data", []) as fed:
        fed.register(files.bank_public_key(0), "bank-0")
        yield fed


@pytest.mark.long
def test_anomaly_app_runs_across_processes(federation, tmp_path):
    out = tmp_path / "server"
    pyproject = (ROOT / "pyproject.toml").read_bytes()
    # the server names a data folder that does not exist: the banks' SuperNodes read their own folders
    run_app(federation.files, ROOT, {**SMALL, "rounds": 2, "num-banks": 3, "data-dir": str(tmp_path / "nowhere"),
                                     "out-dir": str(out)}, log_name="anomaly")
    assert (ROOT / "pyproject.toml").read_bytes() == pyproject  # flwr run left the app's pyproject.toml alone
    result = json.loads((out / "checkpoints" / "anomaly-federated" / "result.json").read_text())
    assert result["rounds"] == 2 and result["banks"] == 3 and result["version"] == "anomaly:v1"
    assert np.isfinite(result["summary"]["loss_mean"])
    # each SuperNode built (and cached) its own bank's data only
    for bank in BANKS:
        cached = sorted(p.name for p in (federation.files.root / "cache" / f"bank_{bank}").glob("*.pt"))
        assert cached and all(name.startswith(f"bank_{bank}-") for name in cached), cached


@pytest.mark.long
def test_anomaly_dp_app_runs_under_secagg_across_processes(federation, tmp_path):
    """apps/anomaly_dp across the SuperLink and 3 SuperNode processes: 4 DP-FedSGD rounds under SecAgg+, one
    evaluation per block, the best block published with its (ε, δ) per cardholder."""
    out = tmp_path / "server"
    keys = tomllib.loads((ROOT / "apps" / "anomaly_dp" / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    config = {k: v for k, v in SMALL.items() if k in keys["config"]} | {
        "rounds": 2, "local-epochs": 1, "samples-per-epoch": 48, "batch-size": 24, "cardholder-dp-sampling-rate": 0.6,
        "cardholder-dp-pool-per-cardholder": 40, "data-dir": str(tmp_path / "nowhere"), "out-dir": str(out),
        "timeout-s": 240.0}
    n = training_cardholders(federation.data_dir, {**keys["config"], **config, "cache-dir": str(tmp_path / "c")})
    run_app(federation.files, ROOT / "apps" / "anomaly_dp", {**config, "dp-cardholders": n}, timeout_s=600,
            log_name="anomaly-dp")
    result = json.loads((out / "checkpoints" / "anomaly-federated-dp" / "result.json").read_text())
    assert result["dp_rounds"] == result["dp_rounds_planned"] == 4 and result["rounds"] == 2 and result["banks"] == 3
    card = ModelRegistry(out).get("anomaly", result["version"].split(":")[1]).privacy["client_dp"]
    assert card["noise"] == "distributed" and card["cardholders"] == n and card["epsilon"] <= 8.0 + 1e-6
    assert card["steps"] == card["dp_rounds_applied"] == 4 and "SecAggPlusWorkflow" in card["execution"]
    for bank in BANKS:  # each SuperNode charged the run once to its own ledger, in its data folder, and counted 4 steps
        [entry] = PrivacyLedger(bank_dir(federation.data_dir, bank) / "dp-ledger.json").entries()
        assert (entry.steps, entry.last_step) == (4, 4) and entry.epsilon == pytest.approx(card["epsilon"], rel=1e-9)


@pytest.mark.long
def test_fraud_app_runs_across_processes(federation, tmp_path):
    import xgboost as xgb

    out = tmp_path / "fraud"
    cfg = FraudConfig(max_depth=3, nthread=1, threshold_bins=100)
    run_app(federation.files, ROOT / "apps" / "fraud", {
        "result-dir": str(out), "num-rounds": 2, "num-supernodes": 3, "feature-sets": "as",
        "fraud-config": cfg.model_dump_json(), "threshold-bins": 100, "eta": 0.1,
    }, log_name="fraud")
    valid_rows = sum(int(np.sum(FraudFeatures.load(str(bank_dir(federation.data_dir, b) / NODE_FEATURES_FILE)).split
                                == "valid")) for b in BANKS)
    for feature_set in ("as",):  # with the anomaly score; each feature set is one more federated run
        info = json.loads((out / f"{feature_set}.json").read_text())
        assert info["banks"] == 3 and info["rounds"] == 2
        assert info["valid_rows"] == valid_rows  # every bank's validation histogram was summed
        assert 0.0 <= info["threshold"] <= 1.0
        booster = xgb.Booster()
        booster.load_model(bytearray((out / f"{feature_set}.model.json").read_bytes()))
        assert booster.num_boosted_rounds() == 2 * 3  # bagging: one tree per bank per round


def _refused(federation: Federation, cmd: list[str], name: str) -> str:
    log = federation.files.logs / f"{name}.log"
    with open(log, "wb") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=120, check=False,
                              env=flwr_env(federation.files))
    assert proc.returncode != 0
    return log.read_text(errors="replace")


def test_unregistered_supernode_is_refused(superlink, tmp_path):
    key = tmp_path / "rogue"  # claims bank 0, whose own key is registered
    write_ssh_key_pair(key, tmp_path / "rogue.pub", "not-registered")
    text = _refused(superlink, superlink.supernode_command(0, key, max_retries=1), "rogue")
    assert "Failed to activate SuperNode" in text
    link = (superlink.files.logs / "superlink.log").read_text(errors="replace")
    assert "No SuperNode found with the given public key" in link


def test_plaintext_is_refused(superlink):
    text = _refused(superlink, superlink.supernode_command(0, None, insecure=True, max_retries=1), "plaintext")
    assert "could not establish a connection to the SuperLink" in text
    # the same port speaks TLS only: a plain HTTP request gets no answer, a TLS one verified by the CA does
    plain = http.client.HTTPConnection("127.0.0.1", superlink.port, timeout=10)
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        plain.request("GET", "/")
        plain.getresponse()
    context = ssl.create_default_context(cafile=str(superlink.files.ca_cert))
    secure = http.client.HTTPSConnection("127.0.0.1", superlink.port, timeout=10, context=context)
    secure.request("GET", "/")
    assert secure.getresponse().status < 500

"""The federation's TLS material and keys, the fraud Flower App's config, and a SuperNode's own data folder."""

import os
import stat
import tomllib
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key

from fedfraud.cli.app import main
from fedfraud.core.errors import ConfigError
from fedfraud.training.federated.deployment import FederationFiles, generate_federation_files
from fedfraud.training.anomaly.federated.task import RunSettings, on_node
from fedfraud.training.fraud.federated.server_app import DEFAULT_SETTINGS

ROOT = Path(__file__).resolve().parents[2]


def test_generated_material_chains_to_the_ca_and_keys_are_private(tmp_path):
    files = generate_federation_files(tmp_path, banks=2, hosts=("127.0.0.1", "localhost", "link.example.org"))
    ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "link.example.org"]
    assert files.banks() == [0, 1]
    for bank in (0, 1):
        private = load_ssh_private_key(files.bank_key(bank).read_bytes(), None)
        public = load_ssh_public_key(files.bank_public_key(bank).read_bytes())
        # what `flwr supernode register` accepts: an EC key on a NIST curve, in OpenSSH format
        assert isinstance(public, ec.EllipticCurvePublicKey) and public.curve.name == "secp384r1"
        assert private.public_key().public_numbers() == public.public_numbers()
    assert files.bank_public_key(0).read_text() != files.bank_public_key(1).read_text()
    for secret in (files.ca_key, files.server_key, files.bank_key(0), files.bank_key(1)):
        assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600, secret


def test_missing_material_is_one_line(tmp_path):
    generate_federation_files(tmp_path, banks=1)
    with pytest.raises(Exception, match=r"bank_1 is missing; run `fedfraud federation certs"):
        FederationFiles(tmp_path).check([0, 1])


def test_cli_certs_then_down_without_a_federation(tmp_path, capsys):
    assert main(["federation", "certs", "--out", str(tmp_path), "--banks", "3"]) == 0
    assert FederationFiles(tmp_path).banks() == [0, 1, 2]
    assert main(["federation", "down", "--out", str(tmp_path)]) == 2
    assert "no running federation under" in capsys.readouterr().err


def test_fraud_app_config_is_the_server_defaults():
    flwr = tomllib.loads((ROOT / "apps" / "fraud" / "pyproject.toml").read_text())["tool"]["flwr"]
    assert flwr["app"]["components"] == {
        "serverapp": "fedfraud.training.fraud.federated.server_app:app",
        "clientapp": "fedfraud.training.fraud.federated.client_app:app",
    }
    assert flwr["app"]["config"] == DEFAULT_SETTINGS


def test_a_supernode_reads_its_own_bank_folder(tmp_path):
    settings = RunSettings.from_flat({"data-dir": "server/side", "out-dir": str(tmp_path)})
    assert on_node(settings, 1, {"partition-id": 1}) is settings  # simulation: no data-dir in the node config
    own = on_node(settings, 1, {"partition-id": 1, "data-dir": "/banks/one/bank_1", "cache-dir": "/c/bank_1"})
    assert own.data_dir == Path("/banks/one") and own.cache_dir == Path("/c/bank_1")
    with pytest.raises(ConfigError, match="must be bank 2's folder"):
        on_node(settings, 2, {"data-dir": "/banks/one/bank_1"})


def test_no_legacy_federations_section():
    """flwr 1.41 rewrites a pyproject.toml with [tool.flwr.federations] on every `flwr run .` (a test would edit
    the repository); connections live in $FLWR_HOME/config.toml."""
    for path in (ROOT / "pyproject.toml", ROOT / "apps" / "fraud" / "pyproject.toml"):
        assert "federations" not in tomllib.loads(path.read_text())["tool"]["flwr"], path


def test_a_bank_writes_the_features_its_supernode_trains_on(tmp_path, capsys):
    """`federation features` turns one bank's own folder into the file its fraud ClientApp loads."""
    from fedfraud.cli.app import main
    from fedfraud.training.fraud.federated.task import load_node_features

    data = tmp_path / "data"
    assert main(["generate", "--out", str(data), "--cardholders", "30", "--days", "10", "--banks", "2"]) == 0
    assert main(["federation", "features", "--data-dir", str(data), "--bank", "1"]) == 0
    assert "anomaly score from none" in capsys.readouterr().out
    feats = load_node_features(str(data / "bank_1"))
    assert len(feats) > 0 and not (data / "bank_0" / "fraud-features.npz").exists()
    assert main(["federation", "features", "--data-dir", str(data), "--bank", "7"]) == 2  # not this dataset's bank

"""TLS and signing material made with ``cryptography``: a CA, server certificates it signs, EC key pairs.

Shared by the Flower deployment (``fedfraud federation certs``: the SuperLink's
certificate and one SuperNode key pair per bank) and the federated XGBoost
server (throwaway per-run certificates). No ``openssl`` binary is needed.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CertificateAuthority", "self_signed", "write_certificate", "write_private_key", "write_ssh_key_pair"]


def write_private_key(path: Path, key: ec.EllipticCurvePrivateKey) -> Path:
    """Write ``key`` as unencrypted PKCS#8 PEM, readable by this user only (0600 from creation)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    _write_0600(path, data)
    return path


def write_ssh_key_pair(private_path: Path, public_path: Path, comment: str = "") -> str:
    """A new P-384 key pair in OpenSSH format (what Flower's SuperNode authentication reads); returns the public line.

    Why P-384 and OpenSSH: ``flower-supernode --auth-supernode-private-key``
    loads an OpenSSH EC private key and ``flwr supernode register`` accepts
    only NIST-curve EC public keys in OpenSSH format.
    """
    key = ec.generate_private_key(ec.SECP384R1())
    _write_0600(Path(private_path), key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                                      serialization.NoEncryption()))
    line = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    line = f"{line} {comment}".strip()
    Path(public_path).write_text(line + "\n", encoding="utf-8")
    return line


def _write_0600(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _san(hosts: tuple[str, ...]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _certificate(common_name: str, key: ec.EllipticCurvePrivateKey, days: int,
                 extensions: list[tuple[x509.ExtensionType, bool]],
                 issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None = None) -> x509.Certificate:
    """A certificate for ``key``'s public half, valid from 5 minutes ago for ``days`` days, signed by ``issuer``
    (its name and key) or by ``key`` itself.
    """
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    issuer_name, signer = issuer if issuer is not None else (subject, key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(issuer_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(signer, hashes.SHA256())


def self_signed(common_name: str, hosts: tuple[str, ...],
                days: int = 1) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A throwaway P-256 key and a self-signed certificate for ``hosts`` that is its own trust anchor.

    For one run on loopback (the federated XGBoost server and its workers trust
    each other's certificate directly); a deployment uses :class:`CertificateAuthority`.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    return key, _certificate(common_name, key, days, [(_san(hosts), False),
                                                      (x509.BasicConstraints(ca=True, path_length=None), True)])


@dataclass(frozen=True)
class CertificateAuthority:
    """A CA key and its self-signed certificate; it signs server certificates."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def create(cls, name: str, days: int = 365) -> CertificateAuthority:
        """A new CA (P-256, valid ``days`` days) whose only use is signing certificates."""
        key = ec.generate_private_key(ec.SECP256R1())
        usage = x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                              data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                              encipher_only=False, decipher_only=False)
        return cls(key, _certificate(name, key, days, [
            (x509.BasicConstraints(ca=True, path_length=0), True), (usage, True),
            (x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False),
        ]))

    def issue(self, common_name: str, hosts: tuple[str, ...], days: int = 365,
              client: bool = False) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        """A new key and a certificate for ``hosts`` (DNS names or IPs in the SAN), signed by this CA.

        ``client=True`` also allows the certificate for TLS client authentication (mutual TLS).
        """
        key = ec.generate_private_key(ec.SECP256R1())
        usages = [ExtendedKeyUsageOID.SERVER_AUTH, *([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])]
        return key, _certificate(common_name, key, days, [
            (_san(hosts), False), (x509.BasicConstraints(ca=False, path_length=None), True),
            (x509.ExtendedKeyUsage(usages), False),
            (x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), False),
        ], issuer=(self.cert.subject, self.key))

    def write(self, key_path: Path, cert_path: Path) -> None:
        """Write the CA key (0600) and certificate (PEM)."""
        write_private_key(key_path, self.key)
        write_certificate(cert_path, self.cert)


def write_certificate(path: Path, cert: x509.Certificate) -> Path:
    """Write ``cert`` as PEM."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path

"""Certificates and keys for a control plane on 127.0.0.1: one CA, serving and client certificates, SA keys."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LOOPBACK = ipaddress.ip_address("127.0.0.1")
VALIDITY = datetime.timedelta(days=2)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


class Authority:
    """A throwaway CA that signs everything the tier serves and every client it admits."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self._key = _key()
        now = datetime.datetime.now(datetime.timezone.utc)
        self._cert = (x509.CertificateBuilder()
                      .subject_name(_name("tpu-fallback-test-ca")).issuer_name(_name("tpu-fallback-test-ca"))
                      .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
                      .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALIDITY)
                      .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                      .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                   content_commitment=False, key_encipherment=False,
                                                   data_encipherment=False, key_agreement=False,
                                                   encipher_only=False, decipher_only=False), critical=True)
                      .sign(self._key, hashes.SHA256()))
        self.cert_pem = self._cert.public_bytes(serialization.Encoding.PEM)
        self.cert = folder / "ca.crt"
        self.cert.write_bytes(self.cert_pem)

    def _issue(self, stem: str, subject: x509.Name, usage: x509.ObjectIdentifier, server: bool) -> KeyPair:
        key, now = _key(), datetime.datetime.now(datetime.timezone.utc)
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(self._cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALIDITY)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(LOOPBACK), x509.DNSName("localhost")]), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = KeyPair(self.folder / f"{stem}.crt", self.folder / f"{stem}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pair.key.write_bytes(_pem_key(key))
        pair.key.chmod(0o600)
        return pair

    def serving(self, stem: str) -> KeyPair:
        """A serving certificate for 127.0.0.1 and localhost."""
        return self._issue(stem, _name(stem), ExtendedKeyUsageOID.SERVER_AUTH, server=True)

    def client(self, stem: str, user: str, group: str | None = None) -> KeyPair:
        """A client certificate: the API server reads the user from CN and the group from O."""
        return self._issue(stem, _name(user, group), ExtendedKeyUsageOID.CLIENT_AUTH, server=False)


def service_account_keys(folder: Path) -> KeyPair:
    """The key pair the API server signs ServiceAccount tokens with (public half in `cert`)."""
    key = _key()
    pair = KeyPair(folder / "sa.pub", folder / "sa.key")
    pair.key.write_bytes(_pem_key(key))
    pair.key.chmod(0o600)
    pair.cert.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                        serialization.PublicFormat.SubjectPublicKeyInfo))
    return pair

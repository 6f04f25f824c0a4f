"""A per-run certificate authority and the broker's server certificate, made with `cryptography`.

The CA's private key signs the one server certificate and is then thrown away: nobody, not
even this process, can mint a second certificate clients would trust for this run. Clients
verify the broker against `ca.crt` (public); only the broker reads `server.key` (mode 0600).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from privnet.broker.credentials import write_private

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
VALIDITY = dt.timedelta(days=30)


@dataclass(frozen=True)
class TLSFiles:
    """PEM files of one run's TLS: the CA certificate, the server certificate and its key."""

    ca_cert: Path
    cert: Path
    key: Path


def make_tls(directory: str | Path, hostnames: Iterable[str] = ()) -> TLSFiles:
    """Write ca.crt, server.crt and server.key (0600) into `directory`.

    The server certificate names localhost, 127.0.0.1 and ::1, plus `hostnames` (DNS names or
    IP addresses, e.g. "broker" for docker-compose).
    """
    directory = Path(directory)
    names = list(dict.fromkeys([*LOCAL_NAMES, *hostnames]))
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "privnet run CA")])
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    cert = (
        _builder(subject, ca_name, key.public_key(), now)
        .add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names]), False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    files = TLSFiles(directory / "ca.crt", directory / "server.crt", directory / "server.key")
    write_private(files.ca_cert, ca_cert.public_bytes(pem).decode(), 0o644)
    write_private(files.cert, cert.public_bytes(pem).decode(), 0o644)
    key_pem = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    write_private(files.key, key_pem, 0o600)
    return files


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, now: dt.datetime
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))  # clock skew between containers
        .not_valid_after(now + VALIDITY)
    )


def _usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        pass
    if not name or any(c.isspace() or c in "/:@" for c in name):
        raise ValueError(f"bad TLS hostname {name!r}: give a DNS name (e.g. broker) or an IP")
    return x509.DNSName(name)

"""Test certificates, made at test time with `cryptography` (no private key is committed).

`CertificateAuthority` signs server and client certificates; `write_pair` puts one
certificate and its key into PEM files. Keys are EC P-256: quick to make, and every
TLS stack the tests use (gRPC core, Go, OpenSSL) takes them. Server certificates name
`localhost` and `127.0.0.1`, the addresses the tests connect to.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, as PEM bytes."""

    cert_pem: bytes
    key_pem: bytes
    serial: int

    def write(self, directory: Path, name: str) -> tuple[Path, Path]:
        """Write `<name>.crt` and `<name>.key` into `directory`; returns their paths."""
        directory.mkdir(parents=True, exist_ok=True)
        cert, key = directory / f"{name}.crt", directory / f"{name}.key"
        cert.write_bytes(self.cert_pem)
        key.write_bytes(self.key_pem)
        key.chmod(0o600)
        return cert, key


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _builder(subject: str, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey):
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
    )


class CertificateAuthority:
    """A self-signed CA that issues server and client certificates."""

    def __init__(self, name: str = "inferwire test CA") -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (
            _builder(name, self.name, self._key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.cert_pem = cert.public_bytes(serialization.Encoding.PEM)

    def write(self, directory: Path, name: str = "ca") -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}.crt"
        path.write_bytes(self.cert_pem)
        return path

    def issue_server(self, hosts: tuple[str, ...] = ("localhost", "127.0.0.1")) -> Issued:
        """A server certificate whose SAN holds `hosts` (DNS names or IP addresses)."""
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        return self._issue(hosts[0], ExtendedKeyUsageOID.SERVER_AUTH, names)

    def issue_client(self, name: str = "test-client", uris: tuple[str, ...] = ()) -> Issued:
        """A client certificate with subject CN `name` and `uris` as URI SANs (SPIFFE IDs)."""
        names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(u) for u in uris]
        return self._issue(name, ExtendedKeyUsageOID.CLIENT_AUTH, names)

    def _issue(
        self, subject: str, usage: x509.ObjectIdentifier, names: list[x509.GeneralName]
    ) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = _builder(subject, self.name, key.public_key()).add_extension(
            x509.ExtendedKeyUsage([usage]), critical=False
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return Issued(
            cert.public_bytes(serialization.Encoding.PEM), _key_pem(key), cert.serial_number
        )


def served_certificate_serial(host: str, port: int, timeout_s: float = 10.0) -> int:
    """The serial number of the certificate a TLS server presents to a new connection.

    Blocking: run it in a thread from async tests. Nothing is verified; only read.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])  # gRPC servers refuse a handshake without it
    with (
        socket.create_connection((host, port), timeout=timeout_s) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


@dataclass(frozen=True)
class Pki:
    """One CA's files: its certificate, a server pair for 127.0.0.1 and localhost, and a
    client pair, for tests that pass paths to a server process or a tool."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def server_env(self, mutual: bool = False) -> dict[str, str]:
        """`inferwire serve`'s environment for TLS, and with `mutual` for mutual TLS."""
        env = {
            "INFERWIRE_SERVER__TLS__CERT_FILE": str(self.server_cert),
            "INFERWIRE_SERVER__TLS__KEY_FILE": str(self.server_key),
        }
        if mutual:
            env["INFERWIRE_SERVER__TLS__CLIENT_CA_FILE"] = str(self.ca)
        return env


def write_pki(directory: Path) -> Pki:
    ca = CertificateAuthority()
    server_cert, server_key = ca.issue_server().write(directory, "server")
    client_cert, client_key = ca.issue_client().write(directory, "client")
    return Pki(ca.write(directory), server_cert, server_key, client_cert, client_key)

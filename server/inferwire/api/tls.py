"""TLS and mutual TLS for the gRPC listener, with certificates that rotate without a restart.

The listener uses grpcio's dynamic server credentials (`grpc.dynamic_ssl_server_credentials`).
gRPC's core calls the fetcher on *every* new connection, before its TLS handshake, on one
of the core's threads; it returns a new certificate configuration when the `server.tls`
files changed (edge/certificates.py reads and checks them, for both doors), or None to
keep the current one.
"""

from __future__ import annotations

import grpc

from inferwire.edge.certificates import CertificateFiles, Material


def _configuration(material: Material) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration(
        [(material.key, material.cert)], root_certificates=material.client_ca
    )


def grpc_credentials(files: CertificateFiles) -> grpc.ServerCredentials:
    """Server credentials for `files` that look for new files before each handshake."""

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        material = files.changed()
        return None if material is None else _configuration(material)

    return grpc.dynamic_ssl_server_credentials(
        _configuration(files.material),
        fetch,  # type: ignore[arg-type]  # None (no change) is documented; the stubs omit it
        require_client_authentication=files.mutual,
    )

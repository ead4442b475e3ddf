"""TLS and mutual TLS for the gRPC listener, with certificates that rotate without a restart.

The listener uses grpcio's dynamic server credentials (`grpc.dynamic_ssl_server_credentials`).
gRPC's core calls our fetcher, `CertificateFiles.fetch`, on *every* new connection, before
its TLS handshake, on one of the core's threads; the fetcher returns a new certificate
configuration when the files changed (edge/certificates.py reads and checks them), or None
to keep the current one.
"""

from __future__ import annotations

import grpc

from inferwire.edge import certificates
from inferwire.edge.certificates import Material, is_loopback, log_transport_security

__all__ = ["CertificateFiles", "is_loopback", "log_transport_security"]


def _configuration(material: Material) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration(
        [(material.key, material.cert)], root_certificates=material.client_ca
    )


class CertificateFiles(certificates.CertificateFiles):
    """The `server.tls` files as gRPC server credentials."""

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials that call `fetch` before each new connection's handshake."""
        return grpc.dynamic_ssl_server_credentials(
            _configuration(self.material),
            self.fetch,  # type: ignore[arg-type]  # None (no change) is documented; the stubs omit it
            require_client_authentication=self.mutual,
        )

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's certificate fetcher: a new configuration when the files changed, else None."""
        material = self.changed()
        return None if material is None else _configuration(material)

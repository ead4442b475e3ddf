"""The gRPC door: one grpc.aio server with InferenceService, KServe v2, grpc.health.v1 and
reflection behind the interceptors, and the optional plaintext health-only listener.

`inferwire.server` assembles the house (models, metrics, tracing, callers) and hands it
to this door and to the HTTP one; here is everything grpc needs to listen and drain.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator

import grpc
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inferwire.api.calls import CallInterceptor, method_labels
from inferwire.api.decoding import DecodeErrorInterceptor
from inferwire.api.health import SERVICE_NAME, HealthServicer
from inferwire.api.kserve import add_kserve
from inferwire.api.metrics import GrpcMetrics
from inferwire.api.reflection import SERVICE_NAMES as REFLECTION_SERVICE_NAMES
from inferwire.api.reflection import add_reflection
from inferwire.api.servicer import InferenceServicer
from inferwire.api.tls import grpc_credentials
from inferwire.config import ServerSettings, TransportSettings
from inferwire.core.manager import ModelManager
from inferwire.edge.calls import Reception
from inferwire.edge.certificates import CertificateFiles
from inferwire.log import flush_logs
from inferwire.metrics.series import ServerMetrics
from inferwire.v1 import inference_pb2_grpc

log = logging.getLogger(__name__)

# What gRPC's core logs when a bind fails: why, after the address that could not be bound.
_BIND_FAILURE = re.compile(
    r"Failed to add port to server: (?:.*\(Error in bind for address '[^']*': )?(?P<why>[^)\n]*)"
)


@contextlib.contextmanager
def _native_stderr() -> Iterator[io.StringIO]:
    """Collect what native code writes to file descriptor 2 during the block.

    gRPC's core logs why a bind failed there, then raises an error that does not say.
    Anything another thread writes to stderr meanwhile is collected too.
    """
    collected = io.StringIO()
    with tempfile.TemporaryFile() as sink:
        flush_logs()  # the log writer's thread: its queued lines go out first
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield collected
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            collected.write(sink.read().decode(errors="replace"))


# How long an arrived call may wait for the server to pick it up (see transport_options).
UNREQUESTED_CALL_LIMIT_S = 3600


def transport_options(transport: TransportSettings) -> list[tuple[str, int]]:
    """The grpc channel arguments for the `server.transport` limits."""
    options = [
        # grpc's soft limit refuses a growing share of the calls between it and the hard
        # limit; one value for both refuses every call over it, every time.
        ("grpc.max_metadata_size", transport.max_metadata_bytes),
        ("grpc.absolute_max_metadata_size", transport.max_metadata_bytes),
        ("grpc.max_concurrent_streams", transport.max_concurrent_streams),
        ("grpc.server.max_pending_requests", transport.max_pending_calls),
        ("grpc.server.max_pending_requests_hard_limit", transport.max_pending_calls),
        # grpc cancels a call that waited this long for the server to pick it up (its
        # default, 30 s, cancels part of a burst of thousands on a busy loop, unseen by
        # admission and unlogged); the caller's deadline is what should end such a wait.
        ("grpc.server_max_unrequested_time_in_server", UNREQUESTED_CALL_LIMIT_S),
        (
            "grpc.http2.min_ping_interval_without_data_ms",
            round(transport.keepalive_min_ping_interval_s * 1e3),
        ),
        ("grpc.http2.max_ping_strikes", transport.keepalive_max_ping_strikes),
        ("grpc.keepalive_permit_without_calls", int(transport.keepalive_permit_without_calls)),
    ]
    if transport.max_connection_age_s is not None:
        options += [
            ("grpc.max_connection_age_ms", round(transport.max_connection_age_s * 1e3)),
            ("grpc.max_connection_age_grace_ms", round(transport.max_connection_age_grace_s * 1e3)),
        ]
    return options


def served_methods(services: list[str]) -> list[tuple[str, str, str]]:
    """The grpc-ecosystem labels of every method of `services` (by full name)."""
    pool = descriptor_pool.Default()
    labels = []
    for name in services:
        try:
            service = pool.FindServiceByName(name)
        except KeyError:
            continue  # not in this process's descriptor pool: its series appear when used
        for method in service.methods:
            labels.append(
                method_labels(
                    f"/{name}/{method.name}", method.client_streaming, method.server_streaming
                )
            )
    return labels


class GrpcListener:
    """The gRPC listener(s) over `manager`: bind with `start`, drain with `stop`."""

    def __init__(
        self,
        settings: ServerSettings,
        address: str,
        manager: ModelManager,
        metrics: ServerMetrics,
        reception: Reception,
        tls: CertificateFiles | None,
    ) -> None:
        self.address, self.tls = address, tls
        self._settings = settings
        grpc_metrics = GrpcMetrics(metrics)
        self.health = HealthServicer()
        manager.add_health_listener(self.health.update)
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", settings.max_receive_message_bytes),
                ("grpc.so_reuseport", 0),
                *transport_options(settings.transport),
            ],
            # Outermost first: every RPC is the edge's call (counted, traced, its access
            # line written, refused ones too; a caller without a token is refused before
            # its handler runs); DecodeErrorInterceptor then guards every handler that runs.
            interceptors=[
                CallInterceptor(reception, grpc_metrics, frozenset(settings.auth.open_services)),
                DecodeErrorInterceptor(),
            ],
        )
        inference_pb2_grpc.add_InferenceServiceServicer_to_server(
            InferenceServicer(manager), self._server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        services = [
            SERVICE_NAME,
            *add_kserve(self._server, manager),
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            *REFLECTION_SERVICE_NAMES,
        ]
        add_reflection(self._server, services)
        grpc_metrics.methods_served(served_methods(services))
        # Kubernetes' gRPC probes speak plaintext only: with TLS on, they need their own port.
        self._health_server: grpc.aio.Server | None = None
        if settings.health_address:
            self._health_server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self._health_server)
        self.port = 0
        self.health_port: int | None = None  # None: no separate health listener

    def bind(self) -> int:
        """Take the listening ports (failing in one line when taken); returns the gRPC port."""
        self.port = _bind(self.address, self._add_port)
        if self._health_server is not None:
            health_server = self._health_server
            health_address = self._settings.health_address
            self.health_port = _bind(
                health_address, lambda: health_server.add_insecure_port(health_address)
            )
        return self.port

    async def start(self) -> int:
        """Serve on the bound ports (binding them first if `bind` was not called)."""
        if not self.port:
            self.bind()
        if self._health_server is not None:
            await self._health_server.start()
            log.info(
                "health listening",
                extra={"address": self._settings.health_address, "port": self.health_port},
            )
        await self._server.start()
        return self.port

    def _add_port(self) -> int:
        if self.tls is None:
            return self._server.add_insecure_port(self.address)
        return self._server.add_secure_port(self.address, grpc_credentials(self.tls))

    async def stop(self, grace_s: float) -> None:
        """Refuse new RPCs, let in-flight ones finish within `grace_s`."""
        await self._server.stop(grace_s)
        if self._health_server is not None:  # probes saw NOT_SERVING to the end
            await self._health_server.stop(0)

    async def wait_for_termination(self) -> None:
        await self._server.wait_for_termination()


def _bind(address: str, add_port: Callable[[], int]) -> int:
    """Add a listening port, or raise an OSError that says why in one line."""
    with _native_stderr() as native_log:
        try:
            port: int | None = add_port()
        except RuntimeError:  # grpc's way of saying the bind failed
            port = None
    if port is not None:
        sys.stderr.write(native_log.getvalue())  # nothing is hidden when the bind worked
        return port
    found = _BIND_FAILURE.search(native_log.getvalue())
    why = found["why"] if found else "address in use or not available"
    raise OSError(f"could not listen on {address}: {why}")

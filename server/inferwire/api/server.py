"""Assembles and runs the gRPC server: InferenceService, KServe v2, grpc.health.v1, reflection."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inferwire.api.auth import auth_interceptors
from inferwire.api.decoding import DecodeErrorInterceptor
from inferwire.api.health import SERVICE_NAME, HealthServicer
from inferwire.api.kserve import add_kserve
from inferwire.api.metrics import MetricsEndpoint, PrometheusMetrics
from inferwire.api.observe import ObservingInterceptor, method_labels
from inferwire.api.reflection import SERVICE_NAMES as REFLECTION_SERVICE_NAMES
from inferwire.api.reflection import add_reflection
from inferwire.api.servicer import InferenceServicer
from inferwire.api.tls import CertificateFiles, log_transport_security
from inferwire.api.tracing import TracingInterceptor
from inferwire.backends import create_backend
from inferwire.config import Settings, TransportSettings
from inferwire.core.manager import BackendFactory, ModelManager
from inferwire.core.metrics import MemoryMetrics, MetricsListener
from inferwire.core.tracing import Tracer
from inferwire.core.validation import RequestLimits
from inferwire.edge.calls import JoinsCalls
from inferwire.edge.tracing import server_tracing
from inferwire.log import flush_logs
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


def build_manager(
    settings: Settings,
    backend_factory: BackendFactory = create_backend,
    metrics: MetricsListener | None = None,
    tracer: Tracer | None = None,
    memory_metrics: MemoryMetrics | None = None,
) -> ModelManager:
    """Create the model manager; raises ConfigurationError for a bad model entry."""
    return ModelManager(
        settings.models,
        backend_factory,
        RequestLimits(max_prompt_bytes=settings.server.max_prompt_bytes),
        health_check_interval_s=settings.server.health_check_interval_s,
        metrics=metrics,
        tracer=tracer,
        keep_text=settings.server.log_prompts,
        memory=settings.server.memory,
        memory_metrics=memory_metrics,
        tenants=settings.server.tenant_registry(),
        adapters=settings.server.adapters,
    )


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


class StartupLoadError(Exception):
    """Start-up models failed to load, and `server.exit_on_startup_failure` is set."""

    def __init__(self, failures: dict[str, str]) -> None:
        self.failures = failures
        super().__init__(
            "; ".join(f"model {name!r} failed to load: {why}" for name, why in failures.items())
        )


class InferwireServer:
    """A configured server. `start()` binds and loads; `stop()` drains in the documented order."""

    def __init__(
        self,
        settings: Settings,
        address: str | None = None,
        backend_factory: BackendFactory = create_backend,
        tracer_provider: Any = None,
    ) -> None:
        """`tracer_provider`: an OpenTelemetry TracerProvider to trace with, whatever the
        settings say; None: tracing as `server.tracing` and the OTEL_* variables say."""
        self.settings = settings
        self.address = address or settings.server.address
        self.metrics = PrometheusMetrics()
        self.observer = ObservingInterceptor(self.metrics)
        # Raises ConfigurationError when tracing is asked for but cannot be had.
        self.tracing = server_tracing(settings.server.tracing, tracer_provider)
        self.manager = build_manager(
            settings,
            backend_factory,
            JoinsCalls(self.metrics),
            self.tracing.tracer if self.tracing else None,
            memory_metrics=self.metrics,
        )
        self._metrics_endpoint = (
            MetricsEndpoint(settings.server.metrics_address, self.metrics.registry)
            if settings.server.metrics_address
            else None
        )
        # Read and checked now: a bad certificate or key is a configuration error.
        self.tls = CertificateFiles(settings.server.tls) if settings.server.tls.enabled else None
        self.health = HealthServicer()
        self.manager.add_health_listener(self.health.update)
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", settings.server.max_receive_message_bytes),
                ("grpc.so_reuseport", 0),
                *transport_options(settings.server.transport),
            ],
            # Outermost first: every RPC is counted and gets its access line, refused ones
            # too, and is traced; a caller without a token is refused before its payload
            # is looked at; DecodeErrorInterceptor then guards every handler that runs.
            interceptors=[
                self.observer,
                *([TracingInterceptor(self.tracing)] if self.tracing else []),
                *auth_interceptors(settings.server.auth, {t.name for t in settings.server.tenants}),
                DecodeErrorInterceptor(),
            ],
        )
        inference_pb2_grpc.add_InferenceServiceServicer_to_server(
            InferenceServicer(self.manager), self._server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        services = [
            SERVICE_NAME,
            *add_kserve(self._server, self.manager),
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            *REFLECTION_SERVICE_NAMES,
        ]
        add_reflection(self._server, services)
        self.metrics.methods_served(served_methods(services))
        self.metrics.tenants_configured(t.name for t in settings.server.tenants)
        # Kubernetes' gRPC probes speak plaintext only: with TLS on, they need their own port.
        self._health_server: grpc.aio.Server | None = None
        if settings.server.health_address:
            self._health_server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self._health_server)
        self.port = 0
        self.health_port: int | None = None  # None: no separate health listener
        self.metrics_port: int | None = None  # None: metrics are off
        self.startup_failures: dict[str, str] = {}
        self._listening = False
        self._stopped = False

    async def start(self) -> int:
        """Bind, start serving, then load start-up models. Returns the bound port.

        Start-up models that failed to load are left in `startup_failures`.
        """
        self.port = self._bind(self.address, self._add_port)
        if self._health_server is not None:
            health_server = self._health_server
            health_address = self.settings.server.health_address
            self.health_port = self._bind(
                health_address, lambda: health_server.add_insecure_port(health_address)
            )
            await health_server.start()
            log.info(
                "health listening", extra={"address": health_address, "port": self.health_port}
            )
        if self._metrics_endpoint is not None:
            self.metrics_port = self._metrics_endpoint.start()
        await self._server.start()
        self._listening = True
        log.info("listening", extra={"address": self.address, "port": self.port})
        log_transport_security(self.address, self.tls)
        self.startup_failures = await self.manager.start()
        return self.port

    @staticmethod
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

    def _add_port(self) -> int:
        if self.tls is None:
            return self._server.add_insecure_port(self.address)
        return self._server.add_secure_port(self.address, self.tls.credentials())

    async def stop(self, grace_s: float | None = None) -> None:
        """Drain: NOT_SERVING everywhere, refuse new RPCs, let in-flight ones finish, unload."""
        if self._stopped or not self._listening:  # nothing was served or loaded
            self._stopped = True
            return
        self._stopped = True
        grace = self.settings.server.grace_period_s if grace_s is None else grace_s
        started = time.perf_counter()
        await self.manager.begin_shutdown()
        await self.health.enter_shutdown()
        if self.settings.server.shutdown_delay_s:
            await asyncio.sleep(self.settings.server.shutdown_delay_s)
        await self._server.stop(grace)
        if self._health_server is not None:  # probes saw NOT_SERVING to the end
            await self._health_server.stop(0)
        await self.manager.close()
        if self._metrics_endpoint is not None:
            await asyncio.to_thread(self._metrics_endpoint.stop)
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.close)
        log.info("stopped", extra={"drain_ms": round((time.perf_counter() - started) * 1e3, 1)})

    async def wait_for_termination(self) -> None:
        await self._server.wait_for_termination()


async def serve(settings: Settings) -> None:
    """Run until SIGTERM or SIGINT, then drain and return.

    Raises StartupLoadError, after the same drain, when a start-up model failed to load
    and `server.exit_on_startup_failure` is set.
    """
    server = InferwireServer(settings)
    stop_requested = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop_requested.set)
    try:
        await server.start()
        if server.startup_failures and settings.server.exit_on_startup_failure:
            log.error(
                "a start-up model failed to load; exiting (server.exit_on_startup_failure)",
                extra={"models": sorted(server.startup_failures)},
            )
            raise StartupLoadError(server.startup_failures)
        await stop_requested.wait()
        log.info(
            "shutdown requested; draining", extra={"grace_period_s": settings.server.grace_period_s}
        )
    finally:
        await server.stop()

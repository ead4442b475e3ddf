"""The house: one process's models, metrics, tracing and callers, and its two doors.

`InferwireServer` builds the core (`core.manager.ModelManager`) and what every door
shares: the metrics (`metrics/`: the core's series and the inference gateway's gauges, in the one
registry each door adds its per-call series to), OpenTelemetry, the reception that
every call goes through (`edge.calls.Reception`: `server.auth`, tenancy, tracing) and
the `server.tls` files; then the gRPC door (`api.listener.GrpcListener`: InferenceService,
KServe v2, health, reflection) and the HTTP door (`http.listener.HttpListener`: the
OpenAI-compatible API), on one event loop. `stop()` drains both together.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import TYPE_CHECKING, Any

from inferwire.api.listener import GrpcListener
from inferwire.backends import create_backend
from inferwire.config import Settings
from inferwire.core.backend import Backend
from inferwire.core.kv_blocks import KvEventsSettings
from inferwire.core.manager import BackendFactory, ModelManager
from inferwire.core.metrics import MemoryMetrics, MetricsListener
from inferwire.core.specs import ModelSpec
from inferwire.core.tracing import Tracer
from inferwire.core.validation import RequestLimits
from inferwire.edge.authentication import Authenticator
from inferwire.edge.calls import Reception, RecordsToCalls
from inferwire.edge.certificates import CertificateFiles, log_transport_security
from inferwire.edge.tenancy import Tenancy
from inferwire.edge.tracing import server_tracing
from inferwire.http.calls import HttpCalls
from inferwire.http.listener import HttpListener
from inferwire.http.metrics import HttpMetrics
from inferwire.http.responses_api.store import ResponseStore, open_response_store
from inferwire.http.routes import Routes
from inferwire.metrics.endpoint import MetricsEndpoint
from inferwire.metrics.model_server import ModelServerGauges
from inferwire.metrics.prompt_cache import PromptCacheMetrics
from inferwire.metrics.series import ServerMetrics

if TYPE_CHECKING:
    from inferwire.kv_events.publisher import KvEventPublisher

log = logging.getLogger(__name__)


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


def kv_event_publisher(settings: KvEventsSettings) -> KvEventPublisher | None:
    """The KV events' sockets where `endpoint` is set (pyzmq imported only then)."""
    if settings.endpoint is None:
        return None
    from inferwire.kv_events.publisher import KvEventPublisher

    return KvEventPublisher(settings)


def with_kv_blocks(factory: BackendFactory, publisher: KvEventPublisher) -> BackendFactory:
    """`factory`, its backends given their model's block ledger before they load."""

    def build(spec: ModelSpec) -> Backend:
        backend = factory(spec)
        backend.kv_blocks = publisher.ledger(spec.name)
        return backend

    return build


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
        server = settings.server
        self.address = address or server.address
        self.metrics = ServerMetrics()
        # Raises ConfigurationError when tracing is asked for but cannot be had.
        self.tracing = server_tracing(server.tracing, tracer_provider)
        # KV events (server.kv_events): bound now, so a taken address fails at start-up.
        self.kv_events = kv_event_publisher(server.kv_events)
        if self.kv_events is not None:
            backend_factory = with_kv_blocks(backend_factory, self.kv_events)
        self.manager = build_manager(
            settings,
            backend_factory,
            RecordsToCalls(self.metrics),
            self.tracing.tracer if self.tracing else None,
            memory_metrics=self.metrics,
        )
        self._metrics_endpoint = (
            MetricsEndpoint(server.metrics_address, self.metrics.registry)
            if server.metrics_address
            else None
        )
        # Read and checked now: a bad certificate, key or tokens file is a configuration error.
        self.tls = CertificateFiles(server.tls) if server.tls.enabled else None
        reception = Reception(
            Authenticator(server.auth, frozenset(t.name for t in server.tenants)),
            Tenancy(server.gateway),
            self.tracing,
        )
        self.metrics.tenants_configured(t.name for t in server.tenants)
        # The model-server protocol's gauges (vllm:*), on the metrics port and /metrics.
        self.metrics.registry.register(ModelServerGauges(self.manager.server_load))
        self.metrics.registry.register(PromptCacheMetrics(self.manager.prompt_caches))
        self.grpc = GrpcListener(
            server, self.address, self.manager, self.metrics, reception, self.tls
        )
        self.http: HttpListener | None = None
        # The Responses API's store (server.responses.store), opened on first use.
        self.responses: ResponseStore | None = None
        if server.http_address:
            self.responses = open_response_store(server.responses, server.state_dir)
            calls = HttpCalls(
                reception,
                HttpMetrics(self.metrics),
                server.max_receive_message_bytes,
                server.http_read_timeout_s,
            )
            app = Routes(self.manager, calls, self.metrics.registry, self.responses).app()
            self.http = HttpListener(
                app,
                server.http_address,
                self.tls,
                server.http_read_timeout_s,
                server.transport.max_metadata_bytes,
            )
        self.port = 0
        self.http_port: int | None = None  # None: HTTP is off
        self.metrics_port: int | None = None  # None: metrics are off
        self.startup_failures: dict[str, str] = {}
        self._listening = False
        self._stopped = False

    @property
    def health_port(self) -> int | None:
        """The plaintext health-only listener's port; None: there is none."""
        return self.grpc.health_port

    async def start(self) -> int:
        """Bind, start serving, then load start-up models. Returns the gRPC port.

        Start-up models that failed to load are left in `startup_failures`.
        """
        self.grpc.bind()  # a taken gRPC port fails before anything else listens or logs
        if self._metrics_endpoint is not None:
            self.metrics_port = self._metrics_endpoint.start()
        self.port = await self.grpc.start()
        self._listening = True
        if self.http is not None:
            self.http_port = await self.http.start(self.settings.server.grace_period_s)
            log.info("http listening", extra={"address": self.http.address, "port": self.http_port})
        log.info("listening", extra={"address": self.address, "port": self.port})
        log_transport_security(self.address, self.tls)
        self.startup_failures = await self.manager.start()
        return self.port

    async def stop(self, grace_s: float | None = None) -> None:
        """Drain: NOT_SERVING everywhere, refuse new calls, let in-flight ones finish, unload."""
        if self._stopped or not self._listening:  # nothing was served or loaded
            self._stopped = True
            if self.kv_events is not None:
                await asyncio.to_thread(self.kv_events.close)
            return
        self._stopped = True
        grace = self.settings.server.grace_period_s if grace_s is None else grace_s
        started = time.perf_counter()
        await self.manager.begin_shutdown()
        await self.grpc.health.enter_shutdown()
        if self.settings.server.shutdown_delay_s:
            await asyncio.sleep(self.settings.server.shutdown_delay_s)
        doors = [self.grpc.stop(grace)]
        if self.http is not None:
            doors.append(self.http.stop())
        await asyncio.gather(*doors)  # HTTP streams drain with the gRPC ones
        if self.responses is not None:  # after the doors: draining streams store theirs
            await self.responses.close()
        await self.manager.close()
        if self.kv_events is not None:  # after the unloads, whose clears it sends
            await asyncio.to_thread(self.kv_events.close)
        if self._metrics_endpoint is not None:
            await asyncio.to_thread(self._metrics_endpoint.stop)
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.close)
        log.info("stopped", extra={"drain_ms": round((time.perf_counter() - started) * 1e3, 1)})

    async def wait_for_termination(self) -> None:
        await self.grpc.wait_for_termination()


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

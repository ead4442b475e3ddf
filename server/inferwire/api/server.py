"""Assembles and runs the gRPC server: InferenceService, grpc.health.v1 and reflection."""

from __future__ import annotations

import asyncio
import logging
import signal
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inferwire.api.health import SERVICE_NAME, HealthServicer
from inferwire.api.reflection import SERVICE_NAMES as REFLECTION_SERVICE_NAMES
from inferwire.api.reflection import add_reflection
from inferwire.api.servicer import InferenceServicer
from inferwire.backends import create_backend
from inferwire.config import Settings
from inferwire.core.manager import BackendFactory, ModelManager, ModelSpec
from inferwire.core.validation import RequestLimits
from inferwire.v1 import inference_pb2_grpc

log = logging.getLogger(__name__)


def build_manager(
    settings: Settings, backend_factory: BackendFactory = create_backend
) -> ModelManager:
    """Create the model manager; raises ConfigurationError for a bad model entry."""
    specs = [
        ModelSpec(
            name=m.name,
            backend=m.backend,
            load_on_startup=m.load_on_startup,
            max_concurrency=m.max_concurrency,
            max_queue=m.max_queue,
            options=dict(m.options),
        )
        for m in settings.models
    ]
    return ModelManager(
        specs,
        backend_factory,
        RequestLimits(max_prompt_bytes=settings.server.max_prompt_bytes),
        health_check_interval_s=settings.server.health_check_interval_s,
    )


class InferwireServer:
    """A configured server. `start()` binds and loads; `stop()` drains in the documented order."""

    def __init__(
        self,
        settings: Settings,
        address: str | None = None,
        backend_factory: BackendFactory = create_backend,
    ) -> None:
        self.settings = settings
        self.address = address or settings.server.address
        self.manager = build_manager(settings, backend_factory)
        self.health = HealthServicer()
        self.manager.add_health_listener(self.health.update)
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", settings.server.max_receive_message_bytes),
                ("grpc.so_reuseport", 0),
            ]
        )
        inference_pb2_grpc.add_InferenceServiceServicer_to_server(
            InferenceServicer(self.manager), self._server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        add_reflection(
            self._server,
            [
                SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                *REFLECTION_SERVICE_NAMES,
            ],
        )
        self.port = 0
        self._stopped = False

    async def start(self) -> int:
        """Bind, start serving, then load start-up models. Returns the bound port."""
        try:
            self.port = self._server.add_insecure_port(self.address)
        except RuntimeError:  # grpc's way of saying the bind failed
            raise OSError(
                f"could not listen on {self.address}: address in use or not available"
            ) from None
        await self._server.start()
        log.info("listening", extra={"address": self.address, "port": self.port})
        await self.manager.start()
        return self.port

    async def stop(self, grace_s: float | None = None) -> None:
        """Drain: NOT_SERVING everywhere, refuse new RPCs, let in-flight ones finish, unload."""
        if self._stopped:
            return
        self._stopped = True
        grace = self.settings.server.grace_period_s if grace_s is None else grace_s
        started = time.perf_counter()
        await self.manager.begin_shutdown()
        await self.health.enter_shutdown()
        if self.settings.server.shutdown_delay_s:
            await asyncio.sleep(self.settings.server.shutdown_delay_s)
        await self._server.stop(grace)
        await self.manager.close()
        log.info("stopped", extra={"drain_ms": round((time.perf_counter() - started) * 1e3, 1)})

    async def wait_for_termination(self) -> None:
        await self._server.wait_for_termination()


async def serve(settings: Settings) -> None:
    """Run until SIGTERM or SIGINT, then drain and return."""
    server = InferwireServer(settings)
    stop_requested = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop_requested.set)
    try:
        await server.start()
        await stop_requested.wait()
        log.info(
            "shutdown requested; draining", extra={"grace_period_s": settings.server.grace_period_s}
        )
    finally:
        await server.stop()

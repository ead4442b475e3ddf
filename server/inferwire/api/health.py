"""The standard grpc.health.v1 service, fed by the model manager.

Service names: "" and "inferwire.v1.InferenceService" report the whole server;
"model/<name>" reports one model. Unknown names get NOT_FOUND. We implement the
servicer ourselves (rather than grpc_health's) so that Watch streams end after
announcing NOT_SERVING at shutdown instead of holding the drain open.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inferwire.api.peer_gone import write_or_await_cancellation
from inferwire.core.validation import model_name_problem
from inferwire.edge.errors import MAX_MESSAGE_BYTES, bounded
from inferwire.v1 import inference_pb2

SERVICE_NAME = inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name
MODEL_PREFIX = "model/"

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


def model_service(model: str) -> str:
    return MODEL_PREFIX + model


def unknown_service(service: str) -> str:
    """NOT_FOUND's message; names the problem of a malformed model name, bounded."""
    if service.startswith(MODEL_PREFIX):
        problem = model_name_problem(service.removeprefix(MODEL_PREFIX))
        if problem is not None:
            return f"unknown service: the model name {problem}"
    return bounded(f"unknown service {service!r}", MAX_MESSAGE_BYTES)


class HealthServicer(health_pb2_grpc.HealthServicer):
    """grpc.health.v1 Check and Watch over statuses pushed by `update`."""

    def __init__(self) -> None:
        self._statuses: dict[str, int] = {"": NOT_SERVING, SERVICE_NAME: NOT_SERVING}
        self._changed = asyncio.Condition()
        self._version = 0
        self._shutting_down = False

    async def update(self, readiness: dict[str, bool]) -> None:
        """Apply the manager's readiness map ('' for the server, else a model name)."""
        if self._shutting_down:
            return
        statuses: dict[str, int] = {}
        for name, ready in readiness.items():
            status = SERVING if ready else NOT_SERVING
            if name:
                statuses[model_service(name)] = status
            else:
                statuses[""] = statuses[SERVICE_NAME] = status
        await self._set(statuses)

    async def enter_shutdown(self) -> None:
        """Turn every service NOT_SERVING for good and let Watch streams end."""
        self._shutting_down = True
        await self._set(dict.fromkeys(self._statuses, NOT_SERVING))

    async def _set(self, statuses: dict[str, int]) -> None:
        async with self._changed:
            self._statuses.update(statuses)
            self._version += 1
            self._changed.notify_all()

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        status = self._statuses.get(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, unknown_service(request.service))
        return health_pb2.HealthCheckResponse(status=status)

    def _changed_since(self, version: int) -> Callable[[], bool]:
        return lambda: self._version != version

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> None:
        # Written with `context.write`, not as an async generator, on every listener (the
        # separate health port has no interceptors): see the rule in api/handlers.py.
        last_sent: int | None = None
        seen_version = -1
        while True:
            async with self._changed:
                await self._changed.wait_for(self._changed_since(seen_version))
                seen_version = self._version
                status = self._statuses.get(request.service, SERVICE_UNKNOWN)
                shutting_down = self._shutting_down
            if status != last_sent:
                await write_or_await_cancellation(
                    context, health_pb2.HealthCheckResponse(status=status)
                )
                last_sent = status
            if shutting_down:
                return

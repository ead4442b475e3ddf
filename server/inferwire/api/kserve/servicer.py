"""inference.GRPCInferenceService (KServe v2, the Open Inference Protocol) over the model
manager, next to inferwire.v1 on the same listener.

Each method converts the request, calls the same core as inferwire.v1's servicer and
converts the result; whatever a method raises becomes its status in the call interceptor
(api/calls.py).
The shared-memory, trace and log RPCs answer UNIMPLEMENTED, saying why.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Callable
from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as oip
from tritonclient.grpc import service_pb2_grpc

from inferwire.api.kserve import metadata
from inferwire.api.kserve.conventions import parse_request, require_version
from inferwire.api.kserve.responses import result_response
from inferwire.api.kserve.streaming import StreamSession
from inferwire.api.kserve.tensors import invalid
from inferwire.api.status import serves_every_rpc
from inferwire.core.errors import ModelNotReadyError, NotSupportedError
from inferwire.core.facts import Capabilities
from inferwire.core.manager import ModelManager
from inferwire.core.status import ModelState, ModelStatus
from inferwire.edge.calls import current_call
from inferwire.wire.oip import STREAM

SERVICE = oip.DESCRIPTOR.services_by_name["GRPCInferenceService"]
_SHARED_MEMORY = "inferwire takes tensors in the request itself, not from shared memory"
_SETTINGS = "inferwire is configured through its configuration file (docs/configuration.md)"


def _not_supported(rpc: str, why: str) -> Callable[..., Awaitable[Any]]:
    async def refuse(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        raise NotSupportedError(f"{SERVICE.full_name}/{rpc} is not supported: {why}")

    refuse.__name__ = rpc
    return refuse


@serves_every_rpc(SERVICE)
class KServeServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """inference.GRPCInferenceService over a ModelManager."""

    # ---- not offered: UNIMPLEMENTED, saying why ---------------------------------

    SystemSharedMemoryStatus = _not_supported("SystemSharedMemoryStatus", _SHARED_MEMORY)
    SystemSharedMemoryRegister = _not_supported("SystemSharedMemoryRegister", _SHARED_MEMORY)
    SystemSharedMemoryUnregister = _not_supported("SystemSharedMemoryUnregister", _SHARED_MEMORY)
    CudaSharedMemoryStatus = _not_supported("CudaSharedMemoryStatus", _SHARED_MEMORY)
    CudaSharedMemoryRegister = _not_supported("CudaSharedMemoryRegister", _SHARED_MEMORY)
    CudaSharedMemoryUnregister = _not_supported("CudaSharedMemoryUnregister", _SHARED_MEMORY)
    TraceSetting = _not_supported("TraceSetting", _SETTINGS + "; tracing is OpenTelemetry's")
    LogSettings = _not_supported("LogSettings", _SETTINGS)

    def __init__(self, manager: ModelManager) -> None:
        self._manager = manager

    # ---- health and metadata ----------------------------------------------

    async def ServerLive(
        self, request: oip.ServerLiveRequest, context: grpc.aio.ServicerContext
    ) -> oip.ServerLiveResponse:
        return oip.ServerLiveResponse(live=True)

    async def ServerReady(
        self, request: oip.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> oip.ServerReadyResponse:
        return oip.ServerReadyResponse(ready=self._manager.serving)

    async def ModelReady(
        self, request: oip.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> oip.ModelReadyResponse:
        """The readiness of grpc.health.v1's `model/<name>`; false for an unknown model."""
        statuses = self._manager.health_statuses()
        known_version = request.version in ("", metadata.MODEL_VERSION)
        ready = bool(request.name) and known_version and statuses.get(request.name, False)
        return oip.ModelReadyResponse(ready=ready)

    async def ServerMetadata(
        self, request: oip.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> oip.ServerMetadataResponse:
        return metadata.server_metadata()

    async def ModelMetadata(
        self, request: oip.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> oip.ModelMetadataResponse:
        status, _ = self._loaded(request.name, request.version)
        return metadata.model_metadata(status)

    async def ModelConfig(
        self, request: oip.ModelConfigRequest, context: grpc.aio.ServicerContext
    ) -> oip.ModelConfigResponse:
        return metadata.model_config(*self._loaded(request.name, request.version))

    def _loaded(self, name: str, version: str) -> tuple[ModelStatus, Capabilities]:
        """A model the caller may use, loaded (as Triton describes loaded models only)."""
        require_version(name, version)
        status = self._manager.model_status(name)
        if status.state is not ModelState.READY or status.capabilities is None:
            raise ModelNotReadyError(
                f"model {name!r} is {status.state.value}, not READY: load it first"
            )
        return status, status.capabilities

    async def ModelStatistics(
        self, request: oip.ModelStatisticsRequest, context: grpc.aio.ServicerContext
    ) -> oip.ModelStatisticsResponse:
        if request.name:
            require_version(request.name, request.version)
        may_use = current_call().principal.may_use
        statistics = self._manager.statistics(request.name)
        return oip.ModelStatisticsResponse(
            model_stats=[metadata.model_statistics(s) for s in statistics if may_use(s.name)]
        )

    # ---- inference -----------------------------------------------------------

    async def ModelInfer(
        self, request: oip.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> oip.ModelInferResponse:
        call = current_call()
        parsed = parse_request(request, context.time_remaining(), call.tenant, call.priority_hint)
        if parsed.stream:
            raise invalid(STREAM, "true needs ModelStreamInfer: ModelInfer answers once")
        call.name_fields(parsed.field_of)
        result = await self._manager.infer(parsed.inference)
        return result_response(parsed, result)

    async def ModelStreamInfer(
        self,
        requests: AsyncIterable[oip.ModelInferRequest],
        context: grpc.aio.ServicerContext,
    ) -> None:
        await StreamSession(self._manager, context).run(requests)

    # ---- the model repository ------------------------------------------------

    async def RepositoryIndex(
        self, request: oip.RepositoryIndexRequest, context: grpc.aio.ServicerContext
    ) -> oip.RepositoryIndexResponse:
        _require_our_repository(request.repository_name)
        principal = current_call().principal
        return oip.RepositoryIndexResponse(
            models=[
                metadata.index_entry(status)
                for status in self._manager.list_models()
                if principal.may_use(status.name)
                and (not request.ready or status.state is ModelState.READY)
            ]
        )

    async def RepositoryModelLoad(
        self, request: oip.RepositoryModelLoadRequest, context: grpc.aio.ServicerContext
    ) -> oip.RepositoryModelLoadResponse:
        _require_our_repository(request.repository_name)
        if request.parameters:
            raise invalid(
                "parameters",
                "inferwire loads models as its configuration declares them; "
                "a load takes no config or files",
            )
        await self._manager.load(request.model_name)
        return oip.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: oip.RepositoryModelUnloadRequest, context: grpc.aio.ServicerContext
    ) -> oip.RepositoryModelUnloadResponse:
        _require_our_repository(request.repository_name)
        if unknown := sorted(set(request.parameters) - {"unload_dependents"}):
            raise invalid(f"parameters.{unknown[0]}", "is not an unload parameter")
        await self._manager.unload(request.model_name)
        return oip.RepositoryModelUnloadResponse()


def _require_our_repository(name: str) -> None:
    if name:
        raise invalid(
            "repository_name", "inferwire has one repository, its configuration: leave it empty"
        )

"""The gRPC servicer: inferwire.v1.InferenceService over the model manager.

Each method converts the request, calls the core and converts the result; the
error mapping wraps every RPC of the service (see `maps_errors_on_every_rpc`).
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc
from grpc._cython import cygrpc  # type: ignore[attr-defined]

from inferwire.api.auth import current_principal
from inferwire.api.converters import (
    FINISH_REASON,
    health_to_proto,
    logprobs_to_proto,
    messages_from_proto,
    model_status_to_proto,
    request_from_proto,
    timing_to_proto,
    usage_to_proto,
)
from inferwire.api.request_log import logged_request
from inferwire.api.status import maps_errors_on_every_rpc
from inferwire.core.manager import ModelManager
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc

# How long a handler whose write failed waits for grpc to report the cancellation.
PEER_GONE_GRACE_S = 5.0


@maps_errors_on_every_rpc(pb.DESCRIPTOR.services_by_name["InferenceService"])
class InferenceServicer(inference_pb2_grpc.InferenceServiceServicer):
    """inferwire.v1.InferenceService over a ModelManager."""

    def __init__(self, manager: ModelManager, log_prompts: bool = False) -> None:
        self._manager = manager
        self._log_prompts = log_prompts  # prompt and output text in the request log

    async def LoadModel(
        self, request: pb.LoadModelRequest, context: grpc.aio.ServicerContext
    ) -> pb.LoadModelResponse:
        current_principal().require_model(request.model)
        status = await self._manager.load(request.model)
        return pb.LoadModelResponse(model=model_status_to_proto(status))

    async def UnloadModel(
        self, request: pb.UnloadModelRequest, context: grpc.aio.ServicerContext
    ) -> pb.UnloadModelResponse:
        current_principal().require_model(request.model)
        status = await self._manager.unload(request.model)
        return pb.UnloadModelResponse(model=model_status_to_proto(status))

    async def Infer(
        self, request: pb.InferRequest, context: grpc.aio.ServicerContext
    ) -> pb.InferResponse:
        domain_request = request_from_proto(request, context.time_remaining())
        principal = current_principal()
        output: list[str] = []
        with logged_request(domain_request, principal.name, output, self._log_prompts) as account:
            principal.require_model(request.model)
            result = await self._manager.infer(domain_request, account)
            output.append(result.text)
        return pb.InferResponse(
            request_id=result.request_id,
            model=result.model,
            backend=result.backend,
            text=result.text,
            finish_reason=FINISH_REASON[result.finish_reason],
            usage=usage_to_proto(result.usage),
            timing=timing_to_proto(result.timing),
            logprobs=logprobs_to_proto(result.logprobs),
        )

    async def InferStream(
        self, request: pb.InferStreamRequest, context: grpc.aio.ServicerContext
    ) -> None:
        domain_request = request_from_proto(request, context.time_remaining())
        principal = current_principal()
        output: list[str] = []
        with logged_request(domain_request, principal.name, output, self._log_prompts) as account:
            principal.require_model(request.model)
            request_id, chunks = self._manager.infer_stream(domain_request, account)
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    output.append(chunk.text)
                    message = pb.InferStreamResponse(
                        request_id=request_id, model=request.model, text=chunk.text
                    )
                    if chunk.logprobs:
                        message.logprobs.extend(logprobs_to_proto(chunk.logprobs))
                    if chunk.finish_reason is not None:
                        message.finish_reason = FINISH_REASON[chunk.finish_reason]
                    if chunk.usage is not None:
                        message.usage.CopyFrom(usage_to_proto(chunk.usage))
                    if chunk.timing is not None:
                        message.timing.CopyFrom(timing_to_proto(chunk.timing))
                    await _write(context, message)

    async def Tokenize(
        self, request: pb.TokenizeRequest, context: grpc.aio.ServicerContext
    ) -> pb.TokenizeResponse:
        current_principal().require_model(request.model)
        result = await self._manager.tokenize(
            request.model, request.prompt, messages_from_proto(request.messages)
        )
        return pb.TokenizeResponse(
            token_ids=result.token_ids,
            count=len(result.token_ids),
            rendered_prompt=result.rendered_prompt,
        )

    async def Health(
        self, request: pb.HealthRequest, context: grpc.aio.ServicerContext
    ) -> pb.HealthResponse:
        principal = current_principal()
        if request.model:
            principal.require_model(request.model)
        report = await self._manager.health_report(request.model, include=principal.may_use)
        return health_to_proto(report)

    async def ListModels(
        self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListModelsResponse:
        principal = current_principal()
        return pb.ListModelsResponse(
            models=[
                model_status_to_proto(s)
                for s in self._manager.list_models()
                if principal.may_use(s.name)
            ]
        )


async def _write(context: grpc.aio.ServicerContext, message: pb.InferStreamResponse) -> None:
    """Send one stream message; a client that left mid-write ends the RPC as a cancellation.

    Written with the reader-writer API, not `yield`, because grpc.aio logs a failed
    write of a yielded message at ERROR when the client cancelled while the server was
    blocked on flow control: the write fails a moment before grpc marks the RPC
    cancelled. Here the failure is caught, and the cancellation that follows ends the
    handler the ordinary way (CancelledError, which closes the generation).
    """
    try:
        await context.write(message)
    except cygrpc.ExecuteBatchError:  # private, but the only name of this failure
        await asyncio.sleep(PEER_GONE_GRACE_S)
        raise

"""The gRPC servicer: inferwire.v1.InferenceService over the model manager.

Each method converts the request, calls the core and converts the result. The call
(edge/calls.py, `current_call`) says who is calling and as which tenant, and has checked
that the caller may use the model the request names (api/calls.py `check_model_of`);
whatever a method raises becomes its status in the call interceptor (api/calls.py).
"""

from __future__ import annotations

import contextlib

import grpc

from inferwire.api.converters import (
    FINISH_REASON,
    choices_to_proto,
    embed_request_from_proto,
    embed_response,
    health_to_proto,
    list_models_response,
    logprobs_to_proto,
    messages_from_proto,
    model_status_to_proto,
    refresh_listed,
    request_from_proto,
    rerank_request_from_proto,
    rerank_response,
    timing_to_proto,
    tool_call_deltas_to_proto,
    tool_calls_to_proto,
    usage_to_proto,
)
from inferwire.api.peer_gone import write_or_await_cancellation
from inferwire.api.status import serves_every_rpc
from inferwire.core.adapters import AdapterSource
from inferwire.core.lifecycle import Trigger
from inferwire.core.manager import ModelManager
from inferwire.edge.calls import current_call
from inferwire.edge.listing import ListedModels
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc


@serves_every_rpc(pb.DESCRIPTOR.services_by_name["InferenceService"])
class InferenceServicer(inference_pb2_grpc.InferenceServiceServicer):
    """inferwire.v1.InferenceService over a ModelManager."""

    def __init__(self, manager: ModelManager) -> None:
        self._manager = manager
        self._listed = ListedModels(list_models_response, refresh_listed)

    async def LoadModel(
        self, request: pb.LoadModelRequest, context: grpc.aio.ServicerContext
    ) -> pb.LoadModelResponse:
        adapter = None
        if request.HasField("adapter"):
            adapter = AdapterSource(request.adapter.base_model, request.adapter.path)
        status, evicted = await self._manager.load_evicting(
            request.model, Trigger.EXPLICIT, adapter
        )
        return pb.LoadModelResponse(model=model_status_to_proto(status), evicted=evicted)

    async def UnloadModel(
        self, request: pb.UnloadModelRequest, context: grpc.aio.ServicerContext
    ) -> pb.UnloadModelResponse:
        status = await self._manager.unload(request.model)
        return pb.UnloadModelResponse(model=model_status_to_proto(status))

    async def Infer(
        self, request: pb.InferRequest, context: grpc.aio.ServicerContext
    ) -> pb.InferResponse:
        call = current_call()
        result = await self._manager.infer(
            request_from_proto(request, context.time_remaining(), call.tenant, call.priority_hint)
        )
        return pb.InferResponse(
            request_id=result.request_id,
            model=result.model,
            backend=result.backend,
            text=result.text,
            finish_reason=FINISH_REASON[result.finish_reason],
            usage=usage_to_proto(result.usage),
            timing=timing_to_proto(result.timing),
            logprobs=logprobs_to_proto(result.logprobs),
            tool_calls=tool_calls_to_proto(result.tool_calls),
            choices=choices_to_proto(result.choices),
        )

    async def InferStream(
        self, request: pb.InferStreamRequest, context: grpc.aio.ServicerContext
    ) -> None:
        call = current_call()
        domain_request = request_from_proto(
            request, context.time_remaining(), call.tenant, call.priority_hint
        )
        request_id, chunks = self._manager.infer_stream(domain_request)
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                message = pb.InferStreamResponse(
                    request_id=request_id,
                    model=request.model,
                    text=chunk.text,
                    choice_index=chunk.choice,
                )
                if chunk.logprobs:
                    message.logprobs.extend(logprobs_to_proto(chunk.logprobs))
                if chunk.tool_calls:
                    message.tool_calls.extend(tool_call_deltas_to_proto(chunk.tool_calls))
                if chunk.finish_reason is not None:
                    message.finish_reason = FINISH_REASON[chunk.finish_reason]
                if chunk.usage is not None:
                    message.usage.CopyFrom(usage_to_proto(chunk.usage))
                if chunk.timing is not None:
                    message.timing.CopyFrom(timing_to_proto(chunk.timing))
                await write_or_await_cancellation(context, message)

    async def Tokenize(
        self, request: pb.TokenizeRequest, context: grpc.aio.ServicerContext
    ) -> pb.TokenizeResponse:
        result = await self._manager.tokenize(
            request.model, request.prompt, messages_from_proto(request.messages)
        )
        return pb.TokenizeResponse(
            token_ids=result.token_ids,
            count=len(result.token_ids),
            rendered_prompt=result.rendered_prompt,
        )

    async def Embed(
        self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext
    ) -> pb.EmbedResponse:
        call = current_call()
        asked = embed_request_from_proto(
            request, context.time_remaining(), call.tenant, call.priority_hint
        )
        return embed_response(await self._manager.embed(asked))

    async def Rerank(
        self, request: pb.RerankRequest, context: grpc.aio.ServicerContext
    ) -> pb.RerankResponse:
        call = current_call()
        asked = rerank_request_from_proto(
            request, context.time_remaining(), call.tenant, call.priority_hint
        )
        return rerank_response(await self._manager.rerank(asked))

    async def Health(
        self, request: pb.HealthRequest, context: grpc.aio.ServicerContext
    ) -> pb.HealthResponse:
        principal = current_call().principal
        report = await self._manager.health_report(request.model, include=principal.may_use)
        return health_to_proto(report)

    async def ListModels(
        self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListModelsResponse:
        principal = current_call().principal
        statuses = self._manager.list_models()
        return self._listed.answer(s for s in statuses if principal.may_use(s.name))

"""Protobuf <-> domain conversion for inferwire.v1, and how ListModels' kept answer
(edge/listing.py `ListedModels`) is made and brought up to date."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence

from inferwire.core.chat import (
    ChatMessage,
    Tool,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolChoiceMode,
)
from inferwire.core.embeddings import (
    EmbeddingRequest,
    EmbeddingResult,
    RerankRequest,
    RerankResult,
)
from inferwire.core.errors import FieldViolation, InvalidArgumentError
from inferwire.core.requests import InferenceRequest, Priority
from inferwire.core.results import Choice, FinishReason, Timing, TokenLogprob, Usage
from inferwire.core.sampling import ConstraintKind, GenerationParams, OutputConstraint
from inferwire.core.status import HealthReport, ModelState, ModelStatus
from inferwire.v1 import inference_pb2 as pb

FINISH_REASON = {
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.STOP_SEQUENCE: pb.FINISH_REASON_STOP_SEQUENCE,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.TOOL_CALLS: pb.FINISH_REASON_TOOL_CALLS,
}
_TOOL_CHOICE_MODE = {
    pb.TOOL_CHOICE_MODE_NONE: ToolChoiceMode.NONE,
    pb.TOOL_CHOICE_MODE_AUTO: ToolChoiceMode.AUTO,
    pb.TOOL_CHOICE_MODE_REQUIRED: ToolChoiceMode.REQUIRED,
}
_MODEL_STATE = {
    ModelState.UNLOADED: pb.MODEL_STATE_UNLOADED,
    ModelState.LOADING: pb.MODEL_STATE_LOADING,
    ModelState.READY: pb.MODEL_STATE_READY,
    ModelState.UNLOADING: pb.MODEL_STATE_UNLOADING,
    ModelState.FAILED: pb.MODEL_STATE_FAILED,
}


def request_from_proto(
    message: pb.InferRequest | pb.InferStreamRequest,
    time_remaining: float | None = None,
    tenant: str = "",
    priority_hint: Priority | None = None,
) -> InferenceRequest:
    """Our request; `time_remaining` is the RPC's deadline in seconds from now, if any;
    `tenant`, `priority_hint`: who it runs as, and what its gateway asks (edge/tenancy.py)."""
    p = message.parameters
    params = GenerationParams(
        max_tokens=p.max_tokens if p.HasField("max_tokens") else None,
        temperature=p.temperature if p.HasField("temperature") else None,
        top_p=p.top_p if p.HasField("top_p") else None,
        top_k=p.top_k if p.HasField("top_k") else None,
        seed=p.seed if p.HasField("seed") else None,
        stop=tuple(p.stop),
        logprobs=p.logprobs,
        top_logprobs=p.top_logprobs,
        constraint=constraint_from_proto(p.constraint),
        min_tokens=p.min_tokens if p.HasField("min_tokens") else None,
        ignore_eos=p.ignore_eos,
        presence_penalty=p.presence_penalty if p.HasField("presence_penalty") else None,
        frequency_penalty=p.frequency_penalty if p.HasField("frequency_penalty") else None,
        repetition_penalty=p.repetition_penalty if p.HasField("repetition_penalty") else None,
        logit_bias=dict(p.logit_bias),
        n=p.n if p.HasField("n") else None,
    )
    return InferenceRequest(
        request_id=message.request_id,
        model=message.model,
        prompt=message.prompt,
        context=tuple(message.context),
        params=params,
        deadline=None if time_remaining is None else time.monotonic() + time_remaining,
        messages=messages_from_proto(message.messages),
        tenant=tenant,
        priority=priority_from_proto(message.priority),
        priority_hint=priority_hint,
        tools=tuple(
            Tool(t.name, t.description, t.parameters_json_schema, t.strict) for t in message.tools
        ),
        tool_choice=tool_choice_from_proto(message.tool_choice),
        parallel_tool_calls=(
            message.parallel_tool_calls if message.HasField("parallel_tool_calls") else True
        ),
    )


def embed_request_from_proto(
    message: pb.EmbedRequest,
    time_remaining: float | None = None,
    tenant: str = "",
    priority_hint: Priority | None = None,
) -> EmbeddingRequest:
    """Our embedding request (the arguments as `request_from_proto`'s)."""
    return EmbeddingRequest(
        request_id=message.request_id,
        model=message.model,
        inputs=tuple(message.inputs),
        normalize=message.normalize if message.HasField("normalize") else None,
        truncate=message.truncate,
        deadline=None if time_remaining is None else time.monotonic() + time_remaining,
        tenant=tenant,
        priority=priority_from_proto(message.priority),
        priority_hint=priority_hint,
    )


def rerank_request_from_proto(
    message: pb.RerankRequest,
    time_remaining: float | None = None,
    tenant: str = "",
    priority_hint: Priority | None = None,
) -> RerankRequest:
    """Our rerank request (the arguments as `request_from_proto`'s)."""
    return RerankRequest(
        request_id=message.request_id,
        model=message.model,
        query=message.query,
        documents=tuple(message.documents),
        top_n=message.top_n if message.HasField("top_n") else None,
        truncate=message.truncate,
        deadline=None if time_remaining is None else time.monotonic() + time_remaining,
        tenant=tenant,
        priority=priority_from_proto(message.priority),
        priority_hint=priority_hint,
    )


def embed_response(result: EmbeddingResult) -> pb.EmbedResponse:
    return pb.EmbedResponse(
        request_id=result.request_id,
        model=result.model,
        embeddings=[pb.Embedding(values=vector) for vector in result.embeddings],
        usage=usage_to_proto(result.usage),
    )


def rerank_response(result: RerankResult) -> pb.RerankResponse:
    return pb.RerankResponse(
        request_id=result.request_id,
        model=result.model,
        results=[
            pb.RerankResult(index=r.index, relevance_score=r.relevance_score)
            for r in result.results
        ],
        usage=usage_to_proto(result.usage),
    )


def tool_choice_from_proto(choice: pb.ToolChoice) -> ToolChoice | None:
    """The request's tool choice; None (unset, or mode UNSPECIFIED): auto."""
    kind = choice.WhichOneof("choice")
    if kind == "function_name":
        return ToolChoice(ToolChoiceMode.REQUIRED, choice.function_name)
    if kind is None or choice.mode == pb.TOOL_CHOICE_MODE_UNSPECIFIED:
        return None
    if choice.mode not in _TOOL_CHOICE_MODE:
        raise InvalidArgumentError(
            [FieldViolation("tool_choice.mode", f"unknown mode {choice.mode}")]
        )
    return ToolChoice(_TOOL_CHOICE_MODE[choice.mode])


def choices_to_proto(choices: Iterable[Choice]) -> list[pb.Choice]:
    return [
        pb.Choice(
            index=c.index,
            text=c.text,
            finish_reason=FINISH_REASON[c.finish_reason],
            tool_calls=tool_calls_to_proto(c.tool_calls),
            logprobs=logprobs_to_proto(c.logprobs),
        )
        for c in choices
    ]


def tool_calls_to_proto(calls: Iterable[ToolCall]) -> list[pb.ToolCall]:
    return [pb.ToolCall(id=c.id, name=c.name, arguments_json=c.arguments) for c in calls]


def tool_call_deltas_to_proto(deltas: Iterable[ToolCallDelta]) -> list[pb.ToolCallDelta]:
    return [
        pb.ToolCallDelta(index=d.index, id=d.id, name=d.name, arguments_fragment=d.arguments)
        for d in deltas
    ]


def priority_from_proto(value: int) -> Priority | None:
    """The priority a request asks for; None (UNSPECIFIED): its tenant's."""
    if value == pb.PRIORITY_UNSPECIFIED:
        return None
    if value not in Priority._value2member_map_:
        raise InvalidArgumentError([FieldViolation("priority", f"unknown priority {value}")])
    return Priority(value)


def messages_from_proto(messages: Iterable[pb.ChatMessage]) -> tuple[ChatMessage, ...]:
    return tuple(
        ChatMessage(
            m.role,
            m.content,
            tuple(ToolCall(c.id, c.name, c.arguments_json) for c in m.tool_calls),
            m.tool_call_id,
        )
        for m in messages
    )


def constraint_from_proto(constraint: pb.OutputConstraint) -> OutputConstraint | None:
    kind = constraint.WhichOneof("kind")
    if kind is None:
        return None
    return OutputConstraint(ConstraintKind(kind), getattr(constraint, kind))


def logprobs_to_proto(logprobs: Iterable[TokenLogprob]) -> list[pb.TokenLogprob]:
    return [
        pb.TokenLogprob(
            token=entry.token,
            token_id=entry.token_id,
            logprob=entry.logprob,
            top=[
                pb.TopLogprob(token=alt.token, token_id=alt.token_id, logprob=alt.logprob)
                for alt in entry.top
            ],
        )
        for entry in logprobs
    ]


def usage_to_proto(usage: Usage) -> pb.Usage:
    return pb.Usage(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens)


def timing_to_proto(timing: Timing) -> pb.Timing:
    return pb.Timing(
        queue_ms=timing.queue_ms,
        time_to_first_token_ms=timing.time_to_first_token_ms,
        total_ms=timing.total_ms,
        load_ms=timing.load_ms,
    )


def model_status_to_proto(status: ModelStatus) -> pb.ModelStatus:
    message = pb.ModelStatus(
        name=status.name,
        backend=status.backend,
        state=_MODEL_STATE[status.state],
        detail=status.detail,
        pinned=status.pinned,
        on_demand=status.on_demand,
        resident_bytes=status.resident_bytes,
        base_model=status.base_model,
    )
    if status.last_used is not None:
        message.last_used.FromNanoseconds(round(status.last_used * 1e9))
    if (caps := status.capabilities) is not None:
        message.capabilities.CopyFrom(
            pb.ModelCapabilities(
                streaming=caps.streaming,
                max_concurrency=caps.max_concurrency,
                on_premises=caps.on_premises,
                modalities=list(caps.modalities),
                context_length=caps.context_length,
                max_output_tokens=caps.max_output_tokens,
                chat=caps.chat,
                logprobs=caps.logprobs,
                constrained_output=caps.constrained_output,
                tools=caps.tools,
                tools_constrained=caps.tools_constrained,
                sampling_parameters=sorted(caps.parameters),
                embeddings=caps.embeddings,
                rerank=caps.rerank,
                embedding_dimensions=caps.embedding_dimensions,
            )
        )
    return message


def list_models_response(statuses: Iterable[ModelStatus]) -> pb.ListModelsResponse:
    return pb.ListModelsResponse(models=[model_status_to_proto(s) for s in statuses])


def refresh_listed(
    response: pb.ListModelsResponse,
    listed: Sequence[ModelStatus],
    now: Sequence[ModelStatus],
) -> None:
    """ListModels' kept answer (edge/listing.py) brought up to date with what moves without
    a version: each model's last use and detail (a prompt cache's figures move with every
    request). grpc serializes the message as the handler returns, before another call
    runs."""
    for message, was, status in zip(response.models, listed, now, strict=True):
        if status.last_used != was.last_used and status.last_used is not None:
            message.last_used.FromNanoseconds(round(status.last_used * 1e9))
        if status.detail != was.detail:
            message.detail = status.detail


def health_to_proto(report: HealthReport) -> pb.HealthResponse:
    return pb.HealthResponse(
        serving=report.serving,
        models=[
            # The report's fields are the message's, by name; only the enum is converted.
            pb.ModelHealth(**{**dataclasses.asdict(m), "state": _MODEL_STATE[m.state]})
            for m in report.models
        ],
        backends=[
            pb.BackendHealth(name=b.name, healthy=b.healthy, detail=b.detail)
            for b in report.backends
        ],
    )

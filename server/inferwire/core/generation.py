"""What the core does around every generation, whatever the backend.

It renders the prompt the model sees (context passages, or chat messages
through the model's chat template), applies the model's limits and
capabilities to the request, matches stop strings in the output (closing the backend's stream on
a match, which cancels the rest of the generation), and joins a unary result.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from inferwire.core.backend import CountedProgress, GenerationEvents
from inferwire.core.chat import Tool, ToolSyntax
from inferwire.core.embeddings import kind_refusal
from inferwire.core.errors import FieldViolation, InvalidArgumentError
from inferwire.core.facts import Capabilities, ModelFacts, ModelLimits
from inferwire.core.models import ManagedModel
from inferwire.core.requests import GenerationRequest, InferenceRequest
from inferwire.core.results import FinishReason, GenerationEnd, TextDelta, TokenLogprob, Usage
from inferwire.core.sampling import GenerationParams
from inferwire.core.stop_sequences import HeldLogprobs, StopSequenceMatcher
from inferwire.core.tool_syntax import tool_grammar
from inferwire.core.tools import messages_with_tools, offered


def render_prompt(prompt: str, context: Sequence[str], separator: str) -> str:
    """The text the model sees: each context passage and a separator, then the prompt."""
    return "".join(passage + separator for passage in context) + prompt


def generation_request(
    model: ManagedModel, facts: ModelFacts, request: InferenceRequest, request_id: str
) -> GenerationRequest:
    """The backend's view of a shape-validated request, under the ID its record uses (made
    up when the caller sent none); raise for a limit the model sets. Only chat messages
    enter the backend (its template renders them): the rest comes from the model's facts."""
    if not facts.capabilities.generation:  # an embedding model: refused, never INTERNAL
        raise kind_refusal(model.name, facts.capabilities.kind, "generate text")
    params = request.params
    violations = list(_limit_violations(model.name, params, facts.limits))
    violations += _capability_violations(model.name, params, facts.capabilities)
    violations += _parameter_violations(model, params, facts.capabilities)
    tools = offered(request)
    if tools and not facts.capabilities.tools:
        violations.append(FieldViolation("tools", f"model {model.name!r} does not take tools"))
    if violations:
        raise InvalidArgumentError(violations)
    params = _with_defaults(params, facts.sampling_defaults)
    # Asked only when tools are offered: a request enters the backend only for what it needs.
    syntax = model.backend.tool_syntax() if tools else ToolSyntax.HERMES
    if tools and facts.capabilities.tools_constrained:
        params = dataclasses.replace(params, constraint=tool_grammar(request, syntax))
    if request.messages:
        prompt = _render(model, request, tools)
    else:
        prompt = render_prompt(request.prompt, request.context, facts.context_separator)
    return GenerationRequest(
        request_id=request_id,
        prompt=prompt,
        max_tokens=_max_tokens(params, facts.default_max_tokens),
        params=params,
        deadline=request.deadline,
        has_context=bool(request.context),
        is_chat=bool(request.messages),
        tools=tools,
        tool_syntax=syntax,
    )


def _render(model: ManagedModel, request: InferenceRequest, tools: tuple[Tool, ...]) -> str:
    """The chat prompt: through the template's own tools where it has them (only once a
    conversation has tools in it), else with the documented default (core/tools.py)."""
    backend = model.backend
    with_tools = bool(request.tools) or any(
        m.tool_calls or m.role == "tool" for m in request.messages
    )
    if with_tools and (prompt := backend.render_chat_with_tools(request.messages, tools)):
        return prompt
    return backend.render_chat(messages_with_tools(request))


def _max_tokens(params: GenerationParams, default: int) -> int:
    """The request's max_tokens; unset: the model's default, raised to min_tokens (which
    is within the model's limit, and at most an explicit max_tokens: both checked)."""
    if params.max_tokens is not None:
        return params.max_tokens
    return max(default, params.min_tokens or 0)


def _parameter_violations(
    model: ManagedModel, params: GenerationParams, capabilities: Capabilities
) -> list[FieldViolation]:
    """A sampling parameter set that the model's backend does not take."""
    return [
        FieldViolation(
            f"parameters.{name}",
            f"model {model.name!r} (backend {model.spec.backend!r}) does not take it",
        )
        for name in params.parameters_set()
        if name not in capabilities.parameters
    ]


def _with_defaults(params: GenerationParams, defaults: Mapping[str, Any]) -> GenerationParams:
    """`params` with each unset parameter the model has a default for set to it."""
    unset = {name: value for name, value in defaults.items() if getattr(params, name) is None}
    return dataclasses.replace(params, **unset) if unset else params


def _capability_violations(
    model: str, params: GenerationParams, capabilities: Capabilities
) -> list[FieldViolation]:
    violations = []
    if params.logprobs and not capabilities.logprobs:
        violations.append(
            FieldViolation(
                "parameters.logprobs", f"model {model!r} does not return log-probabilities"
            )
        )
    if params.constraint is not None and not capabilities.constrained_output:
        violations.append(
            FieldViolation(
                params.constraint.field, f"model {model!r} does not take output constraints"
            )
        )
    return violations


def _limit_violations(
    model: str, params: GenerationParams, limits: ModelLimits
) -> Iterator[FieldViolation]:
    if params.max_tokens is not None and params.max_tokens > limits.max_output_tokens:
        yield FieldViolation(
            "parameters.max_tokens",
            f"is {params.max_tokens}; model {model!r} allows at most {limits.max_output_tokens}",
        )
    if params.min_tokens is not None and params.min_tokens > limits.max_output_tokens:
        yield FieldViolation(
            "parameters.min_tokens",
            f"is {params.min_tokens}; model {model!r} generates at most "
            f"{limits.max_output_tokens} tokens",
        )
    if limits.max_seed is not None and params.seed is not None and params.seed > limits.max_seed:
        yield FieldViolation(
            "parameters.seed", f"must be at most {limits.max_seed} on this backend"
        )


def check_prompt_fits(
    request: GenerationRequest, prompt_tokens: int, model: str, limits: ModelLimits
) -> None:
    """Refuse a prompt of no tokens, or one that leaves no room in the context window."""
    if prompt_tokens == 0:
        raise InvalidArgumentError(
            [FieldViolation(request.prompt_field, "tokenizes to no tokens; the model needs one")]
        )
    if limits.context_length and prompt_tokens >= limits.context_length:
        raise InvalidArgumentError(
            [
                FieldViolation(
                    request.prompt_field,
                    f"the prompt is {prompt_tokens} tokens; model {model!r} has a context "
                    f"window of {limits.context_length} tokens",
                )
            ]
        )


async def stop_at_sequences(
    events: GenerationEvents, stops: Sequence[str], record: CountedProgress
) -> GenerationEvents:
    """The backend's events, cut at the earliest stop string.

    Text that could start a stop string is held back until the next delta decides
    it, so what is yielded always concatenates to the final text. Token
    log-probabilities stay with their text (see HeldLogprobs for the rule at a cut).
    On a match the backend's stream is closed first (cancelling generation) and the
    usage is read from the request's record after that, so a backend that counts at the
    end has reported its counts.
    """
    matcher = StopSequenceMatcher(tuple(stops))
    held = HeldLogprobs()
    emitted = 0
    matched_at: TextDelta | None = None
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, GenerationEnd):
                tail = matcher.flush()
                if (logprobs := held.flush()) or tail:
                    yield TextDelta(tail, event.usage.completion_tokens, logprobs)
                yield event
                return
            held.add(event.text, event.logprobs)
            text, matched = matcher.feed(event.text)
            emitted += len(text)
            logprobs = held.cut(emitted) if matched else held.release(emitted)
            if text or logprobs:
                yield TextDelta(text, event.completion_tokens, logprobs)
            if matched:
                matched_at = event
                break
    if matched_at is None:
        raise RuntimeError("the backend ended a stream without a result")
    completion_tokens = matched_at.completion_tokens
    if completion_tokens is None:
        completion_tokens = record.completion_tokens
    usage = Usage(record.prompt_tokens, completion_tokens)
    yield GenerationEnd(FinishReason.STOP_SEQUENCE, usage, matcher.matched)


def coalesce_deltas(deltas: Sequence[TextDelta]) -> TextDelta:
    """Several consecutive deltas as one: their text and their log-probabilities, in order.

    For a consumer that is behind: one message instead of many, the concatenated text
    and the tokens' log-probabilities unchanged.
    """
    return TextDelta(
        "".join(delta.text for delta in deltas),
        deltas[-1].completion_tokens,
        tuple(entry for delta in deltas for entry in delta.logprobs),
    )


async def join(
    events: GenerationEvents, record: CountedProgress
) -> tuple[str, GenerationEnd, tuple[TokenLogprob, ...]]:
    """The text of a generation's deltas, its end, and its tokens' log-probabilities;
    the record counts the tokens as they come (a failure mid-way has its count)."""
    pieces: list[str] = []
    logprobs: list[TokenLogprob] = []
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, TextDelta):
                pieces.append(event.text)
                logprobs.extend(event.logprobs)
                if event.completion_tokens is not None:
                    record.completion_tokens = event.completion_tokens
            else:
                return "".join(pieces), event, tuple(logprobs)
    raise RuntimeError("the backend ended a stream without a result")

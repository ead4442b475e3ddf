"""A generation's path through the core, from its arrival to its record's end.

The gate (core/request_gate.py) validates it, lets its tenant's quotas admit it, loads its
model if needed, refuses it unless the model is READY and holds a slot for it; this runs
it on the backend, unary or streamed, as `n` choices, with stop strings and tool calls.
The model manager (core/manager.py) holds the models and their lifecycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

from inferwire.core.backend import CountedProgress, GenerationEvents
from inferwire.core.chat import ChatMessage, ToolCall
from inferwire.core.choices import ChoiceProgress, choice_jobs, merged
from inferwire.core.facts import ModelFacts
from inferwire.core.generation import generation_request, join, stop_at_sequences
from inferwire.core.models import ManagedModel, find_model
from inferwire.core.quotas import TokenCharge
from inferwire.core.record import Outcome, RequestRecord
from inferwire.core.request_gate import RequestGate
from inferwire.core.requests import GenerationRequest, InferenceRequest
from inferwire.core.results import (
    Choice,
    FinishReason,
    InferenceResult,
    StreamChunk,
    TextDelta,
    Tokenization,
)
from inferwire.core.tool_calls import ToolCallParser
from inferwire.core.tracing import GENERATE
from inferwire.core.validation import RequestLimits, validate_inference_request, validate_text_input


class RequestPath:
    """Runs requests, unary or streamed, on the manager's models."""

    def __init__(self, gate: RequestGate, limits: RequestLimits, keep_text: bool) -> None:
        """`keep_text`: keep each request's prompt and output text in its record."""
        self._gate = gate
        self._models = gate.models
        self._lifecycle = gate.lifecycle
        self._limits = limits
        self._keep_text = keep_text

    async def infer(self, request: InferenceRequest) -> InferenceResult:
        """Unary generation through the backend's own `infer`."""
        record = self._arrived(request)
        async with self._admitted(request, record) as (model, job, _):
            count = job.params.n or 1
            if count == 1:
                choices = [await self._choice(model, job, record, 0)]
            else:
                progresses: list[ChoiceProgress] = []
                choices = list(
                    await asyncio.gather(
                        *(
                            self._choice(model, choice, ChoiceProgress(record, progresses), i)
                            for i, choice in enumerate(choice_jobs(job, count))
                        )
                    )
                )
            first = choices[0].choice
            record.tool_calls = sum(len(answer.choice.tool_calls) for answer in choices)
            if record.text is not None:
                record.text.extend(answer.choice.text for answer in choices)
            record.end(Outcome.finished(choices[0].ended))
            return InferenceResult(
                request_id=record.request_id,
                model=request.model,
                backend=model.spec.backend,
                text=first.text,
                finish_reason=first.finish_reason,
                usage=record.usage(),
                timing=record.timing(),
                logprobs=first.logprobs,
                tool_calls=first.tool_calls,
                choices=tuple(answer.choice for answer in choices) if count > 1 else (),
                stop_sequence=first.stop_sequence,
            )

    async def _choice(
        self,
        model: ManagedModel,
        job: GenerationRequest,
        progress: RequestRecord | ChoiceProgress,
        index: int,
    ) -> _Answer:
        """One choice, whole: its text, calls and finish reason."""
        events = self._events(model, job, progress, unary=True)
        text, end, logprobs = await join(events, progress)
        progress.counted(end.usage.prompt_tokens, end.usage.completion_tokens)
        reason, calls = end.finish_reason, tuple[ToolCall, ...]()
        if (parser := _parser(job)) is not None:
            head, _ = parser.feed(text)
            tail, _ = parser.finish()
            text, calls, reason = head + tail, parser.calls, parser.finish_reason(reason)
        choice = Choice(index, text, reason, logprobs, calls, end.stop_sequence)
        return _Answer(choice, end.finish_reason)

    def infer_stream(
        self, request: InferenceRequest
    ) -> tuple[str, AsyncGenerator[StreamChunk, None]]:
        """Return the request ID in use and its chunks; the last chunk carries the outcome."""
        record = self._arrived(request)
        return record.request_id, self._stream(request, record)

    async def _stream(
        self, request: InferenceRequest, record: RequestRecord
    ) -> AsyncGenerator[StreamChunk, None]:
        async with self._admitted(request, record) as (model, job, charge):
            count = job.params.n or 1
            ended_by: dict[int, FinishReason] = {}  # each choice's end, as the engine said
            if count == 1:
                chunks = self._choice_chunks(model, job, record, charge, ended_by)
            else:
                progresses: list[ChoiceProgress] = []
                chunks = merged(
                    [
                        self._choice_chunks(
                            model, choice, ChoiceProgress(record, progresses), charge, ended_by, i
                        )
                        for i, choice in enumerate(choice_jobs(job, count))
                    ]
                )
            ends = 0  # choices whose end came out: another's may be in `ended_by`, queued
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    ends += chunk.finish_reason is not None
                    if chunk.finish_reason is None or ends < count:
                        yield chunk  # text, or a choice's end while others run
                        continue
                    record.end(Outcome.finished(ended_by[0]))
                    yield dataclasses.replace(chunk, usage=record.usage(), timing=record.timing())

    async def _choice_chunks(
        self,
        model: ManagedModel,
        job: GenerationRequest,
        progress: RequestRecord | ChoiceProgress,
        charge: TokenCharge,
        ended_by: dict[int, FinishReason],
        index: int = 0,
    ) -> AsyncGenerator[StreamChunk, None]:
        """One choice's chunks, ending with one that holds its finish reason (and the
        engine's own, before a tool call renamed it, in `ended_by[index]`)."""
        record = progress.record if isinstance(progress, ChoiceProgress) else progress
        events = self._events(model, job, progress, unary=False)
        kept = record.text
        parser = _parser(job)
        async with contextlib.aclosing(events):
            async for event in events:
                if isinstance(event, TextDelta):
                    if event.completion_tokens is not None:
                        progress.completion_tokens = event.completion_tokens
                        charge.up_to(record.completion_tokens)  # as they are produced
                    if kept is not None:
                        kept.append(event.text)
                    if parser is None:
                        yield StreamChunk(
                            event.text, logprobs=event.logprobs, tokens=event.completion_tokens
                        )
                        continue
                    text, calls = parser.feed(event.text)
                    if text or calls:
                        yield StreamChunk(
                            text, tokens=event.completion_tokens, tool_calls=tuple(calls)
                        )
                else:
                    reason = event.finish_reason
                    progress.counted(event.usage.prompt_tokens, event.usage.completion_tokens)
                    if parser is not None:
                        text, calls = parser.finish()
                        if text or calls:
                            yield StreamChunk(text, tool_calls=tuple(calls))
                        reason = parser.finish_reason(reason)
                        record.tool_calls += len(parser.calls)
                    ended_by[index] = event.finish_reason
                    yield StreamChunk("", finish_reason=reason, stop_sequence=event.stop_sequence)

    async def tokenize(
        self, model_name: str, prompt: str, messages: tuple[ChatMessage, ...]
    ) -> Tokenization:
        """The token ids a model sees for a prompt, or for messages through its chat template.

        Takes no concurrency slot: tokenizing costs little next to generating.
        """
        validate_text_input(model_name, prompt, messages, self._limits)
        model = find_model(self._models, model_name)
        model.used(time.monotonic(), time.time())
        await self._lifecycle.ensure_loaded(model, deadline=None)
        model.require_ready()
        rendered = model.backend.render_chat(messages) if messages else ""
        token_ids = await model.backend.tokenize(rendered if messages else prompt)
        return Tokenization(tuple(token_ids), rendered)

    async def render(self, request: InferenceRequest) -> Tokenization:
        """The token ids generation would feed the engine for `request` (vLLM's render
        routes): the same validation and the same prompt (template, tools, context) as
        running it, tokenized by the model; takes no slot and generates nothing."""
        validate_inference_request(request, self._limits)
        model = find_model(self._models, request.model)
        model.used(time.monotonic(), time.time())
        await self._lifecycle.ensure_loaded(model, request.deadline)
        facts = model.require_ready()
        job = generation_request(model, facts, request, request.request_id or "render")
        token_ids = await model.backend.tokenize(job.prompt)
        return Tokenization(tuple(token_ids), job.prompt if request.messages else "")

    async def detokenize(self, model_name: str, token_ids: Sequence[int]) -> str:
        """The text of `token_ids` for a model (vLLM's /detokenize); takes no slot either."""
        model = find_model(self._models, model_name)
        model.used(time.monotonic(), time.time())
        await self._lifecycle.ensure_loaded(model, deadline=None)
        model.require_ready()
        return await model.backend.detokenize(token_ids)

    def _arrived(self, request: InferenceRequest) -> RequestRecord:
        keep = self._keep_text
        return self._gate.arrived(
            request, prompt=request.prompt if keep else "", text=[] if keep else None
        )

    @staticmethod
    def _events(
        model: ManagedModel, job: GenerationRequest, record: CountedProgress, unary: bool
    ) -> GenerationEvents:
        backend = model.backend
        events = (backend.infer if unary else backend.infer_stream)(job, record)
        stops = job.params.stop
        # Without stop strings the backend's events pass as they are: no extra
        # generator hop on every token.
        return stop_at_sequences(events, stops, record) if stops else events

    @contextlib.asynccontextmanager
    async def _admitted(
        self, request: InferenceRequest, record: RequestRecord
    ) -> AsyncIterator[tuple[ManagedModel, GenerationRequest, TokenCharge]]:
        """Run one request, unary or streamed, through the gate (core/request_gate.py)."""

        def job_of(model: ManagedModel, facts: ModelFacts) -> GenerationRequest:
            return generation_request(model, facts, request, record.request_id)

        validate = functools.partial(validate_inference_request, request, self._limits)
        async with self._gate.admitted(request, record, validate, job_of) as held:
            job = held.prepared
            if held.grant.reserved:  # the backend starts it without waiting for others
                job = dataclasses.replace(job, reserved=True)
            with self._gate.tracer.span(GENERATE):
                yield held.model, job, held.admission.charge


@dataclasses.dataclass(frozen=True)
class _Answer:
    """A choice, and how its engine ended it (its outcome: a call's end is the model's)."""

    choice: Choice
    ended: FinishReason


def _parser(job: GenerationRequest) -> ToolCallParser | None:
    """The parser of the calls a job may make; None for a job without tools."""
    if not job.tools:
        return None
    constraint = job.params.constraint
    return ToolCallParser(job.tools, constrained=constraint is not None, syntax=job.tool_syntax)

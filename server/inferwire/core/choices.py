"""`n` choices of one request (OpenAI's `n`): each a generation of its own on the backend,
sharing the request's record, concurrency slot and quota.

Choice i samples with the request's seed plus i (a seeded request's every choice
reproduces; unseeded, each draws its own), and its stop strings and tool calls are its
own. A backend that keeps prompts in its KV slots reads the prompt once: the continuous
path copies the first choice's prompt into each other choice's slot (continuous/loop.py).
The record counts the prompt once and the completion tokens of every choice, as OpenAI's
`usage` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncGenerator, Sequence

from inferwire.core.record import RequestRecord
from inferwire.core.requests import GenerationRequest
from inferwire.core.results import StreamChunk
from inferwire.core.tracing import Tracer

_QUEUED_CHUNKS = 4  # per choice: a slow reader holds the choices back, as it holds one


class ChoiceProgress:
    """One choice's `GenerationProgress` (core/backend.py): its own token counts, summed
    into the request's record, and its first token the record's if it is the first."""

    def __init__(self, record: RequestRecord, siblings: list[ChoiceProgress]) -> None:
        self.record = record
        self.tracer: Tracer = record.tracer
        self.prompt_tokens = 0
        self._completion_tokens = 0
        self._siblings = siblings
        siblings.append(self)

    @property
    def completion_tokens(self) -> int:
        return self._completion_tokens

    @completion_tokens.setter
    def completion_tokens(self, count: int) -> None:
        self._completion_tokens = count
        self.record.counted(completion_tokens=sum(s._completion_tokens for s in self._siblings))

    def first_token(self, at: float | None = None) -> None:
        self.record.first_token(at)  # the record keeps the first of them

    def counted(
        self, prompt_tokens: int | None = None, completion_tokens: int | None = None
    ) -> None:
        if prompt_tokens is not None:
            self.prompt_tokens = prompt_tokens
            self.record.counted(prompt_tokens=prompt_tokens)
        if completion_tokens is not None:
            self.completion_tokens = completion_tokens

    def generated_after_cancel(self, count: int = 1) -> None:
        self.record.generated_after_cancel(count)


def choice_jobs(job: GenerationRequest, count: int) -> list[GenerationRequest]:
    """The backend's request for each choice: choice i's seed is the request's plus i."""
    seed = job.params.seed
    return [
        dataclasses.replace(
            job,
            params=dataclasses.replace(job.params, seed=None if seed is None else seed + index),
        )
        for index in range(count)
    ]


async def merged(
    streams: Sequence[AsyncGenerator[StreamChunk, None]],
) -> AsyncGenerator[StreamChunk, None]:
    """The chunks of every choice's stream as they come, each marked with its choice; a
    failure in one ends them all with it, and closing this closes them all."""
    queue: asyncio.Queue[tuple[int, StreamChunk | BaseException | None]] = asyncio.Queue(
        _QUEUED_CHUNKS * len(streams)
    )

    async def pump(index: int, stream: AsyncGenerator[StreamChunk, None]) -> None:
        try:
            async with contextlib.aclosing(stream):
                async for chunk in stream:
                    await queue.put((index, dataclasses.replace(chunk, choice=index)))
            await queue.put((index, None))
        except Exception as exc:  # handed to the reader, which raises it
            await queue.put((index, exc))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            _, item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

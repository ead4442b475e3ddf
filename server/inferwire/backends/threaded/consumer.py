"""What both paths share: the consumer's side of a request's events (a `Channel` on its
event loop, which the producing thread fills through a `delivery.Outbox`: at most one
hand-over per `stream_interval_ms` unless urgent, one wake-up of the loop at a time), and
the counting of its tokens (`TokenTally`).

A path makes a `Producer` per request and returns `consume(...)`: the consumer's loop,
which takes every ready delta as one when it is behind (`coalesce_deltas`, so the number
of stream messages depends on timing), tells the producer what it took (flow control),
and, when the consumer leaves before the end (client cancel, deadline, stop string),
stops the producer and waits until it holds nothing of the request, so every count is
reported when the stream is closed.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Protocol

from inferwire.core.backend import GenerationEvents, GenerationProgress
from inferwire.core.generation import coalesce_deltas
from inferwire.core.results import FinishReason, GenerationEnd, TextDelta, Usage

# What a request's producer hands its consumer: a delta, the end, or an error to re-raise.
StreamEvent = TextDelta | GenerationEnd | BaseException


class Channel:
    """One request's items on their way to its consumer; used on the consumer's loop only
    (its producer's thread hands items over through a `delivery.Outbox`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._items: collections.deque[StreamEvent] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: StreamEvent) -> None:
        self._items.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def put_all(self, items: list[StreamEvent]) -> None:
        self._items.extend(items)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def get(self) -> StreamEvent:
        while not self._items:
            self._waiter = self.loop.create_future()
            await self._waiter
        return self._items.popleft()

    def take_deltas(self) -> list[TextDelta]:
        """The deltas ready at the front, without waiting."""
        deltas = []
        while self._items and isinstance(self._items[0], TextDelta):
            deltas.append(self._items.popleft())
        return deltas  # type: ignore[return-value]


class Producer(Protocol):
    """The side of one request that runs it and puts its items on its channel."""

    def start(self) -> Awaitable[object]:
        """Begin; returns what is done once the producer holds nothing of the request."""

    def taken(self, deltas: int) -> None:
        """The consumer took this many deltas."""

    def stop(self) -> None:
        """The consumer left before the end: stop generating."""


@dataclass(eq=False)
class TokenTally:
    """One request's token counts, kept by the thread that generates it; its first token
    and any token made after its consumer left are reported to the core as they happen."""

    progress: GenerationProgress
    prompt_tokens: int
    generated: int = 0

    def count(self, after_cancel: bool) -> int:
        """Count a token the engine produced; after_cancel: the consumer had already left.

        Returns the request's completion tokens so far."""
        self.generated += 1
        if self.generated == 1:
            self.progress.first_token()
        if after_cancel:
            self.progress.generated_after_cancel()
        return self.generated

    def end(self, reason: FinishReason) -> GenerationEnd:
        return GenerationEnd(reason, Usage(self.prompt_tokens, self.generated))


async def consume(
    channel: Channel, producer: Producer, tally: TokenTally, coalesce: bool
) -> GenerationEvents:
    """The request's deltas, then its end (or its error)."""
    released = producer.start()
    ended = False
    try:
        while True:
            item = await channel.get()
            if isinstance(item, TextDelta):
                deltas = [item, *channel.take_deltas()] if coalesce else [item]
                producer.taken(len(deltas))
                yield coalesce_deltas(deltas) if len(deltas) > 1 else item
                continue
            ended = True
            if isinstance(item, BaseException):
                raise item
            yield item
            return
    finally:
        if not ended:
            producer.stop()
        await asyncio.shield(released)
        if not ended:  # closed early: what it made, delivered or not, is now final
            tally.progress.counted(completion_tokens=tally.generated)

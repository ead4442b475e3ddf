"""A request served by a thread that serves many at once (a batching step loop), and the
hand-over of its items to its consumer: both the onnxruntime-genai engine path and the
llama.cpp step loop build on these.

Flow control: a request whose consumer has `BUFFERED_DELTAS` undelivered deltas is set
aside by its step loop (`paused`); once its consumer has read down to `RESUME_AT` it sends
`resume`. Large enough that an event loop delayed for a few steps (two shared cores) does
not set a healthy stream aside.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from inferwire.backends.threaded.consumer import Channel, StreamEvent, TokenTally
from inferwire.backends.threaded.delivery import Outbox
from inferwire.core.results import TextDelta

BUFFERED_DELTAS = 64
RESUME_AT = 16

Command = Literal["start", "cancel", "resume"]


class Released:
    """Delivered last to a request's consumer: the thread holds nothing of it any more."""


RELEASED = Released()


@dataclass(eq=False, kw_only=True)
class SharedThreadRequest:
    """One request on a shared thread; its consumer's `Producer`. Subclasses add what
    their thread keeps of it."""

    send: Callable[[Command, SharedThreadRequest], None]  # to the thread's inbox
    tally: TokenTally
    channel: Channel
    released: asyncio.Future[None]  # done once the thread holds nothing of the request
    consumed: int = 0  # deltas taken by the consumer (written by the loop only)
    emitted: int = 0  # deltas handed to the loop (written by the thread only)
    closed: bool = False  # the consumer left; set by the loop, read by the thread
    paused: bool = False  # set aside for a slow consumer (the thread's)
    resume_sent: bool = False

    @property
    def unread(self) -> int:
        return self.emitted - self.consumed

    def start(self) -> asyncio.Future[None]:
        self.send("start", self)
        return self.released

    def taken(self, deltas: int) -> None:
        self.consumed += deltas
        if self.paused and not self.resume_sent and self.unread <= RESUME_AT:
            self.resume_sent = True
            self.send("resume", self)

    def stop(self) -> None:
        self.closed = True
        self.send("cancel", self)


Delivery = tuple[SharedThreadRequest, StreamEvent | Released]


class Handover:
    """The thread's side of its requests' items: one `Outbox` for all of them."""

    def __init__(self, interval_s: float, outbox: Outbox[Delivery] | None = None) -> None:
        self.outbox: Outbox[Delivery] = outbox or Outbox(deliver, interval_s)

    def emit(self, request: SharedThreadRequest, item: StreamEvent) -> None:
        urgent = True  # an end or an error
        if isinstance(item, TextDelta):
            request.emitted += 1
            # A first token goes at once; and so does a request's text before its unread
            # deltas near BUFFERED_DELTAS, which would set it aside for want of a hand-over.
            urgent = request.emitted == 1 or request.unread >= RESUME_AT
        self.outbox.add(request.channel.loop, (request, item), urgent)

    def release(self, request: SharedThreadRequest) -> None:
        self.outbox.add(request.channel.loop, (request, RELEASED), urgent=True)

    def flush(self, force: bool) -> None:
        self.outbox.flush(force=force)


def deliver(items: list[Delivery]) -> None:
    """On a consumer's loop: its requests' items, in order."""
    for request, item in items:
        if isinstance(item, Released):
            if not request.released.done():
                request.released.set_result(None)
        else:
            request.channel.put(item)

"""The engine scheduler's hand-over of items to the event loops its consumers run on.

Every hand-over costs both threads: a wake-up of the loop (a write to its self-pipe),
the GIL passed from the scheduler to the loop and back, and a stream message per
consumer. So the scheduler hands over at most once per `interval_s` (the backend's
`stream_interval_ms`); the tokens made meanwhile reach each consumer together, and it
writes them as one message (consumer.py coalesces what is ready). A first token, an end,
an error or a release go at once. And a loop that has not yet run the previous hand-over
is not woken again: it takes the later items with it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")


class Outbox(Generic[Item]):
    """Items on their way from the scheduler thread to event loops, grouped by loop."""

    def __init__(self, deliver: Callable[[list[Item]], None], interval_s: float) -> None:
        self._deliver = deliver  # runs on the loop with that loop's items, in order
        self._interval_s = interval_s
        self._next_at = 0.0
        self._urgent = False
        self._collected: dict[asyncio.AbstractEventLoop, list[Item]] = {}  # scheduler only
        self._handed: dict[asyncio.AbstractEventLoop, list[Item]] = {}  # under _lock
        self._lock = threading.Lock()

    def add(self, loop: asyncio.AbstractEventLoop, item: Item, urgent: bool) -> None:
        """Collect one item (scheduler thread); `urgent`: hand it over at the next flush."""
        self._collected.setdefault(loop, []).append(item)
        self._urgent = self._urgent or urgent

    def flush(self, force: bool = False) -> None:
        """Hand the collected items over if one is urgent, `force`, or the interval passed."""
        if not self._collected:
            return
        now = time.perf_counter()
        if not (force or self._urgent or now >= self._next_at):
            return
        self._next_at, self._urgent = now + self._interval_s, False
        wake = []
        with self._lock:
            for loop, items in self._collected.items():
                handed = self._handed.get(loop)
                if handed is None:
                    self._handed[loop] = items
                    wake.append(loop)
                else:
                    handed.extend(items)
        self._collected = {}
        for loop in wake:
            try:
                loop.call_soon_threadsafe(self._take, loop)
            except RuntimeError:  # a closed loop has nobody waiting
                with self._lock:
                    self._handed.pop(loop, None)

    def _take(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            items = self._handed.pop(loop, [])
        self._deliver(items)

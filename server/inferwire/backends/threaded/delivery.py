"""The hand-over of items from a generating thread to the event loops of their consumers,
on both paths: the og.Engine step loop's (one `Outbox` for every row) and each per-request
generator's (one `Outbox` per request).

Every hand-over costs both threads: a wake-up of the loop (a write to its self-pipe),
the GIL passed from the thread to the loop and back, and a stream message per consumer.
So a thread hands over at most once per `interval_s` (the backend's `stream_interval_ms`);
the tokens made meanwhile reach each consumer together, and it writes them as one message
(consumer.py coalesces what is ready). A first token, an end, an error or a release go at
once (urgent), and so does everything when the thread is about to wait (a forced flush).
And a loop that has not yet run the previous hand-over is not woken again: it takes the
later items with it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

HandedItem = TypeVar("HandedItem")  # whatever one outbox carries


class Outbox(Generic[HandedItem]):
    """Items on their way from one producing thread to event loops, grouped by loop."""

    def __init__(self, deliver: Callable[[list[HandedItem]], None], interval_s: float) -> None:
        self._deliver = deliver  # runs on the loop with that loop's items, in order
        self._interval_s = interval_s
        self._next_at = 0.0  # so the first items go at once
        self._urgent = False
        self._collected: dict[asyncio.AbstractEventLoop, list[HandedItem]] = {}  # producer only
        self._handed: dict[asyncio.AbstractEventLoop, list[HandedItem]] = {}  # under _lock
        self._lock = threading.Lock()

    def add(self, loop: asyncio.AbstractEventLoop, item: HandedItem, urgent: bool) -> None:
        """Collect one item (producing thread); `urgent`: hand it over at the next flush."""
        collected = self._collected.get(loop)
        if collected is None:
            self._collected[loop] = [item]
        else:
            collected.append(item)
        if urgent:
            self._urgent = True

    def flush(self, force: bool = False) -> None:
        """Hand the collected items over if one is urgent, the interval passed, or `force`.

        Urgent items and the interval restart the interval; a forced flush (the thread is
        about to wait) leaves it as it was, since the interval did not choose it."""
        if not self._collected:
            return
        if self._urgent or not force:
            now = time.perf_counter()
            if not self._urgent and now < self._next_at:
                return
            self._next_at, self._urgent = now + self._interval_s, False
        collected, self._collected = self._collected, {}
        self.hand_over(collected)

    def hand_over(self, collected: dict[asyncio.AbstractEventLoop, list[HandedItem]]) -> None:
        """Give the loops their items: wake each loop that has not yet taken its last ones."""
        wake = []
        with self._lock:
            for loop, items in collected.items():
                handed = self._handed.get(loop)
                if handed is None:
                    self._handed[loop] = items
                    wake.append(loop)
                else:
                    handed.extend(items)
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

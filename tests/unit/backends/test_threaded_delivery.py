"""The hand-over to event loops that both paths use (delivery.Outbox), on its own and
filling a request's consumer.Channel: items arrive in order, a loop still to run one
hand-over is not woken again, and the interval holds items back unless one is urgent or
the flush forced.

No engine here: the hand-overs are driven from the loop's own thread, so what is
scheduled and what has run are both known without timing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from inferwire.backends.threaded import delivery
from inferwire.backends.threaded.consumer import Channel, StreamEvent
from inferwire.backends.threaded.delivery import Outbox

HOUR_S = 3600.0  # an interval no test outlasts: items held by it stay held


def count_wake_ups(loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    schedule = loop.call_soon_threadsafe

    def counting(callback: Any, *args: Any) -> asyncio.Handle:
        calls[0] += 1
        return schedule(callback, *args)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counting)
    return calls


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_a_loop_still_to_run_a_hand_over_is_not_woken_again(monkeypatch):
    loop = asyncio.get_running_loop()
    wake_ups = count_wake_ups(loop, monkeypatch)
    delivered: list[list[int]] = []
    outbox: Outbox[int] = Outbox(delivered.append, interval_s=0.0)
    for item in (1, 2, 3):
        outbox.add(loop, item, urgent=False)
        outbox.flush()
    await settle()
    assert delivered == [[1, 2, 3]]
    assert wake_ups[0] == 1
    outbox.add(loop, 4, urgent=False)
    outbox.flush()
    await settle()
    assert delivered == [[1, 2, 3], [4]]
    assert wake_ups[0] == 2


async def test_the_interval_holds_items_unless_one_is_urgent_or_the_flush_forced():
    loop = asyncio.get_running_loop()
    delivered: list[list[str]] = []
    outbox: Outbox[str] = Outbox(delivered.append, interval_s=HOUR_S)
    outbox.add(loop, "first", urgent=False)
    outbox.flush()  # nothing handed over yet: the interval has not started
    await settle()
    outbox.add(loop, "held", urgent=False)
    outbox.flush()
    await settle()
    assert delivered == [["first"]]
    outbox.add(loop, "end", urgent=True)
    outbox.flush()
    await settle()
    assert delivered == [["first"], ["held", "end"]]
    outbox.add(loop, "last", urgent=False)
    outbox.flush(force=True)
    await settle()
    assert delivered == [["first"], ["held", "end"], ["last"]]


async def test_items_for_a_closed_loop_are_dropped_and_others_still_delivered():
    closed = asyncio.new_event_loop()
    closed.close()
    loop = asyncio.get_running_loop()
    delivered: list[list[str]] = []
    outbox: Outbox[str] = Outbox(delivered.append, interval_s=0.0)
    for _ in range(2):  # the second time too: nothing of the closed loop's is kept
        outbox.add(closed, "nobody waits", urgent=True)
        outbox.add(loop, "waited for", urgent=True)
        outbox.flush()
        await settle()
    assert delivered == [["waited for"], ["waited for"]]


async def test_a_channel_moves_items_in_order_with_one_wake_up_while_the_loop_is_busy(
    monkeypatch,
):
    loop = asyncio.get_running_loop()
    wake_ups = count_wake_ups(loop, monkeypatch)
    channel = Channel(loop)
    outbox: Outbox[StreamEvent] = Outbox(channel.put_all, interval_s=0.0)

    def hand_over(*names: str) -> None:
        for name in names:
            outbox.add(loop, ValueError(name), urgent=False)
        outbox.flush()

    hand_over("a", "b")
    hand_over("c")  # the first hand-over has not run yet: it takes this
    hand_over()
    got = [str(await channel.get()) for _ in range(3)]
    assert got == ["a", "b", "c"]
    assert wake_ups[0] == 1
    hand_over("d")
    assert str(await channel.get()) == "d"
    assert wake_ups[0] == 2


async def test_a_forced_flush_hands_over_at_once_and_leaves_the_interval_as_it_was(
    monkeypatch,
):
    """As the per-request path needs it: held deltas go before the worker waits for credit,
    and the next one is held only until the interval that was running ends."""
    clock = [0.0]
    monkeypatch.setattr(delivery.time, "perf_counter", lambda: clock[0])
    loop = asyncio.get_running_loop()
    delivered: list[list[str]] = []
    outbox: Outbox[str] = Outbox(delivered.append, interval_s=10.0)
    outbox.add(loop, "first", urgent=False)
    outbox.flush()  # at 0: the interval runs to 10
    await settle()
    clock[0] = 5.0
    outbox.add(loop, "held", urgent=False)
    outbox.flush()
    await settle()
    assert delivered == [["first"]]
    outbox.flush(force=True)
    await settle()
    assert delivered == [["first"], ["held"]]
    clock[0] = 10.0
    outbox.add(loop, "next", urgent=False)
    outbox.flush()
    await settle()
    assert delivered == [["first"], ["held"], ["next"]]

"""A model's admission queue runs requests in its slots, queues the rest up to max_queue,
reports its counts as they change, and is idle only while nothing runs or waits."""

from __future__ import annotations

import asyncio

import pytest

from inferwire.core.admission import AdmissionQueue
from inferwire.core.errors import QueueFullError
from inferwire.core.specs import ModelSpec
from inferwire.core.tracing import NO_TRACER
from tests.support.fake_backend import FAKE_BACKEND


def queue(reported: list[tuple[int, int]], max_queue: int = 1) -> AdmissionQueue:
    spec = ModelSpec(name="m", backend=FAKE_BACKEND, max_concurrency=1, max_queue=max_queue)
    return AdmissionQueue(spec, lambda name, queued, running: reported.append((queued, running)))


def holder(admission: AdmissionQueue, release: asyncio.Event):
    """A request that takes a slot (or waits for one) and holds it until `release`."""

    async def hold() -> None:
        async with admission.slot(NO_TRACER):
            await release.wait()

    return hold


async def test_a_request_past_the_queue_is_refused_and_a_queued_one_runs_when_the_slot_frees():
    reported: list[tuple[int, int]] = []
    admission = queue(reported)
    release = asyncio.Event()
    hold = holder(admission, release)
    first = asyncio.create_task(hold())
    await asyncio.sleep(0)
    second = asyncio.create_task(hold())
    await asyncio.sleep(0)
    assert (admission.running, admission.queued) == (1, 1)
    with pytest.raises(QueueFullError, match="1 running and 1 queued"):
        async with admission.slot(NO_TRACER):
            pass
    assert admission.requests_total == 2  # a refused request never counted
    release.set()
    await asyncio.gather(first, second)
    assert (admission.running, admission.queued) == (0, 0)
    # (queued, running) as each change happened: the second waited, then ran.
    assert reported == [(0, 1), (1, 1), (1, 0), (0, 0), (0, 1), (0, 0)]


async def test_it_is_idle_only_while_nothing_runs_or_waits_also_after_a_failure():
    admission = queue([])
    assert admission.idle.is_set()
    with pytest.raises(RuntimeError):
        async with admission.slot(NO_TRACER):
            assert not admission.idle.is_set()
            raise RuntimeError("the backend failed")
    assert admission.idle.is_set() and admission.slots.free == 1


async def test_a_queued_request_that_is_cancelled_leaves_the_queue_and_its_count():
    reported: list[tuple[int, int]] = []
    admission = queue(reported)
    release = asyncio.Event()
    hold = holder(admission, release)
    running = asyncio.create_task(hold())
    await asyncio.sleep(0)
    waiting = asyncio.create_task(hold())
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert admission.queued == 0 and not admission.idle.is_set()  # one still runs
    release.set()
    await running
    assert admission.idle.is_set() and reported[-1] == (0, 0)

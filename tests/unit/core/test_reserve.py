"""Reserved headroom: slots batch (and standard) requests may not take (core/reserve.py).

On the fake backend with a fixed step time, and on the scheduler's queue alone. The
step-time test counts steps, not milliseconds: an interactive request is admitted while
the batch streams it waits beside have moved at most one step.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable

import pytest
from pydantic import ValidationError

from inferwire.core.facts import ModelLimits
from inferwire.core.manager import ModelManager, ModelSpec
from inferwire.core.requests import InferenceRequest, Priority
from inferwire.core.reserve import Reservation, ReservedConcurrency
from inferwire.core.sampling import GenerationParams
from inferwire.core.scheduling import Claim, FairQueue, Grant
from inferwire.core.tenants import TenantConfig, Tenants, TenantSettings
from inferwire.core.validation import RequestLimits
from tests.support.fake_backend import FAKE_BACKEND, FakeBackends

SLOTS = 4
STEP_S = 0.01
LONG = 1000  # steps of a batch stream


def _manager(
    reserved: ReservedConcurrency | None = None, slots: int = SLOTS, interactive: bool = True
) -> tuple[ModelManager, FakeBackends]:
    tenants = [TenantConfig(name="nightly", priority="batch")]
    if interactive:
        tenants.append(TenantConfig(name="chat", priority="interactive"))
    tenants.append(TenantConfig(name="api", priority="standard"))
    spec = ModelSpec(
        name="m",
        backend=FAKE_BACKEND,
        load_on_startup=True,
        max_concurrency=slots,
        max_queue=64,
        reserved_concurrency=reserved,
    )
    backends = FakeBackends()
    manager = ModelManager(
        [spec], backends, RequestLimits(max_prompt_bytes=1024), tenants=Tenants(tenants)
    )
    return manager, backends


def _request(request_id: str, tenant: str, max_tokens: int) -> InferenceRequest:
    params = GenerationParams(max_tokens=max_tokens)
    return InferenceRequest(request_id, "m", "hi", params=params, tenant=tenant)


async def _until(condition: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    """Wait until `condition` holds, checking it every event-loop turn."""
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError("the condition never held")
        await asyncio.sleep(0)


async def _load(manager: ModelManager) -> tuple[int, int]:
    """The model's (running, queued)."""
    report = (await manager.health_report("m")).models[0]
    return report.inflight, report.queued


async def test_every_unreserved_slot_held_by_long_batch_streams_interactive_gets_in() -> None:
    manager, backends = _manager()  # the default: one interactive slot of 4
    backend = backends["m"]
    backend.pieces = ["w "] * LONG
    backend.limits_ = ModelLimits(context_length=4096, max_output_tokens=LONG)
    backend.step_s = STEP_S
    await manager.start()
    steps: dict[str, int] = {}
    running_seen: list[int] = []

    async def batch_stream(request_id: str) -> None:
        _, chunks = manager.infer_stream(_request(request_id, "nightly", LONG))
        async for _chunk in chunks:
            steps[request_id] = steps.get(request_id, 0) + 1
            running_seen.append((await manager.health_report("m")).models[0].inflight)

    async def three_run_two_wait() -> bool:
        return await _load(manager) == (SLOTS - 1, 2) and len(steps) == SLOTS - 1

    async def chat_started() -> bool:
        return any(r.request_id == "chat-1" for r in backend.calls.requests)

    streams = [asyncio.create_task(batch_stream(f"batch-{i}")) for i in range(SLOTS + 1)]
    late: asyncio.Task[object] | None = None
    try:
        # Three batch streams run (every unreserved slot), two wait.
        await _until(three_run_two_wait)
        await asyncio.sleep(3 * STEP_S)
        before = max(steps.values())
        quiet = asyncio.create_task(manager.infer(_request("chat-1", "chat", 2)))
        await _until(chat_started)
        assert max(steps.values()) - before <= 1  # admitted within one step
        result = await quiet
        assert result.timing.queue_ms < STEP_S * 1e3
        # The reserved slot is free again, and the waiting batch requests still wait.
        await asyncio.sleep(3 * STEP_S)
        assert await _load(manager) == (SLOTS - 1, 2)
        late = asyncio.create_task(manager.infer(_request("batch-late", "nightly", 2)))
        await asyncio.sleep(3 * STEP_S)
        assert await _load(manager) == (SLOTS - 1, 3) and not late.done()
        reserved = {r.request_id: r.reserved for r in backend.calls.requests}
        assert reserved == {"batch-0": False, "batch-1": False, "batch-2": False, "chat-1": True}
        assert max(running_seen) <= SLOTS
    finally:
        tasks = [*streams, *([late] if late is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await manager.close()


async def test_an_interactive_request_in_an_ordinary_slot_is_not_marked_reserved() -> None:
    manager, backends = _manager()
    await manager.start()
    try:
        await manager.infer(_request("alone", "chat", 2))
        await manager.infer(_request("batch", "nightly", 2))
        assert [r.reserved for r in backends["m"].calls.requests] == [False, False]
    finally:
        await manager.close()


def _check(queue: FairQueue) -> None:
    reservation = queue.reservation
    held = {p: queue.held(p) for p in Priority}
    assert sum(held.values()) <= reservation.slots
    assert held[Priority.STANDARD] + held[Priority.BATCH] <= reservation.cap(Priority.STANDARD)
    assert held[Priority.BATCH] <= reservation.cap(Priority.BATCH)


async def test_reserved_slots_never_exceed_max_concurrency_overall() -> None:
    """Random arrivals, cancellations and releases of every class: what is held never
    exceeds any cap, and no request waits while a slot its class may take is free."""
    rng = random.Random(36)
    for reservation in (Reservation(4, 1, 1), Reservation(3, 2), Reservation(5, 0, 3)):
        queue = FairQueue(reservation.slots, reservation=reservation)
        waiting: list[tuple[Priority, asyncio.Task[Grant]]] = []
        grants: list[Grant] = []
        for _ in range(600):
            action = rng.random()
            if action < 0.5:
                claim = Claim(f"t{rng.randrange(3)}", 1, rng.choice(list(Priority)))
                grant = queue.try_acquire(claim)
                if grant is not None:
                    grants.append(grant)
                else:
                    waiting.append((claim.priority, asyncio.create_task(queue.acquire(claim))))
            elif action < 0.6 and waiting:
                waiting.pop(rng.randrange(len(waiting)))[1].cancel()
            elif grants:
                queue.release(grants.pop(rng.randrange(len(grants))))
            await asyncio.sleep(0)
            for entry in [w for w in waiting if w[1].done()]:
                waiting.remove(entry)
                if not entry[1].cancelled():
                    grants.append(entry[1].result())
            _check(queue)
            assert len(grants) == sum(queue.held(p) for p in Priority)
            held = {p: queue.held(p) for p in Priority}
            for priority, _task in waiting:
                # Nobody waits while a slot its class may take is free.
                assert not reservation.admits(priority, held)
        for _priority, task in waiting:
            task.cancel()
        await asyncio.gather(*(task for _, task in waiting), return_exceptions=True)


async def test_standard_reserve_keeps_slots_from_batch_and_interactive_takes_the_rest() -> None:
    queue = FairQueue(4, reservation=Reservation(4, interactive=1, standard=1))
    interactive, standard, batch = (Claim("t", 1, p) for p in Priority)
    assert [queue.try_acquire(batch) for _ in range(2)] == [Grant(Priority.BATCH)] * 2
    assert queue.try_acquire(batch) is None  # 4 - 1 - 1 = 2 batch slots
    assert queue.try_acquire(standard) == Grant(Priority.STANDARD, reserved=True)
    assert queue.try_acquire(standard) is None  # standard and batch: 4 - 1 = 3
    assert queue.try_acquire(interactive) == Grant(Priority.INTERACTIVE, reserved=True)
    assert queue.try_acquire(interactive) is None  # all 4 held


async def test_a_batch_request_aged_by_max_wait_s_takes_a_standard_slot_as_standard() -> None:
    """It is admitted when it ages, with no slot released meanwhile (the queue wakes
    itself), and holds its slot as standard."""
    queue = FairQueue(2, max_wait_s=0.05, reservation=Reservation(2, standard=1))
    batch = Claim("nightly", 1, Priority.BATCH)
    assert queue.try_acquire(batch) == Grant(Priority.BATCH)
    started = time.monotonic()
    aged = await asyncio.wait_for(queue.acquire(batch), timeout=5)
    assert time.monotonic() - started >= 0.05
    assert aged == Grant(Priority.STANDARD, reserved=True)
    assert queue.held(Priority.STANDARD) == 1 and queue.free == 0
    queue.release(aged)
    assert queue.held(Priority.STANDARD) == 0 and queue.free == 1


@pytest.mark.parametrize(
    ("slots", "reserved", "interactive", "expected"),
    [
        (4, None, True, (1, 0)),  # the default
        (2, None, True, (1, 0)),
        (1, None, True, (0, 0)),  # one slot: nothing to keep
        (4, None, False, (0, 0)),  # no interactive tenant
        (4, ReservedConcurrency(), True, (0, 0)),  # {}: off
        (4, ReservedConcurrency(interactive=2, standard=1), False, (2, 1)),
    ],
)
def test_what_a_model_reserves(
    slots: int, reserved: ReservedConcurrency | None, interactive: bool, expected: tuple[int, int]
) -> None:
    reservation = Reservation.of(slots, reserved, interactive)
    assert (reservation.interactive, reservation.standard) == expected


def test_a_reserve_that_leaves_batch_no_slot_is_a_configuration_error() -> None:
    with pytest.raises(ValidationError, match="must leave batch requests at least one"):
        ModelSpec(
            name="m", max_concurrency=3, reserved_concurrency={"interactive": 2, "standard": 1}
        )
    with pytest.raises(ValidationError, match="batch"):
        ModelSpec(name="m", reserved_concurrency={"batch": 1})
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        ModelSpec(name="m", reserved_concurrency={"interactive": -1})
    # The default never fails: one slot of two or more.
    spec = ModelSpec(name="m", max_concurrency=2)
    assert spec.reserved_concurrency is None


async def test_list_models_says_what_is_reserved() -> None:
    manager, _ = _manager(ReservedConcurrency(interactive=1, standard=2), slots=8)
    await manager.start()
    try:
        assert "reserved slots: 1 interactive + 2 standard of 8" in manager.model_status("m").detail
    finally:
        await manager.close()
    manager, _ = _manager(ReservedConcurrency())
    await manager.start()
    try:
        assert "reserved" not in manager.model_status("m").detail
    finally:
        await manager.close()


def test_an_interactive_tenant_configured_or_default_turns_the_default_reserve_on() -> None:
    assert not Tenants([TenantConfig(name="nightly", priority="batch")]).interactive_configured
    assert Tenants([TenantConfig(name="chat", priority="interactive")]).interactive_configured
    assert Tenants(default=TenantSettings(priority="interactive")).interactive_configured

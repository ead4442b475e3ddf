"""Tenants in the model manager: priority-then-fair admission, aging, quotas, token debt.

On the fake backend, with a model of one slot held by a gated request: the order in which
queued requests reach the backend is their admission order, decided by the scheduler
alone (no step time, no wall clock). Quota and aging time comes from a fake clock.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import pytest

from inferwire.core.errors import PermissionDeniedError, QuotaExceededError
from inferwire.core.manager import ModelManager, ModelSpec
from inferwire.core.metrics import MetricsListener
from inferwire.core.quotas import (
    GENERATED_TOKENS_PER_MINUTE,
    MAX_CONCURRENCY,
    REQUESTS_PER_MINUTE,
)
from inferwire.core.requests import InferenceRequest, Priority
from inferwire.core.scheduling import Claim, FairQueue
from inferwire.core.tenants import SchedulingSettings, TenantConfig, Tenants, TenantSettings
from inferwire.core.validation import RequestLimits
from tests.support.fake_backend import FAKE_BACKEND, FakeBackends


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Harness:
    def __init__(
        self,
        *tenants: TenantConfig,
        max_wait_s: float = 60.0,
        queue: int = 128,
        metrics: MetricsListener | None = None,
    ):
        self.clock = FakeClock()
        self.backends = FakeBackends()
        self.tenants = Tenants(
            tenants, TenantSettings(), SchedulingSettings(max_wait_s=max_wait_s), self.clock
        )
        model = ModelSpec(
            name="m", backend=FAKE_BACKEND, load_on_startup=True, max_concurrency=1, max_queue=queue
        )
        self.manager = ModelManager(
            [model],
            self.backends,
            RequestLimits(max_prompt_bytes=1024),
            tenants=self.tenants,
            metrics=metrics,
        )
        self.tasks: list[asyncio.Task[object]] = []

    def submit(
        self, request_id: str, tenant: str = "", priority: Priority | None = None
    ) -> asyncio.Task[object]:
        request = InferenceRequest(request_id, "m", "hi", tenant=tenant, priority=priority)
        task: asyncio.Task[object] = asyncio.create_task(self.manager.infer(request))
        self.tasks.append(task)
        return task

    async def queued(self) -> int:
        return (await self.manager.health_report("m")).models[0].queued

    async def settle(self, queued: int) -> None:
        """Let the submitted requests reach the queue (no wall-clock wait: event-loop turns)."""
        for _ in range(1000):
            if await self.queued() == queued:
                return
            await asyncio.sleep(0)
        raise AssertionError(f"expected {queued} queued, have {await self.queued()}")

    def admitted(self) -> list[str]:
        return [r.request_id for r in self.backends["m"].calls.requests]

    @contextlib.contextmanager
    def holding_the_slot(self) -> Iterator[None]:
        self.backends["m"].generation_gate.close()
        try:
            yield
        finally:
            self.backends["m"].generation_gate.open()


@contextlib.asynccontextmanager
async def running(harness: Harness) -> AsyncIterator[Harness]:
    await harness.manager.start()
    try:
        yield harness
    finally:
        for task in harness.tasks:
            task.cancel()
        await asyncio.gather(*harness.tasks, return_exceptions=True)
        await harness.manager.close()


def tenant(name: str, **settings: object) -> TenantConfig:
    return TenantConfig(name=name, **settings)  # type: ignore[arg-type]


async def test_queued_interactive_goes_before_standard_and_batch_whatever_the_arrival() -> None:
    harness = Harness(
        tenant("chat", priority="interactive"),
        tenant("api", priority="standard"),
        tenant("nightly", priority="batch"),
    )
    async with running(harness):
        with harness.holding_the_slot():
            harness.submit("first", "api")
            await harness.settle(0)
            for i, name in enumerate(["nightly", "api", "chat", "nightly", "chat", "api"]):
                harness.submit(f"{name}-{i}", name)
            await harness.settle(6)
        await asyncio.gather(*harness.tasks)
    assert harness.admitted() == [
        "first",
        "chat-2",
        "chat-4",
        "api-1",
        "api-5",
        "nightly-0",
        "nightly-3",
    ]


async def test_a_request_may_lower_its_priority_but_not_raise_it() -> None:
    harness = Harness(tenant("api", priority="standard"))
    async with running(harness):
        with harness.holding_the_slot():
            harness.submit("first", "api")
            await harness.settle(0)
            harness.submit("lowered", "api", Priority.BATCH)
            harness.submit("own", "api")
            await harness.settle(2)
        await asyncio.gather(*harness.tasks)
        with pytest.raises(PermissionDeniedError, match=r"priority: interactive.*standard"):
            await harness.manager.infer(
                InferenceRequest("raised", "m", "hi", tenant="api", priority=Priority.INTERACTIVE)
            )
    assert harness.admitted() == ["first", "own", "lowered"]


async def test_a_batch_request_waiting_max_wait_s_ages_up_past_standard() -> None:
    harness = Harness(
        tenant("api", priority="standard"), tenant("nightly", priority="batch"), max_wait_s=60
    )
    async with running(harness):
        with harness.holding_the_slot():
            harness.submit("first", "api")
            await harness.settle(0)
            harness.submit("starved", "nightly")
            await harness.settle(1)
            harness.clock.now += 60  # the batch request has now waited max_wait_s
            harness.submit("fresh-batch", "nightly")
            harness.submit("standard-1", "api")
            harness.submit("standard-2", "api")
            await harness.settle(4)
        await asyncio.gather(*harness.tasks)
    assert harness.admitted() == ["first", "starved", "standard-1", "standard-2", "fresh-batch"]


async def test_tenants_of_one_priority_share_slots_by_weight() -> None:
    harness = Harness(tenant("heavy", weight=3), tenant("light", weight=1))
    async with running(harness):
        with harness.holding_the_slot():
            harness.submit("first", "other")
            await harness.settle(0)
            for i in range(32):
                harness.submit(f"light-{i}", "light")
            for i in range(32):
                harness.submit(f"heavy-{i}", "heavy")
            await harness.settle(64)
        await asyncio.gather(*harness.tasks)
    first_40 = harness.admitted()[1:41]
    heavy = sum(r.startswith("heavy") for r in first_40)
    assert abs(heavy - 30) <= 1, first_40
    assert abs((40 - heavy) - 10) <= 1, first_40


async def test_requests_per_minute_allows_a_burst_then_says_when_to_retry() -> None:
    harness = Harness(tenant("small", requests_per_minute=6))
    async with running(harness):
        for i in range(6):
            await harness.manager.infer(InferenceRequest(f"r{i}", "m", "hi", tenant="small"))
        with pytest.raises(QuotaExceededError) as refused:
            await harness.manager.infer(InferenceRequest("r6", "m", "hi", tenant="small"))
        assert refused.value.limit == REQUESTS_PER_MINUTE
        assert refused.value.tenant == "small"
        # One request's room refills in 60 s / 6 = 10 s.
        assert refused.value.retry_delay_s == pytest.approx(10.0, rel=0.2)
        harness.clock.now += 5
        with pytest.raises(QuotaExceededError) as again:
            await harness.manager.infer(InferenceRequest("r7", "m", "hi", tenant="small"))
        assert again.value.retry_delay_s == pytest.approx(5.0, rel=0.2)
        harness.clock.now += 5
        await harness.manager.infer(InferenceRequest("r8", "m", "hi", tenant="small"))
        # Another tenant is not limited by it.
        await harness.manager.infer(InferenceRequest("x", "m", "hi", tenant="other"))
    assert len(harness.admitted()) == 8


async def test_max_concurrency_counts_running_and_queued_requests_exactly() -> None:
    harness = Harness(tenant("team", max_concurrency=3), queue=8)
    async with running(harness):
        with harness.holding_the_slot():
            for i in range(3):
                harness.submit(f"r{i}", "team")
            await harness.settle(2)
            with pytest.raises(QuotaExceededError) as refused:
                await harness.manager.infer(InferenceRequest("r3", "m", "hi", tenant="team"))
            assert refused.value.limit == MAX_CONCURRENCY
            assert await harness.queued() == 2  # refused before it took a queue place
        await asyncio.gather(*harness.tasks)
        await harness.manager.infer(InferenceRequest("r4", "m", "hi", tenant="team"))
    assert harness.admitted() == ["r0", "r1", "r2", "r4"]


async def test_a_stream_over_the_token_rate_finishes_and_its_debt_delays_the_next() -> None:
    harness = Harness(tenant("team", generated_tokens_per_minute=2))
    async with running(harness):
        harness.backends["m"].pieces = ["a", "b", "c", "d", "e", "f", "g", "h"]
        _, chunks = harness.manager.infer_stream(InferenceRequest("long", "m", "hi", tenant="team"))
        text = "".join([chunk.text async for chunk in chunks])
        assert text == "abcdefgh"  # not cut at the quota
        # 8 tokens against a bucket of 2: 6 in debt, and 1 more needed to admit: 7 tokens
        # at 2 a minute.
        with pytest.raises(QuotaExceededError) as refused:
            await harness.manager.infer(InferenceRequest("next", "m", "hi", tenant="team"))
        assert refused.value.limit == GENERATED_TOKENS_PER_MINUTE
        assert refused.value.retry_delay_s == pytest.approx(7 * 30.0, rel=0.2)
        harness.clock.now += 7 * 30.0
        await harness.manager.infer(InferenceRequest("later", "m", "hi", tenant="team"))
    assert harness.admitted() == ["long", "later"]


async def test_a_cancelled_waiter_leaves_the_queue_and_the_slot_goes_on() -> None:
    harness = Harness(tenant("a"))
    async with running(harness):
        with harness.holding_the_slot():
            harness.submit("first", "a")
            await harness.settle(0)
            gone = harness.submit("gone", "a")
            harness.submit("kept", "a")
            await harness.settle(2)
            gone.cancel()
            await harness.settle(1)
        await asyncio.gather(*(t for t in harness.tasks if t is not gone))
    assert harness.admitted() == ["first", "kept"]


class LoadReports:
    """The model load (queued, running) each report said, in order (a MetricsListener)."""

    def __init__(self) -> None:
        self.reports: list[tuple[int, int]] = []

    def model_added(self, model: str) -> None:
        pass

    def request_finished(self, record: object) -> None:
        pass

    def load_changed(self, model: str, queued: int, running: int) -> None:
        self.reports.append((queued, running))

    def readiness_changed(self, model: str, ready: bool) -> None:
        pass


async def test_only_a_request_that_waits_for_its_slot_is_counted_as_queued() -> None:
    load = LoadReports()
    harness = Harness(metrics=load)
    async with running(harness):
        load.reports.clear()
        with harness.holding_the_slot():
            harness.submit("first")
            await harness.settle(0)
            harness.submit("second")
            await harness.settle(1)
        await asyncio.gather(*harness.tasks)
    assert load.reports == [(0, 1), (1, 1), (1, 0), (0, 0), (0, 1), (0, 0)]
    assert harness.admitted() == ["first", "second"]


def test_a_free_slot_is_taken_at_once_with_the_stamps_a_granted_wait_gets() -> None:
    """try_acquire moves the tenant's virtual finish as acquire does: after one request
    taken at once, the tenant's next one queues behind another tenant's first."""
    queue = FairQueue(slots=1)
    assert queue.try_acquire(Claim("a"))
    assert not queue.try_acquire(Claim("b"))  # full
    granted: list[str] = []

    async def wait(name: str) -> None:
        await queue.acquire(Claim(name))
        granted.append(name)

    async def scenario() -> None:
        tasks = [asyncio.create_task(wait(n)) for n in ("a", "b")]
        await asyncio.sleep(0)
        assert not queue.try_acquire(Claim("c"))  # others wait
        for _ in tasks:
            queue.release()
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)

    asyncio.run(scenario())
    assert granted == ["b", "a"]


def test_names_made_up_on_first_use_are_bounded_then_share_one_tenant():
    from inferwire.core.tenants import MAX_UNCONFIGURED_TENANTS, UNCONFIGURED_LABEL, Tenants

    tenants = Tenants()
    made = [tenants.get(f"fairness-{i}") for i in range(MAX_UNCONFIGURED_TENANTS + 5)]
    assert len({id(t) for t in made[:MAX_UNCONFIGURED_TENANTS]}) == MAX_UNCONFIGURED_TENANTS
    overflow = made[MAX_UNCONFIGURED_TENANTS:]
    assert {t.name for t in overflow} == {UNCONFIGURED_LABEL} and len(
        {id(t) for t in overflow}
    ) == 1
    assert all(t.label == UNCONFIGURED_LABEL for t in made)  # no label per made-up name


def test_a_gateway_s_priority_hint_never_raises_a_tenant():
    from inferwire.core.requests import Priority
    from inferwire.core.tenants import TenantConfig, Tenants

    tenants = Tenants(
        [
            TenantConfig(name="bulk", priority="batch"),
            TenantConfig(name="ui", priority="interactive"),
        ]
    )
    assert tenants.get("bulk").priority_for(None, Priority.INTERACTIVE) is Priority.BATCH
    assert tenants.get("ui").priority_for(None, Priority.BATCH) is Priority.BATCH
    assert tenants.get("ui").priority_for(None, None) is Priority.INTERACTIVE

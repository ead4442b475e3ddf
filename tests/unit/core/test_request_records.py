"""Every inference request hands its listener exactly one record, with its one outcome,
in the task of the call that sent it: what the edge's `RecordsToCalls` relies on to join
the record to that call's access line and span, on every door. Tested here at the core,
where it was only seen through gRPC access lines before."""

from __future__ import annotations

import contextlib
import contextvars

import pytest

from inferwire.core.errors import BackendUnavailableError, InvalidArgumentError, ModelNotFoundError
from inferwire.core.manager import ModelManager
from inferwire.core.metrics import NoMetrics
from inferwire.core.record import Outcome, RequestRecord
from inferwire.core.validation import RequestLimits
from tests.support.fake_backend import FakeBackends
from tests.unit.core.test_model_manager import request, spec

CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("caller", default="")


class Records(NoMetrics):
    """Each record it is handed, with the caller whose task handed it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, RequestRecord]] = []

    def request_finished(self, record: RequestRecord) -> None:
        self.seen.append((CALLER.get(), record))


@contextlib.asynccontextmanager
async def manager(records: Records):
    backends = FakeBackends()
    manager = ModelManager(
        [spec("m", startup=True, concurrency=1, queue=0)],
        backends,
        RequestLimits(max_prompt_bytes=64),
        metrics=records,
    )
    await manager.start()
    try:
        yield manager, backends
    finally:
        await manager.close()


async def test_each_request_hands_one_record_with_its_outcome_in_its_caller_s_task():
    records = Records()
    async with manager(records) as (core, backends):
        CALLER.set("unary")
        await core.infer(request(max_tokens=2))
        CALLER.set("stream-left")
        _, chunks = core.infer_stream(request())
        async with contextlib.aclosing(chunks):
            await anext(chunks)  # the caller stops reading after the first chunk
        CALLER.set("unknown")
        with pytest.raises(ModelNotFoundError):
            await core.infer(request(model="ghost"))
        CALLER.set("too-long")
        with pytest.raises(InvalidArgumentError):
            await core.infer(request(prompt="x" * 100))
        CALLER.set("backend-down")
        backends["m"].infer_error = BackendUnavailableError("gone")
        with pytest.raises(BackendUnavailableError):
            await core.infer(request())
    outcomes = [(caller, record.outcome) for caller, record in records.seen]
    assert outcomes == [
        ("unary", Outcome.LENGTH),
        ("stream-left", Outcome.CANCELLED),
        ("unknown", Outcome.REJECTED),
        ("too-long", Outcome.REJECTED),
        ("backend-down", Outcome.ERROR),
    ]
    unknown = records.seen[2][1]
    assert (unknown.model, unknown.configured) == ("ghost", False)  # never a metric label

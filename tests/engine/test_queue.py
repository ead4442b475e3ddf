"""Per-model concurrency limits and bounded queues."""

import asyncio

import grpc
import pytest

from inferwire.v1 import inference_pb2 as pb
from tests.support.waiting import model_health, wait_until


async def test_full_queue_is_resource_exhausted_and_other_models_are_unaffected(stub, slow_stub):
    # "tight" runs one request and queues one more.
    running = slow_stub.InferStream(
        pb.InferStreamRequest(
            model="tight",
            prompt="Hold the slot",
            parameters=pb.GenerationParameters(max_tokens=1000),
        )
    )
    await running.read()
    queued = asyncio.ensure_future(
        stub.Infer(
            pb.InferRequest(
                model="tight", prompt="Queued", parameters=pb.GenerationParameters(max_tokens=4)
            )
        )
    )

    async def one_queued() -> bool:
        health = await model_health(stub, "tight")
        return health.inflight == 1 and health.queued == 1

    await wait_until(one_queued)
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.Infer(pb.InferRequest(model="tight", prompt="No room"))
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "tight" in error.value.details()

    # Another model serves normally meanwhile.
    other = await stub.Infer(
        pb.InferRequest(model="demo", prompt="Hi", parameters=pb.GenerationParameters(max_tokens=3))
    )
    assert other.usage.completion_tokens == 3

    # Freeing the slot lets the queued request run to completion.
    running.cancel()
    response = await asyncio.wait_for(queued, 30)
    assert response.usage.completion_tokens == 4
    assert response.timing.queue_ms > 0

"""Reserved headroom on the engine path's static batching, on the bundled model.

Every caller is the default tenant, interactive, so the model keeps its default reserve
of one interactive slot; batch requests lower their priority to batch. The model's
batch is never preempted (`static_batch_steps: 0`), so a row that waited for it would
wait until every running row ended: a request in the reserved slot that finishes while
the long batch streams still run started beside them, not after them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from inferwire.config import load_settings
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.engine import serving
from tests.support.waiting import wait_until

SLOTS = 4
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
async def reserving_stub() -> AsyncIterator[inference_pb2_grpc.InferenceServiceStub]:
    settings = load_settings(
        server={
            "address": "127.0.0.1:0",
            "metrics_address": "",
            "grace_period_s": 2,
            "default_tenant": {"priority": "interactive"},
        },
        models=[
            {
                "name": "reserving",
                "load_on_startup": True,
                "max_concurrency": SLOTS,
                "options": {"path": "builtin", "batching": "engine", "static_batch_steps": 0},
            }
        ],
    )
    async with serving(settings) as stub:
        yield stub


async def test_list_models_says_the_default_reserve(reserving_stub) -> None:
    models = await reserving_stub.ListModels(pb.ListModelsRequest())
    assert "reserved slots: 1 interactive of 4" in models.models[0].detail


async def test_a_request_in_the_reserved_slot_runs_beside_a_static_batch(
    reserving_stub, request_log
) -> None:
    prompt, parameters = "My lord", pb.GenerationParameters(max_tokens=16, **GREEDY)
    alone = await reserving_stub.Infer(
        pb.InferRequest(model="reserving", prompt=prompt, parameters=parameters)
    )
    batch = [
        reserving_stub.InferStream(
            pb.InferStreamRequest(
                model="reserving",
                prompt="Hello",
                request_id=f"long-batch-{i}",
                priority=pb.PRIORITY_BATCH,
                parameters=pb.GenerationParameters(max_tokens=1000, ignore_eos=True, **GREEDY),
            )
        )
        for i in range(SLOTS - 1)
    ]
    await batch[0].read()  # the batch runs; the others hold the unreserved slots
    beside = await reserving_stub.Infer(
        pb.InferRequest(model="reserving", prompt=prompt, parameters=parameters)
    )
    assert beside.text == alone.text  # greedy, the same on the generator as on the engine
    assert beside.timing.queue_ms < 100  # a slot was free for it
    for call in batch:
        call.cancel()

    async def logged() -> bool:
        return request_log.for_request("long-batch-0") is not None

    await wait_until(logged)
    # Still running when the reserved one had finished: it was cancelled, not completed.
    assert request_log.for_request("long-batch-0").outcome == "cancelled"

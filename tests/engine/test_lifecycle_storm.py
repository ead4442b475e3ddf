"""A lifecycle storm: 32 clients stream from one model while it is unloaded and loaded
again and again, each client cancelling at random. Every request ends cleanly, no
deadline passes, nothing deadlocks or leaks, and the model ends READY.

A dedicated in-process server with its own model, so the session server's models are
untouched.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter

import grpc

from inferwire.config import load_settings
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support import figures
from tests.support.waiting import model_health, wait_until

CLIENTS = 32
MIN_STREAMS_PER_CLIENT = 2
MAX_STREAMS_PER_CLIENT = 200
CYCLES = 6
DEADLINE_S = 30.0
CLEAN = {"OK", "FAILED_PRECONDITION", "UNAVAILABLE", "CANCELLED"}


async def _client(
    stub, rng: random.Random, outcomes: Counter[str], storm_over: asyncio.Event
) -> None:
    """Stream until the lifecycle cycles are over (at least MIN_STREAMS, at most MAX)."""
    for streamed in range(MAX_STREAMS_PER_CLIENT):
        if streamed >= MIN_STREAMS_PER_CLIENT and storm_over.is_set():
            return
        request = pb.InferStreamRequest(
            model="storm",
            prompt=rng.choice(["Hello", "KING HENRY:\n", "The"]),
            parameters=pb.GenerationParameters(max_tokens=rng.randint(8, 120), temperature=0),
        )
        call = stub.InferStream(request, timeout=DEADLINE_S)
        cancel_after = rng.choice([None, None, 0, 1, 3, 10])
        try:
            async for _ in call:
                if cancel_after is not None:
                    if cancel_after == 0:
                        call.cancel()
                        break
                    cancel_after -= 1
            else:
                if cancel_after is not None and cancel_after == 0:
                    call.cancel()
            code = await call.code()
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
        except grpc.aio.AioRpcError as error:
            code = error.code()
        outcomes[code.name] += 1
        # Refused while the model is away: back off a little, as a real client would.
        pause = 0.2 if code == grpc.StatusCode.FAILED_PRECONDITION else 0.01
        await asyncio.sleep(rng.uniform(0, pause))


async def _cycle_lifecycle(
    stub, rng: random.Random, cycles: Counter[str], storm_over: asyncio.Event
) -> None:
    for _ in range(CYCLES):
        await asyncio.sleep(rng.uniform(0.2, 0.6))
        await stub.UnloadModel(pb.UnloadModelRequest(model="storm"), timeout=DEADLINE_S)
        cycles["unloads"] += 1
        await asyncio.sleep(rng.uniform(0, 0.1))
        await stub.LoadModel(pb.LoadModelRequest(model="storm"), timeout=DEADLINE_S)
        cycles["loads"] += 1
    storm_over.set()


def _tasks() -> int:
    return len(asyncio.all_tasks())


def _threads() -> int:
    """Live threads, less the process-wide pools that outlive any server by design:
    asyncio's default executor (asyncio_N) and gRPC's poller (_poll_wrapper)."""
    return sum(
        1
        for thread in threading.enumerate()
        if not thread.name.startswith("asyncio_") and "(_poll_wrapper)" not in thread.name
    )


async def test_storm_of_cancelling_streams_across_unload_and_load_cycles_ends_clean():
    settings = load_settings(
        server={"address": "127.0.0.1:0", "grace_period_s": 1, "health_check_interval_s": 0.5},
        models=[{"name": "storm", "load_on_startup": True, "max_concurrency": 8, "max_queue": 64}],
    )
    tasks_before, threads_before = _tasks(), _threads()
    server = InferwireServer(settings)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            rng = random.Random(20240611)
            outcomes: Counter[str] = Counter()
            cycles: Counter[str] = Counter()
            over = asyncio.Event()
            clients = [
                _client(stub, random.Random(rng.random()), outcomes, over) for _ in range(CLIENTS)
            ]
            await asyncio.wait_for(
                asyncio.gather(_cycle_lifecycle(stub, rng, cycles, over), *clients), timeout=120
            )
            figures.record_counts("lifecycle storm: stream outcomes", outcomes)
            figures.record_counts("lifecycle storm: lifecycle calls", cycles)

            assert set(outcomes) <= CLEAN, outcomes
            assert sum(outcomes.values()) >= CLIENTS * MIN_STREAMS_PER_CLIENT
            assert cycles == {"unloads": CYCLES, "loads": CYCLES}
            [status] = (await stub.ListModels(pb.ListModelsRequest(), timeout=10)).models
            assert status.state == pb.MODEL_STATE_READY

            async def drained() -> bool:
                health = await model_health(stub, "storm")
                return health.inflight == 0 and health.queued == 0

            await wait_until(drained)
    finally:
        await server.stop(grace_s=1)

    async def settled() -> bool:
        return _tasks() <= tasks_before and _threads() <= threads_before

    try:
        await wait_until(settled, timeout_s=10, interval_s=0.1)
    finally:
        figures.record(
            "lifecycle storm: tasks and threads",
            f"tasks {tasks_before} before, {_tasks()} after; "
            f"threads {threads_before} before, {_threads()} after "
            "(less asyncio's default executor and gRPC's poller)",
        )

"""The engine in a process of its own (`engine_process: true`): what only a process can do
(die, be left behind, cost its memory twice). Its requests' results, cancellation and flow
control are in test_batching.py, where every test runs with the engine in-process and apart.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from inferwire.config import load_settings
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.waiting import read_rest, wait_until

GREEDY = pb.GenerationParameters(temperature=0)
_HOST_MODULE = b"inferwire.backends.ort_genai.engine_host"


def engine_processes() -> set[int]:
    """The PIDs of this process's children that are engine processes."""
    found = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for pid in children:
            try:
                if _HOST_MODULE in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.add(int(pid))
            except OSError:
                continue  # it ended meanwhile
    return found


@pytest.fixture
async def server() -> AsyncIterator[InferwireServer]:
    before = engine_processes()
    server = InferwireServer(
        load_settings(
            server={"address": "127.0.0.1:0", "metrics_address": "", "grace_period_s": 2},
            models=[
                {
                    "name": "apart",
                    "load_on_startup": True,
                    "max_concurrency": 4,
                    "options": {"path": "builtin", "batching": "engine", "engine_process": True},
                }
            ],
        )
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop(grace_s=1)
        for pid in engine_processes() - before:  # a test that failed may leave one
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


@pytest.fixture
async def stub(server: InferwireServer) -> AsyncIterator[inference_pb2_grpc.InferenceServiceStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield inference_pb2_grpc.InferenceServiceStub(channel)


def _request(prompt: str, max_tokens: int, **fields: object) -> pb.InferStreamRequest:
    parameters = pb.GenerationParameters(max_tokens=max_tokens, temperature=0, **fields)
    return pb.InferStreamRequest(model="apart", prompt=prompt, parameters=parameters)


async def test_a_killed_engine_process_fails_its_streams_by_name_and_the_server_serves_on(
    stub: inference_pb2_grpc.InferenceServiceStub,
):
    [engine] = engine_processes()
    running = stub.InferStream(_request("Once upon a time", 1000))
    await running.read()  # on the engine, mid-generation
    os.kill(engine, signal.SIGKILL)
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await read_rest(running)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert failed.value.details() == "model 'apart': the engine process died with SIGKILL"

    async def reported() -> bool:
        health = await stub.Health(pb.HealthRequest(model="apart"))
        return not health.models[0].ready

    await wait_until(reported)
    health = await stub.Health(pb.HealthRequest(model="apart"))
    assert "engine scheduler stopped: the engine process died with SIGKILL" in (
        health.models[0].detail
    )
    # The server's own process lives on, and so does the per-request path in it: a seeded
    # request takes it on a static engine.
    seeded = stub.InferStream(_request("Hello", 8, seed=7, top_k=5))
    messages = [message async for message in seeded]
    assert messages[-1].usage.completion_tokens == 8


async def test_unloading_ends_the_engine_process_and_loading_starts_a_new_one(
    server: InferwireServer, stub: inference_pb2_grpc.InferenceServiceStub
):
    [first] = engine_processes()
    reply = [m async for m in stub.InferStream(_request("Hello", 4))]
    assert reply[-1].usage.completion_tokens == 4
    await stub.UnloadModel(pb.UnloadModelRequest(model="apart"))
    # Unload waits for the process to end and reaps it.
    assert not Path(f"/proc/{first}").exists()
    assert engine_processes() == set()
    await stub.LoadModel(pb.LoadModelRequest(model="apart"))
    [second] = engine_processes()
    assert second != first
    again = [m async for m in stub.InferStream(_request("Hello", 4))]
    assert "".join(m.text for m in again) == "".join(m.text for m in reply)


async def test_the_memory_estimate_counts_the_weights_in_both_processes(
    stub: inference_pb2_grpc.InferenceServiceStub,
):
    listed = await stub.ListModels(pb.ListModelsRequest())
    [apart] = [model for model in listed.models if model.name == "apart"]
    assert "at load 2 x " in apart.detail, apart.detail


async def test_a_request_after_the_engine_process_died_fails_at_once(
    stub: inference_pb2_grpc.InferenceServiceStub,
):
    [engine] = engine_processes()
    os.kill(engine, signal.SIGKILL)

    async def gone() -> bool:
        return not (await stub.Health(pb.HealthRequest(model="apart"))).models[0].ready

    await wait_until(gone)
    call = stub.InferStream(_request("Hello", 8))
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await asyncio.wait_for(call.read(), timeout=60)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert failed.value.details() == "model 'apart': the engine process died with SIGKILL"

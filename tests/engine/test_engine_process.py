"""The engine in a process of its own (`engine_process: true`): what only a process can do
(die and be restarted, be left behind, cost its memory twice). Its requests' results,
cancellation and flow control are in test_batching.py, where every test runs with the
engine in-process and apart.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from inferwire.backends.ort_genai.backend import builtin_model_path
from inferwire.config import load_settings
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.waiting import read_rest, wait_until

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


@contextlib.asynccontextmanager
async def serving(model_path: str) -> AsyncIterator[InferwireServer]:
    """A server of the model at `model_path` as `apart`, its engine in a process of its own;
    any engine process it leaves behind (a test that failed) is killed."""
    before = engine_processes()
    server = InferwireServer(
        load_settings(
            server={
                "address": "127.0.0.1:0",
                "metrics_address": "",
                "grace_period_s": 2,
                "health_check_interval_s": 0.2,
            },
            models=[
                {
                    "name": "apart",
                    "load_on_startup": True,
                    "max_concurrency": 4,
                    "options": {"path": model_path, "batching": "engine", "engine_process": True},
                }
            ],
        )
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop(grace_s=1)
        for pid in engine_processes() - before:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


@pytest.fixture
async def server() -> AsyncIterator[InferwireServer]:
    async with serving("builtin") as server:
        yield server


@pytest.fixture
async def stub(server: InferwireServer) -> AsyncIterator[inference_pb2_grpc.InferenceServiceStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield inference_pb2_grpc.InferenceServiceStub(channel)


def _request(prompt: str, max_tokens: int, **fields: object) -> pb.InferStreamRequest:
    parameters = pb.GenerationParameters(max_tokens=max_tokens, temperature=0, **fields)
    return pb.InferStreamRequest(model="apart", prompt=prompt, parameters=parameters)


async def _text(stub: inference_pb2_grpc.InferenceServiceStub, prompt: str, tokens: int) -> str:
    messages = [message async for message in stub.InferStream(_request(prompt, tokens))]
    assert messages[-1].usage.completion_tokens == tokens
    return "".join(message.text for message in messages)


async def _ready(stub: inference_pb2_grpc.InferenceServiceStub) -> pb.ModelHealth:
    return (await stub.Health(pb.HealthRequest(model="apart"))).models[0]


async def test_a_killed_engine_process_fails_its_streams_by_name_and_a_new_one_serves(
    stub: inference_pb2_grpc.InferenceServiceStub,
):
    before = await _text(stub, "Hello", 16)
    [engine] = engine_processes()
    running = stub.InferStream(_request("Once upon a time", 1000))
    await running.read()  # on the engine, mid-generation
    os.kill(engine, signal.SIGKILL)
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await read_rest(running)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert failed.value.details() == "model 'apart': the engine process died with SIGKILL"
    # The server's own process lives on, and so does the per-request path in it: a seeded
    # request takes it on a static engine.
    seeded = [m async for m in stub.InferStream(_request("Hello", 8, seed=7, top_k=5))]
    assert seeded[-1].usage.completion_tokens == 8

    async def restarted() -> bool:
        return engine_processes() - {engine} != set() and (await _ready(stub)).ready

    await wait_until(restarted, timeout_s=60)
    assert engine not in engine_processes()  # reaped
    assert await _text(stub, "Hello", 16) == before


async def test_while_the_engine_process_cannot_restart_requests_fail_at_once_and_health_says_why(
    tmp_path: Path,
):
    """Its model folder moved away, a killed engine process cannot load it again: the model
    is not ready and says why, requests fail at once; once the folder is back, a restart
    (tried again, each pause twice the one before) serves."""
    folder = tmp_path / "model"
    shutil.copytree(builtin_model_path(), folder)
    async with (
        serving(str(folder)) as server,
        grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        before = await _text(stub, "Hello", 16)
        [engine] = engine_processes()
        folder.rename(tmp_path / "away")
        os.kill(engine, signal.SIGKILL)

        async def unready() -> bool:
            return not (await _ready(stub)).ready

        await wait_until(unready, timeout_s=60)
        health = await _ready(stub)
        assert "the engine process died with SIGKILL" in health.detail, health.detail
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stub.Infer(pb.InferRequest(model="apart", prompt="Hello"))
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert failed.value.details() == "model 'apart': the engine process died with SIGKILL"

        (tmp_path / "away").rename(folder)

        async def ready() -> bool:
            return (await _ready(stub)).ready

        await wait_until(ready, timeout_s=120)
        assert await _text(stub, "Hello", 16) == before


async def test_the_engine_process_outlives_signals_meant_for_the_whole_group(
    stub: inference_pb2_grpc.InferenceServiceStub,
):
    """A Ctrl-C, or systemd stopping the unit, signals every process: the server drains its
    streams first, so the engine process waits for the server to close it."""
    [engine] = engine_processes()
    running = stub.InferStream(_request("Once upon a time", 200))
    first = await running.read()
    for signal_number in (signal.SIGINT, signal.SIGTERM):
        os.kill(engine, signal_number)
    rest = await read_rest(running)
    assert rest[-1].usage.completion_tokens == 200, first
    assert engine_processes() == {engine}
    assert await _text(stub, "Hello", 4)


async def test_unloading_ends_the_engine_process_and_loading_starts_a_new_one(
    stub: inference_pb2_grpc.InferenceServiceStub,
):
    [first] = engine_processes()
    reply = await _text(stub, "Hello", 4)
    await stub.UnloadModel(pb.UnloadModelRequest(model="apart"))
    # Unload waits for the process to end and reaps it.
    assert not Path(f"/proc/{first}").exists()
    assert engine_processes() == set()
    await stub.LoadModel(pb.LoadModelRequest(model="apart"))
    [second] = engine_processes()
    assert second != first
    assert await _text(stub, "Hello", 4) == reply


async def test_the_memory_estimate_counts_the_weights_in_both_processes(
    stub: inference_pb2_grpc.InferenceServiceStub,
):
    listed = await stub.ListModels(pb.ListModelsRequest())
    [apart] = [model for model in listed.models if model.name == "apart"]
    assert "at load 2 x " in apart.detail, apart.detail

"""A Triton pool with `max_loaded_models: 1`: two on-demand Triton models take turns.

A tritonserver of its own (explicit model control, nothing loaded) serves both; a thread
reads Triton's own repository index all along, to show the two are never loaded at once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.support.triton import SKIP_REASON, TRITON_DIR, TritonServer

if TRITON_DIR is None:
    pytest.skip(SKIP_REASON, allow_module_level=True)

from tritonclient.grpc import service_pb2, service_pb2_grpc

from inferwire.backends.ort_genai import builtin_model_path
from inferwire.config import load_settings
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc

log = logging.getLogger(__name__)

TRITON_MODELS = {"first": "vllm_echo", "second": "trtllm_echo"}


@pytest.fixture
def pool_server(triton_dir: Path, record_dir: Path) -> Iterator[TritonServer]:
    with TritonServer(record_dir) as server:
        yield server


class IndexWatcher(threading.Thread):
    """Reads Triton's repository index until stopped: the most models READY at once."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.most_ready = 0
        self.samples = 0
        self.stop = threading.Event()

    def run(self) -> None:
        with grpc.insecure_channel(self.url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            while not self.stop.is_set():
                index = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(), timeout=10)
                ready = {m.name for m in index.models if m.state == "READY"}
                self.most_ready = max(self.most_ready, len(ready & set(TRITON_MODELS.values())))
                self.samples += 1
                self.stop.wait(0.01)


async def test_a_pool_of_one_serves_two_models_in_turn(pool_server: TritonServer):
    options = {"url": pool_server.url, "max_loaded_models": 1}
    settings = load_settings(
        server={
            "address": "127.0.0.1:0",
            "metrics_address": "",
            "memory": {"min_resident_s": 0},
        },
        models=[
            {
                "name": "first",
                "backend": "triton",
                "on_demand": True,
                "options": {**options, "triton_model": "vllm_echo"},
            },
            {
                "name": "second",
                "backend": "triton",
                "on_demand": True,
                "options": {
                    **options,
                    "triton_model": "trtllm_echo",
                    "tokenizer": str(builtin_model_path()),
                },
            },
        ],
    )
    server = InferwireServer(settings)
    await server.start()
    watcher = IndexWatcher(pool_server.url)
    watcher.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            load_ms = []
            for turn in range(10):
                model = "first" if turn % 2 == 0 else "second"
                reply = await stub.Infer(
                    pb.InferRequest(
                        model=model, prompt="a b", parameters=pb.GenerationParameters(max_tokens=2)
                    ),
                    timeout=60,
                )
                assert reply.text
                assert reply.timing.load_ms > 0  # the other one held the pool's only place
                load_ms.append(reply.timing.load_ms)
                listed = {m.name: m for m in (await stub.ListModels(pb.ListModelsRequest())).models}
                assert listed[model].state == pb.MODEL_STATE_READY
                assert listed[model].resident_bytes == 1  # a count budget: one model
                other = listed["second" if model == "first" else "first"]
                assert other.state == pb.MODEL_STATE_UNLOADED
                if turn:
                    assert f"evicted to load {model!r}" in other.detail
        await asyncio.sleep(0.1)  # a few more index samples after the last turn
    finally:
        watcher.stop.set()
        await asyncio.to_thread(watcher.join, 30)
        await server.stop(grace_s=1)
    log.info(
        f"Triton pool of 1, 10 alternating requests: load_ms median "
        f"{sorted(load_ms)[len(load_ms) // 2]:.0f}, {watcher.samples} index samples, most "
        f"READY at once {watcher.most_ready}",
    )
    assert watcher.samples > 0
    assert watcher.most_ready == 1

"""Engine-tier fixtures: one in-process server on 127.0.0.1:0 for the whole session,
serving the bundled model through the real ONNX Runtime GenAI engine
(see tests.support.engine for the models it serves)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest

from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2_grpc
from tests.support.engine import SLOW_READER_OPTIONS, RequestLogRecords, make_settings
from tests.support.process import ServerProcess, start_server_process, stop_server_process


@pytest.fixture(scope="session")
async def server() -> AsyncIterator[InferwireServer]:
    server = InferwireServer(make_settings())
    await server.start()
    yield server
    await server.stop(grace_s=1)


@pytest.fixture(scope="session")
def target(server: InferwireServer) -> str:
    return f"127.0.0.1:{server.port}"


@pytest.fixture(scope="session")
async def channel(target: str) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(target) as channel:
        yield channel


@pytest.fixture
async def slow_stub(target: str) -> AsyncIterator[inference_pb2_grpc.InferenceServiceStub]:
    async with grpc.aio.insecure_channel(target, options=SLOW_READER_OPTIONS) as channel:
        yield inference_pb2_grpc.InferenceServiceStub(channel)


@pytest.fixture
def request_log(caplog: pytest.LogCaptureFixture) -> RequestLogRecords:
    caplog.set_level(logging.INFO, logger="inferwire.access")
    return RequestLogRecords(caplog)


@pytest.fixture
def server_process() -> Iterator[ServerProcess]:
    server = start_server_process()
    try:
        yield server
    finally:
        stop_server_process(server)

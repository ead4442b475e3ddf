"""Shared fixtures: one in-process server on 127.0.0.1:0 for the whole session.

It serves the bundled model under several names so that tests which unload,
saturate or break a model do not disturb each other:
  demo   - loaded at start-up; the model most tests use
  tight  - loaded at start-up; max_concurrency 1, max_queue 1 (queue tests)
  spare  - configured, not loaded at start-up (lifecycle and health tests)
  broken - points at a directory that does not exist (failed loads)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2_grpc
from support import (  # noqa: F401  re-exported for the tests
    INFERWIRE,
    ServerProcess,
    bad_request_fields,
    run_cli,
    start_server_process,
    stop_server_process,
)

from inferwire.config import load_settings
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc

MAX_PROMPT_BYTES = 4096

# A client whose HTTP/2 receive window is tiny: when it stops reading, the
# server's writes block, and so does generation. This holds a stream (and its
# concurrency slot) open deterministically, without relying on timing.
SLOW_READER_OPTIONS = [("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)]


def make_settings():
    builtin = {"path": "builtin", "device": "cpu"}
    return load_settings(
        server={
            "address": "127.0.0.1:0",
            "max_prompt_bytes": MAX_PROMPT_BYTES,
            "max_receive_message_bytes": 64 * 1024,
            "health_check_interval_s": 0.5,
            "grace_period_s": 5,
        },
        models=[
            {"name": "demo", "load_on_startup": True, "options": builtin},
            {
                "name": "tight",
                "load_on_startup": True,
                "max_concurrency": 1,
                "max_queue": 1,
                "options": builtin,
            },
            {"name": "spare", "options": builtin},
            {"name": "broken", "options": {"path": "/nonexistent/inferwire-model"}},
        ],
    )


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


@pytest.fixture(scope="session")
def stub(channel: grpc.aio.Channel) -> inference_pb2_grpc.InferenceServiceStub:
    return inference_pb2_grpc.InferenceServiceStub(channel)


@pytest.fixture(scope="session")
def health_stub(channel: grpc.aio.Channel) -> health_pb2_grpc.HealthStub:
    return health_pb2_grpc.HealthStub(channel)


@pytest.fixture
async def slow_stub(target: str) -> AsyncIterator[inference_pb2_grpc.InferenceServiceStub]:
    async with grpc.aio.insecure_channel(target, options=SLOW_READER_OPTIONS) as channel:
        yield inference_pb2_grpc.InferenceServiceStub(channel)


async def read_rest(call) -> list:
    """Read the remaining messages of a stream already read with `read()`."""
    messages = []
    while (message := await call.read()) is not grpc.aio.EOF:
        messages.append(message)
    return messages


async def model_health(stub, model: str) -> pb.ModelHealth:
    response = await stub.Health(pb.HealthRequest(model=model))
    return response.models[0]


async def wait_until(predicate, timeout_s: float = 10.0, interval_s: float = 0.01) -> None:
    """Poll an async predicate; fail the test if it never holds."""
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(interval_s)


@dataclass
class RequestLogRecords:
    """Reads the server's structured `request finished` log records."""

    caplog: pytest.LogCaptureFixture

    def for_request(self, request_id: str) -> logging.LogRecord | None:
        for record in self.caplog.records:
            if record.name == "inferwire.requests" and getattr(record, "request_id", None) == (
                request_id
            ):
                return record
        return None


@pytest.fixture
def request_log(caplog: pytest.LogCaptureFixture) -> RequestLogRecords:
    caplog.set_level(logging.INFO, logger="inferwire.requests")
    return RequestLogRecords(caplog)


@pytest.fixture
def server_process() -> Iterator[ServerProcess]:
    server = start_server_process()
    try:
        yield server
    finally:
        stop_server_process(server)

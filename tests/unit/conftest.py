"""Unit-tier fixtures: the real server assembly over fake backends, in-process.

`served` gives a stub and the FakeBackends factory of a server on 127.0.0.1:0 whose
models are `m` (loaded at start-up), `idle` (not loaded) and `tight` (one slot, no
queue); `fake_server` gives that server and its factory (for its port). Tests that
change a fake's behaviour restore it before they end.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from inferwire.config import load_settings
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2_grpc
from tests.support.fake_backend import FAKE_BACKEND, FakeBackends, serving_fakes

Served = tuple[inference_pb2_grpc.InferenceServiceStub, FakeBackends, grpc.aio.Channel]


@pytest.fixture(scope="module")
async def fake_server() -> AsyncIterator[tuple[InferwireServer, FakeBackends]]:
    settings = load_settings(
        server={"address": "127.0.0.1:0", "health_check_interval_s": 3600},
        models=[
            {"name": "m", "backend": FAKE_BACKEND, "load_on_startup": True},
            {"name": "idle", "backend": FAKE_BACKEND},
            {"name": "tight", "backend": FAKE_BACKEND, "max_concurrency": 1, "max_queue": 0},
        ],
    )
    async with serving_fakes(settings) as served:
        yield served


@pytest.fixture(scope="module")
async def served(fake_server: tuple[InferwireServer, FakeBackends]) -> AsyncIterator[Served]:
    server, backends = fake_server
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield inference_pb2_grpc.InferenceServiceStub(channel), backends, channel

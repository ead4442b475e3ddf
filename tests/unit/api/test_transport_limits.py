"""The `server.transport` limits (and `max_receive_message_bytes`) against real grpcio
clients: each offending client gets its documented outcome while a second client, on its
own connection, keeps being served. Small millisecond values keep each test short.

Each test has its own server over fake backends: model `m` is the one the offending
client holds in flight (its generation gate closed), `n` the one the other client uses.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from inferwire.config import load_settings
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.fake_backend import FAKE_BACKEND, FakeBackends
from tests.support.waiting import wait_until

Code = grpc.StatusCode
# grpcio shares one connection between channels to the same target; these clients must not.
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


class Harness:
    def __init__(self, server: InferwireServer, backends: FakeBackends) -> None:
        self.server, self.backends = server, backends
        self.target = f"127.0.0.1:{server.port}"

    def stub(self, channel: grpc.aio.Channel) -> inference_pb2_grpc.InferenceServiceStub:
        return inference_pb2_grpc.InferenceServiceStub(channel)

    async def in_flight(self, count: int) -> None:
        """Wait until `count` requests reached model `m`'s backend (and wait at its gate)."""

        async def reached() -> bool:
            return len(self.backends["m"].calls.requests) >= count

        await wait_until(reached, timeout_s=5)

    async def other_client_is_served(self) -> None:
        async with grpc.aio.insecure_channel(self.target, options=OWN_CONNECTION) as channel:
            reply = await self.stub(channel).Infer(pb.InferRequest(model="n", prompt="hi"))
            assert reply.text == "Hello, world"


@pytest.fixture
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    server_settings: dict[str, Any] = request.param
    backends = FakeBackends()
    settings = load_settings(
        server={"address": "127.0.0.1:0", "health_check_interval_s": 3600, **server_settings},
        models=[{"name": name, "backend": FAKE_BACKEND, "load_on_startup": True} for name in "mn"],
    )
    server = InferwireServer(settings, backend_factory=backends)
    await server.start()
    try:
        yield Harness(server, backends)
    finally:
        backends["m"].generation_gate.open()
        await server.stop(grace_s=0)


def transport(**limits: Any) -> Any:
    return pytest.mark.parametrize("harness", [{"transport": limits}], indirect=True)


@pytest.mark.parametrize("harness", [{"max_receive_message_bytes": 2048}], indirect=True)
async def test_a_request_over_max_receive_message_bytes_is_resource_exhausted(harness):
    async with grpc.aio.insecure_channel(harness.target, options=OWN_CONNECTION) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await harness.stub(channel).Infer(pb.InferRequest(model="n", prompt="x" * 4096))
        assert raised.value.code() is Code.RESOURCE_EXHAUSTED
        await harness.other_client_is_served()
        reply = await harness.stub(channel).Infer(pb.InferRequest(model="n", prompt="hi"))
        assert reply.text == "Hello, world"  # the same connection still serves small ones


@transport(max_metadata_bytes=1024)
async def test_metadata_over_max_metadata_bytes_is_refused(harness):
    async with grpc.aio.insecure_channel(harness.target, options=OWN_CONNECTION) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await harness.stub(channel).Infer(
                pb.InferRequest(model="n", prompt="hi"), metadata=(("x-big", "a" * 4096),)
            )
        assert raised.value.code() is Code.RESOURCE_EXHAUSTED, raised.value
        await harness.other_client_is_served()


@transport(max_concurrent_streams=2)
async def test_streams_beyond_max_concurrent_streams_wait_on_the_client(harness):
    gate = harness.backends["m"].generation_gate
    gate.close()
    async with grpc.aio.insecure_channel(harness.target, options=OWN_CONNECTION) as channel:
        stub = harness.stub(channel)
        held = [stub.InferStream(pb.InferStreamRequest(model="m", prompt="hi")) for _ in "ab"]
        await harness.in_flight(2)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.ListModels(pb.ListModelsRequest(), timeout=0.3)
        assert raised.value.code() is Code.DEADLINE_EXCEEDED  # it never got a stream
        await harness.other_client_is_served()
        gate.open()
        for call in held:
            assert "".join([m.text async for m in call]) == "Hello, world"
        assert (await stub.ListModels(pb.ListModelsRequest())).models


@transport(keepalive_max_ping_strikes=1)
async def test_a_client_pinging_too_often_gets_goaway_too_many_pings(harness, capfd):
    # Without an RPC in flight the server allows no pings (keepalive_permit_without_calls
    # false); grpcio sends at most one a second, so the second strike comes at about 2 s.
    pinging = [
        *OWN_CONNECTION,
        ("grpc.keepalive_time_ms", 100),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 1),
    ]
    async with grpc.aio.insecure_channel(harness.target, options=pinging) as channel:
        await harness.stub(channel).ListModels(pb.ListModelsRequest())
        assert channel.get_state() is grpc.ChannelConnectivity.READY
        await harness.other_client_is_served()
        await asyncio.wait_for(channel.wait_for_state_change(grpc.ChannelConnectivity.READY), 5)
        await harness.other_client_is_served()
    assert 'debug data equal to "too_many_pings"' in capfd.readouterr().err


@transport(max_connection_age_s=0.3, max_connection_age_grace_s=2.0)
async def test_an_aged_connection_closes_gracefully_and_the_client_reconnects(harness):
    gate = harness.backends["m"].generation_gate
    gate.close()
    async with grpc.aio.insecure_channel(harness.target, options=OWN_CONNECTION) as channel:
        stub = harness.stub(channel)
        call = stub.InferStream(pb.InferStreamRequest(model="m", prompt="hi"))
        await harness.in_flight(1)
        await asyncio.sleep(0.6)  # past the age, within the grace
        await harness.other_client_is_served()
        gate.open()
        assert "".join([m.text async for m in call]) == "Hello, world"  # finished in grace
        reply = await stub.Infer(pb.InferRequest(model="n", prompt="hi"))
        assert reply.text == "Hello, world"  # on a new connection


@transport(max_connection_age_s=0.2, max_connection_age_grace_s=0.2)
async def test_a_stream_outliving_the_grace_is_cut_unavailable(harness):
    gate = harness.backends["m"].generation_gate
    gate.close()
    async with grpc.aio.insecure_channel(harness.target, options=OWN_CONNECTION) as channel:
        call = harness.stub(channel).InferStream(pb.InferStreamRequest(model="m", prompt="hi"))
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            async for _ in call:
                pass
        assert raised.value.code() is Code.UNAVAILABLE, raised.value
        await harness.other_client_is_served()

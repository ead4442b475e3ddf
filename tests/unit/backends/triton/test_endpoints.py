"""Picking endpoints round-robin, and failing over before the first response.

Channels to 127.0.0.1:1 and :2 never connect unless a call is made on them; the
failover test makes one, refused at once, next to an in-process loopback server.
"""

import logging

import grpc
import pytest

pytest.importorskip("tritonclient.grpc")

from tritonclient.grpc import service_pb2, service_pb2_grpc

from inferwire.backends.triton.endpoints import EndpointPool
from inferwire.backends.triton.options import TritonOptions
from inferwire.core.errors import BackendUnavailableError

URLS = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]


async def open_pool(urls: list[str]) -> EndpointPool:
    pool = EndpointPool("llama", "llama-3", TritonOptions(urls=urls))
    await pool.open()
    return pool


@pytest.fixture
async def pool():
    pool = await open_pool(URLS)
    yield pool
    await pool.close()


def urls(pool: EndpointPool, picks: int, exclude=()) -> list[str]:
    return [pool.pick(exclude).url for _ in range(picks)]


async def test_pool_opens_one_channel_per_url_once_and_closing_empties_it(pool):
    endpoints = list(pool.endpoints)
    assert [ep.url for ep in endpoints] == URLS
    await pool.open()
    assert pool.endpoints == endpoints
    await pool.close()
    assert pool.endpoints == []


async def test_picks_go_round_robin_over_healthy_endpoints(pool):
    pool.endpoints[1].healthy = False
    assert urls(pool, 4) == [URLS[0], URLS[2], URLS[0], URLS[2]]


async def test_picks_go_over_every_endpoint_when_none_is_healthy(pool):
    for endpoint in pool.endpoints:
        endpoint.healthy = False
    assert urls(pool, 3) == URLS


async def test_endpoints_already_tried_are_not_picked_again(pool):
    assert set(urls(pool, 4, exclude=pool.endpoints[:1])) == set(URLS[1:])
    with pytest.raises(BackendUnavailableError, match=r"^model 'llama': no Triton endpoint left$"):
        pool.pick(exclude=pool.endpoints)


class Answering(service_pb2_grpc.GRPCInferenceServiceServicer):
    async def ModelInfer(self, request, context):
        return service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)


async def test_request_that_cannot_reach_an_endpoint_moves_on_to_the_next(caplog):
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Answering(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    pool = await open_pool(["127.0.0.1:1", f"127.0.0.1:{port}"])
    refusing = pool.endpoints[0]
    message = service_pb2.ModelInferRequest(model_name="llama-3", id="r-1")
    try:
        with caplog.at_level(logging.WARNING, logger="inferwire.backends.triton"):
            answers = [r async for r in pool.responses(message, decoupled=False, timeout=5)]
    finally:
        await pool.close()
        await server.stop(None)
    assert [a.id for a in answers] == ["r-1"]
    assert not refusing.healthy
    assert refusing.detail.startswith("UNAVAILABLE: ")
    assert [r.getMessage() for r in caplog.records] == [
        "Triton endpoint unreachable; trying another"
    ]
    assert caplog.records[0].url == "127.0.0.1:1"


async def test_an_unreachable_endpoint_says_why_it_could_not_connect_not_that_time_ran_out():
    pool = EndpointPool("llama", "llama-3", TritonOptions(url="127.0.0.1:1", connect_timeout_s=0.2))
    await pool.open()
    try:
        with pytest.raises(BackendUnavailableError) as raised:
            await pool.wait_until_reachable(pool.endpoints[0])
    finally:
        await pool.close()
    message = str(raised.value)
    assert message.startswith("could not connect to Triton at 127.0.0.1:1 within 0.2 s: ")
    assert "Connection refused" in message


async def test_a_much_slower_endpoint_gets_no_requests_while_a_fast_one_is_usable(pool):
    for endpoint, round_trip_s in zip(pool.endpoints, [0.002, 0.2, 0.004], strict=True):
        endpoint.measured(round_trip_s)
    assert urls(pool, 4) == [URLS[0], URLS[2], URLS[0], URLS[2]]
    # Within the margin of the fastest: all stay in the rotation.
    pool.endpoints[1].round_trip_s = 0.04
    assert set(urls(pool, 3)) == set(URLS)
    # The slow one still serves when it is the only usable one.
    pool.endpoints[1].round_trip_s = 0.2
    pool.endpoints[0].healthy = pool.endpoints[2].healthy = False
    assert urls(pool, 2) == [URLS[1]] * 2


async def test_round_trips_are_averaged_so_one_outlier_does_not_move_traffic(pool):
    endpoint = pool.endpoints[0]
    assert endpoint.round_trip_s is None
    endpoint.measured(0.010)
    endpoint.measured(0.030)
    assert endpoint.round_trip_s == pytest.approx(0.020)


async def test_channels_ping_to_find_half_open_connections():
    options = TritonOptions(url="127.0.0.1:1", keepalive_time_s=3, keepalive_timeout_s=2)
    pool = EndpointPool("llama", "llama-3", options)
    await pool.open()
    try:
        channel_options = dict(pool._channel_options)
    finally:
        await pool.close()
    assert channel_options["grpc.keepalive_time_ms"] == 3000
    assert channel_options["grpc.keepalive_timeout_ms"] == 2000
    # Without it gRPC core waits 60 s for the ping's ack (measured in tests/faults).
    assert channel_options["grpc.http2.ping_timeout_ms"] == 2000


def test_a_request_without_a_deadline_is_bounded_by_default():
    options = TritonOptions(url="127.0.0.1:1")
    assert options.request_timeout_s == 300
    assert TritonOptions(url="127.0.0.1:1", request_timeout_s=None).request_timeout_s is None


async def test_one_endpoint_is_picked_whatever_its_health_and_trouble_is_reported():
    pool = await open_pool(URLS[:1])
    troubles: list[None] = []
    pool.on_trouble = lambda: troubles.append(None)
    try:
        assert urls(pool, 2) == URLS[:1] * 2
        assert troubles == []
        pool.endpoints[0].healthy = False
        assert urls(pool, 1) == URLS[:1]
        assert len(troubles) == 1
        with pytest.raises(BackendUnavailableError):
            pool.pick(exclude=pool.endpoints)
    finally:
        await pool.close()

"""A streaming handler whose client leaves while it is blocked on flow control ends as a
cancellation, through `write_or_await_cancellation`, and grpc logs no error for it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import pytest

from inferwire.api import peer_gone

METHOD = "/test.Flood/Flood"
MESSAGE = b"x" * (256 * 1024)  # a few of these fill the client's flow-control window


async def test_a_client_gone_mid_write_ends_the_handler_as_cancelled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    writes = 0

    async def flood(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        nonlocal writes
        try:
            while True:
                await peer_gone.write_or_await_cancellation(context, MESSAGE)
                writes += 1
        except asyncio.CancelledError:
            ended.set_result("cancelled")
            raise
        except BaseException as error:
            ended.set_result(type(error).__name__)
            raise

    handler = grpc.method_handlers_generic_handler(
        "test.Flood", {"Flood": grpc.unary_stream_rpc_method_handler(flood)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_stream(METHOD)(b"")
            await call.read()  # the stream is running; now stop reading
            for _ in range(200):  # until the server is blocked on the full window
                previous = writes
                await asyncio.sleep(0.02)
                if writes == previous:
                    break
            call.cancel()
            assert await asyncio.wait_for(ended, peer_gone.PEER_GONE_GRACE_S + 5) == "cancelled"
    finally:
        await server.stop(0)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]

"""Polling and stream-reading helpers for async tests against a live server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from inferwire.v1 import inference_pb2 as pb


async def read_rest(call: Any) -> list[Any]:
    """Read the remaining messages of a stream already read with `read()`."""
    messages = []
    while (message := await call.read()) is not grpc.aio.EOF:
        messages.append(message)
    return messages


async def model_health(stub: Any, model: str) -> pb.ModelHealth:
    response = await stub.Health(pb.HealthRequest(model=model))
    return response.models[0]


async def wait_until(
    predicate: Callable[[], Awaitable[bool]], timeout_s: float = 10.0, interval_s: float = 0.01
) -> None:
    """Poll an async predicate; fail the test if it never holds."""
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(interval_s)

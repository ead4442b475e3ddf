"""A stream write to a client that has just left, ended as the cancellation it is.

grpc.aio logs a failed write of a *yielded* message at ERROR when the client cancelled
while the server was blocked on flow control: the write fails a moment before grpc
marks the RPC cancelled. So streaming handlers write with the reader-writer API
(`context.write`) through `write_or_await_cancellation`, which catches that failure
and waits for the cancellation that follows; it ends the handler the ordinary way
(CancelledError, which closes the generation and counts the RPC as CANCELLED).

The failure's only name is private (`grpc._cython.cygrpc.ExecuteBatchError`); it is
imported here and nowhere else. tests/unit/api/test_peer_gone.py provokes it for real.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from grpc._cython import cygrpc  # type: ignore[attr-defined]

# How long a handler whose write failed waits for grpc to report the cancellation; if
# none comes, the write's error is raised after all.
PEER_GONE_GRACE_S = 5.0


async def write_or_await_cancellation(
    context: grpc.aio.ServicerContext[Any, Any], message: Any
) -> None:
    """Send one stream message; a client that left mid-write ends the RPC as a cancellation."""
    try:
        await context.write(message)
    except cygrpc.ExecuteBatchError:
        await asyncio.sleep(PEER_GONE_GRACE_S)  # cancelled here when the peer is gone
        raise

"""The HTTP listener streams on keep-alive connections: TCP_NODELAY on every connection.

Without it (asyncio sets it only on sockets it made, and the listener binds its own),
Nagle held each small event after a connection's first few until the client's delayed
ACK, so a second stream on the same connection arrived in one piece, ~40 ms late.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from inferwire.http.listener import HttpListener

EVENTS = 3


async def _events() -> AsyncIterator[bytes]:
    for i in range(EVENTS):
        yield f"data: {i}\n\n".encode()
        await asyncio.sleep(0.002)
    yield b"data: [DONE]\n\n"


async def _stream(request: Request) -> StreamingResponse:
    return StreamingResponse(_events(), media_type="text/event-stream")


def _request(sock: socket.socket) -> None:
    sock.sendall(b"GET /s HTTP/1.1\r\nHost: t\r\n\r\n")
    data = b""
    while b"[DONE]" not in data:
        data += sock.recv(65536)


async def test_every_connection_sends_each_event_at_once_without_nagle() -> None:
    server = HttpListener(
        Starlette(routes=[Route("/s", _stream)]),
        "127.0.0.1:0",
        None,
        read_timeout_s=30,
        max_header_bytes=16384,
    )
    port = await server.start(grace_s=1)
    try:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            await asyncio.to_thread(_request, sock)
            assert server._server is not None
            connections = list(server._server.server_state.connections)
            assert len(connections) == 1
            accepted = connections[0].transport.get_extra_info("socket")
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
            await asyncio.to_thread(_request, sock)  # and the connection still serves
    finally:
        await server.stop()

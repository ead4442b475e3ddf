"""The hooks of uvicorn's httptools protocol that the HTTP listener relies on.

http/listener.py subclasses `HttpToolsProtocol`, which is not a public API (pyproject pins
the minor versions it is tested with). Each hook it overrides, and each attribute of
uvicorn's it reads, is named here, so an upgrade that renames one fails in the unit tier
rather than silently dropping a bound: then a real connection shows the hooks at work
(a head over the limit is 431 and closed; a request within it is served).
"""

from __future__ import annotations

import asyncio
import inspect
import socket

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from inferwire.http.listener import HttpListener, protocol_class

OVERRIDDEN = (
    "connection_made",
    "data_received",
    "on_message_begin",
    "on_headers_complete",
    "on_message_complete",
    "on_response_complete",
    "send_400_response",
    "connection_lost",
)
# Set by uvicorn, read by the listener: the request's url and headers once parsed, the
# current cycle (its body still arriving), the ASGI state, the transport and the loop.
READ = ("url", "headers", "cycle", "app_state", "transport", "loop")


def test_every_overridden_hook_is_uvicorn_s_with_the_same_parameters():
    ours = protocol_class(30, 16384)
    for name in OVERRIDDEN:
        theirs = getattr(HttpToolsProtocol, name)
        assert inspect.signature(getattr(ours, name)) == inspect.signature(theirs), name


def test_the_attributes_read_are_set_by_uvicorn_s_protocol():
    source = inspect.getsource(HttpToolsProtocol)
    for name in READ:
        assert f"self.{name} =" in source or f"self.{name}:" in source, name


def _exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
            if b"\r\n\r\n" in data and (b"ok" in data or b"431" in data):
                break
        return data


async def _ok(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


async def test_a_connection_shows_the_hooks_at_work() -> None:
    listener = HttpListener(
        Starlette(routes=[Route("/", _ok)]), "127.0.0.1:0", None, 30, max_header_bytes=1024
    )
    port = await listener.start(grace_s=1)
    try:
        served = await asyncio.to_thread(_exchange, port, b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert served.startswith(b"HTTP/1.1 200") and served.endswith(b"ok")
        big = b"GET / HTTP/1.1\r\nHost: t\r\nx-big: " + b"a" * 2048 + b"\r\n\r\n"
        refused = await asyncio.to_thread(_exchange, port, big)
        assert refused.startswith(b"HTTP/1.1 431"), refused[:80]
    finally:
        await listener.stop()

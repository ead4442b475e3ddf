"""The HTTP streaming floor: a bare Starlette app on uvicorn (httptools) answering
`POST /v1/chat/completions` with one Server-Sent Event per token, no auth, no core, no
engine: what Starlette and uvicorn themselves need to stream a token, the floor for
inferwire's HTTP door (bench/http_overhead.py).

It reads `max_tokens` from the JSON body and sends that many chat chunks (the JSON an
OpenAI server sends, made with `json.dumps` per event as a plain app would), then a last
chunk with the usage and `data: [DONE]`, so the client code is the gateway's own.

Run as `python -m bench.sse_floor_server`; prints the bound port on stdout, then serves
until SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

PIECE = " tok"  # about the size of one decoded token


async def _events(count: int) -> AsyncIterator[bytes]:
    chunk = {
        "id": "chatcmpl-floor",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "demo",
        "system_fingerprint": None,
        "choices": [{"index": 0, "delta": {"content": PIECE}, "finish_reason": None}],
    }
    for _ in range(count):
        yield f"data: {json.dumps(chunk)}\n\n".encode()
    usage = {"prompt_tokens": 1, "completion_tokens": count, "total_tokens": count + 1}
    last = {**chunk, "choices": [], "usage": usage}
    yield f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode()


async def chat(request: Request) -> StreamingResponse:
    body = json.loads(await request.body())
    return StreamingResponse(
        _events(max(1, int(body.get("max_tokens", 1)))), media_type="text/event-stream"
    )


async def serve() -> None:
    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    # IPPROTO_TCP, as uvicorn's own listener has: asyncio then sets TCP_NODELAY on every
    # connection (without it, Nagle holds a keep-alive connection's later events).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app, http="httptools", lifespan="off", log_level="warning", access_log=False
    )
    print(sock.getsockname()[1], flush=True)
    await uvicorn.Server(config).serve(sockets=[sock])


if __name__ == "__main__":
    asyncio.run(serve())

"""The streaming floor: a bare grpc.aio server answering `InferStream` with one small
`InferStreamResponse` per token, no interceptors, no servicer class, no engine.

It reads the request (`parameters.max_tokens` is how many messages to send), then yields
that many messages of a few bytes of text each, the last one carrying `finish_reason` and
`usage` as inferwire's does, so the client code is the gateway's own. What it costs per
message is what grpc.aio itself needs to stream a token: the floor for the gateway's event
loop.

Run as `python -m bench.stream_floor_server`; prints the bound port on stdout, then serves
until SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from bench.baseline_servers import serve_until_signalled
from inferwire.v1 import inference_pb2 as pb

SERVICE = "inferwire.v1.InferenceService"
METHOD = "InferStream"
PIECE = " tok"  # about the size of one decoded token


async def stream(
    request: pb.InferStreamRequest, context: grpc.aio.ServicerContext
) -> AsyncIterator[pb.InferStreamResponse]:
    count = max(1, request.parameters.max_tokens)
    for _ in range(count - 1):
        yield pb.InferStreamResponse(request_id=request.request_id, model=request.model, text=PIECE)
    last = pb.InferStreamResponse(
        request_id=request.request_id,
        model=request.model,
        text=PIECE,
        finish_reason=pb.FINISH_REASON_LENGTH,
    )
    last.usage.completion_tokens = count
    yield last


async def serve() -> None:
    handler = grpc.unary_stream_rpc_method_handler(
        stream,
        request_deserializer=pb.InferStreamRequest.FromString,
        response_serializer=pb.InferStreamResponse.SerializeToString,
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler(SERVICE, {METHOD: handler})]
    )
    await serve_until_signalled(server)


if __name__ == "__main__":
    asyncio.run(serve())

"""ModelStreamInfer: many requests on one bidirectional stream, as Triton's decoupled models.

Every request read from the stream runs in a task of its own, so requests overlap; their
responses go through one bounded outbox to the one writer (grpc allows one write at a
time, and a full outbox holds generation back while the client reads slowly, as
InferStream's writes do). A request with `stream: true` gets one response per text delta;
every request's last response carries `triton_final_response: true`. A request that
fails answers with the stream response's `error_message`, and the stream stays open for
the others. When the client cancels the stream, its requests are cancelled in the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterable
from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as oip

from inferwire.api.calls import check_model_of
from inferwire.api.kserve.conventions import ParsedRequest, parse_request
from inferwire.api.kserve.responses import ChunkResponses, result_response
from inferwire.api.kserve.tensors import infer_response
from inferwire.api.peer_gone import write_or_await_cancellation
from inferwire.core.manager import ModelManager
from inferwire.edge.calls import current_call
from inferwire.edge.errors import ErrorReply, error_reply

log = logging.getLogger(__name__)

# Responses waiting for the writer; beyond this, the requests' generation waits.
OUTBOX_SIZE = 16
_END = object()  # the reader is done: no request will add a response after its tasks


class StreamSession:
    """One ModelStreamInfer call: reads requests, runs them, writes their responses."""

    def __init__(self, manager: ModelManager, context: grpc.aio.ServicerContext) -> None:
        self._manager = manager
        self._context = context
        self._outbox: asyncio.Queue[Any] = asyncio.Queue(OUTBOX_SIZE)
        self._requests: set[asyncio.Task[None]] = set()

    async def run(self, requests: AsyncIterable[oip.ModelInferRequest]) -> None:
        reader = asyncio.create_task(self._read(requests), name="model-stream-reader")
        try:
            while (message := await self._outbox.get()) is not _END:
                await write_or_await_cancellation(self._context, message)
            reader.result()  # a request that could not be read ends the call (decoding)
        finally:
            reader.cancel()
            for task in self._requests:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(reader, *self._requests, return_exceptions=True)

    async def _read(self, requests: AsyncIterable[oip.ModelInferRequest]) -> None:
        try:
            async for request in requests:
                task = asyncio.create_task(self._serve(request), name="model-stream-request")
                self._requests.add(task)
                task.add_done_callback(self._requests.discard)
            await asyncio.gather(*self._requests)
        except asyncio.CancelledError:
            raise  # `run` cancelled us: nobody writes any more, and a full outbox never frees
        except BaseException:
            await self._outbox.put(_END)  # the writer is still taking: it sees the end
            raise
        await self._outbox.put(_END)

    async def _serve(self, request: oip.ModelInferRequest) -> None:
        parsed: ParsedRequest | None = None
        try:
            call = current_call()
            check_model_of(call, request)  # each request's, as the call's is checked
            parsed = parse_request(
                request, self._context.time_remaining(), call.tenant, call.priority_hint
            )
            if parsed.stream:
                await self._stream(parsed)
            else:
                result = await self._manager.infer(parsed.inference)
                await self._send(result_response(parsed, result, final=True))
        except Exception as error:
            # The core's violations are named by the request's tensors and parameters
            # (parse_request's name them already).
            reply = error_reply(error, parsed.field_of if parsed is not None else None)
            await self._fail(request, reply)

    async def _stream(self, parsed: ParsedRequest) -> None:
        _, chunks = self._manager.infer_stream(parsed.inference)
        responses = ChunkResponses(parsed)
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                await self._send(responses.response(chunk))

    async def _send(self, response: oip.ModelInferResponse) -> None:
        await self._outbox.put(oip.ModelStreamInferResponse(infer_response=response))

    async def _fail(self, request: oip.ModelInferRequest, reply: ErrorReply) -> None:
        await self._outbox.put(
            oip.ModelStreamInferResponse(
                error_message=reply.message,
                infer_response=infer_response(request.model_name, request.id, ()),
            )
        )

"""Envoy's part in the inference gateway, played by the test: for each request, its ext-proc
filter asks the endpoint picker over `envoy.service.ext_proc.v3.ExternalProcessor/Process`
(the request's headers, then its body with end_of_stream), takes the endpoint from the
header mutation (`x-gateway-destination-endpoint`) with the headers the picker sets, sends
the request there as Envoy's ORIGINAL_DST cluster does, then reports the response's headers
and body to the picker and ends the stream, as Envoy does in the picker's processing mode.
The messages are those of the picker's own integration tests (test/integration/util.go)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc

DESTINATION = "x-gateway-destination-endpoint"
SCORES = "x-gateway-destination-endpoint-scores"
LB_NAMESPACE = "envoy.lb"  # the picker's dynamic-metadata namespace


class PickerRefused(Exception):
    """The picker answered with an immediate response (no endpoint) instead of a route."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"picker refused the request: HTTP {status} {body}")
        self.status = status


@dataclass
class Decision:
    """What the picker decided for one request."""

    endpoint: str  # address:port
    scores: dict[str, float]  # every endpoint it scored, by address:port
    headers: dict[str, str]  # the request's headers after the picker's mutation
    body: bytes


@dataclass
class Routed:
    decision: Decision
    status: int
    body: bytes

    @property
    def endpoint(self) -> str:
        return self.decision.endpoint


@dataclass
class Envoy:
    """One gateway: a channel to the picker's ext-proc port, an HTTP client to the pods."""

    channel: grpc.aio.Channel
    http: httpx.AsyncClient
    routed: list[Routed] = field(default_factory=list)

    async def send(
        self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> Routed:
        """Ask the picker, forward to the endpoint it names, tell it the response."""
        call = ext_proc_grpc.ExternalProcessorStub(self.channel).Process()
        try:
            decision = await self._decide(call, path, json.dumps(body).encode(), headers or {})
            reply = await self.http.post(
                f"http://{decision.endpoint}{path}", content=decision.body, headers=decision.headers
            )
            await self._report(call, reply)
        finally:
            call.cancel()
        routed = Routed(decision, reply.status_code, reply.content)
        self.routed.append(routed)
        return routed

    async def decide(
        self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> Decision:
        """What the picker decides for a request, which is then not sent (the call is
        cancelled before the body goes anywhere)."""
        call = ext_proc_grpc.ExternalProcessorStub(self.channel).Process()
        try:
            return await self._decide(call, path, json.dumps(body).encode(), headers or {})
        finally:
            call.cancel()

    async def _decide(self, call: Any, path: str, body: bytes, headers: dict[str, str]) -> Decision:
        request_headers = {
            ":method": "POST",
            ":path": path,
            ":scheme": "http",
            ":authority": "inference-gateway",
            "content-type": "application/json",
            "content-length": str(len(body)),
            **{k.lower(): v for k, v in headers.items()},
        }
        await call.write(
            ext_proc.ProcessingRequest(
                request_headers=ext_proc.HttpHeaders(headers=header_map(request_headers))
            )
        )
        await call.write(
            ext_proc.ProcessingRequest(
                request_body=ext_proc.HttpBody(body=body, end_of_stream=True)
            )
        )
        first = await self._read(call)
        if first.HasField("immediate_response"):
            answer = first.immediate_response
            raise PickerRefused(answer.status.code, answer.body.decode(errors="replace"))
        mutation = first.request_headers.response.header_mutation
        forwarded = {
            k: v
            for k, v in request_headers.items()
            if not k.startswith(":") and k not in mutation.remove_headers
        }
        for option in mutation.set_headers:
            key = option.header.key.lower()
            if not key.startswith(":"):  # pseudo-headers stay Envoy's own
                forwarded[key] = option.header.raw_value.decode() or option.header.value
        forwarded.pop("content-length", None)  # httpx sets the body's own
        chunks = []
        while True:  # the body, as the picker passes it on (possibly rewritten), in chunks
            message = await self._read(call)
            streamed = message.request_body.response.body_mutation.streamed_response
            chunks.append(streamed.body)
            if streamed.end_of_stream:
                break
        lb = first.dynamic_metadata.fields[LB_NAMESPACE].struct_value.fields
        scores = {k: v.number_value for k, v in lb[SCORES].struct_value.fields.items()}
        return Decision(forwarded.pop(DESTINATION), scores, forwarded, b"".join(chunks))

    async def _report(self, call: Any, reply: httpx.Response) -> None:
        response_headers = {":status": str(reply.status_code), **dict(reply.headers)}
        await call.write(
            ext_proc.ProcessingRequest(
                response_headers=ext_proc.HttpHeaders(headers=header_map(response_headers))
            )
        )
        await call.write(
            ext_proc.ProcessingRequest(
                response_body=ext_proc.HttpBody(body=reply.content, end_of_stream=True)
            )
        )
        await call.done_writing()
        while await call.read() is not grpc.aio.EOF:
            pass  # the picker's answers to the response phase: passed through unchanged

    @staticmethod
    async def _read(call: Any) -> ext_proc.ProcessingResponse:
        message = await call.read()
        if message is grpc.aio.EOF:
            raise AssertionError("the picker ended the ext-proc stream early")
        return message


def header_map(headers: dict[str, str]) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
    )

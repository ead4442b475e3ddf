"""The HTTP door's side of every call: each route's handler served as the edge's one call.

`HttpCalls.route` makes a route's Starlette endpoint. For each request it makes the edge's
call (edge/calls.py) from what only HTTP shows (the route, the peer, the headers, the
client certificate's subjects, from the TLS connection), which authenticates the caller and
keeps its span current; the handler gets the call. What is HTTP's alone stays here: a
refusal or error as OpenAI's error body with its status (through the one table,
http/errors.py), and when the call ends: at once for a whole answer, at the stream's end
for a stream (`finish_http`, called by streams.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from inferwire.core.requests import Priority
from inferwire.edge.calls import Call, Method, Reception
from inferwire.edge.errors import Code
from inferwire.edge.methods import facts_of
from inferwire.http.bodies import ClientGone
from inferwire.http.errors import HTTP_STATUS, http_error
from inferwire.http.metrics import HttpMetrics

# A route's handler: the call and the request in, the response out.
Handler = Callable[[Call, Request], Awaitable[Response]]
TLS_SUBJECTS = "inferwire.tls_subjects"  # the connection's client certificate (listener.py)


def peer_of(request: Request) -> str:
    """The client as grpc names its peers: `ipv4:127.0.0.1:52110`, `ipv6:[::1]:52110`."""
    client = request.client
    if client is None:
        return ""
    host, port = client
    return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"


def finish_http(call: Call, status: int, code: Code, why: str = "") -> None:
    """The answer has gone out with `status` (or the client has gone): end the call."""
    call.set_span_attribute("http.response.status_code", status)
    call.finish(code, why, status)


class HttpCalls:
    """Makes each route's endpoint: its requests served as calls of the edge's reception,
    counted in the HTTP series."""

    def __init__(self, reception: Reception, metrics: HttpMetrics) -> None:
        self._reception, self._metrics = reception, metrics

    def route(
        self, method: str, path: str, handler: Handler
    ) -> Callable[[Request], Awaitable[Response]]:
        """The Starlette endpoint of `handler`, served with the facts of `method path` in
        the edge's one table (edge/methods.py)."""
        name = f"{method} {path}"
        spec = Method(
            name=name,
            what=name,
            facts=facts_of(name),
            series=self._metrics.route(method, path),
            span_name=name,
            span_attributes={"http.request.method": method, "http.route": path},
        )
        reception = self._reception

        async def endpoint(request: Request) -> Response:
            call = reception.call(
                spec,
                peer_of(request),
                request.headers,
                lambda: request.scope.get("state", {}).get(TLS_SUBJECTS, ()),
            )
            with call.served():
                try:
                    call.authenticate()
                    response = await handler(call, request)
                except ClientGone:
                    finish_http(call, HTTP_STATUS[Code.CANCELLED], Code.CANCELLED)
                    return Response(status_code=HTTP_STATUS[Code.CANCELLED])
                except Exception as error:
                    return error_response(call, error)
            if not getattr(response, "streams", False):  # a stream's call ends with it
                status = response.status_code
                finish_http(call, status, Code.OK if status < 400 else _code_of(response))
            return response

        return endpoint


def generation_call(
    call: Call, request: Request, body: Any
) -> tuple[str | None, str, Priority | None]:
    """A generation route's first steps with its decoded `body`: the caller's
    `x-request-id` (noted for a refusal's access line), the model the body names checked
    before the body is read any further, and the tenant and priority hint it runs as."""
    request_id = request.headers.get("x-request-id")
    call.request_id = request_id or ""
    if isinstance(body, dict) and isinstance(body.get("model"), str):
        call.require_model(body["model"])
    tenant, hint = call.tenancy()
    return request_id, tenant, hint


def error_response(call: Call, error: BaseException) -> JSONResponse:
    """OpenAI's error body for `error`, with its status and headers; the call ends here."""
    status, body, headers, code = http_error(error)
    finish_http(call, status, code, body["error"]["message"])
    return JSONResponse(body, status_code=status, headers=headers)


def _code_of(response: Response) -> Code:
    """The code of an answer that is not an error body: /health's 503 (not serving)."""
    return Code.UNAVAILABLE if response.status_code == 503 else Code.UNKNOWN

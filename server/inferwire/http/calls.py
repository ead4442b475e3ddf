"""Every HTTP request as the edge sees a call: its principal, its span, its access line.

`Endpoints.route` wraps a route's handler: it finds the caller (edge/callers.py) with
the scope the route needs, makes the request the edge's current call (so the core's
record of an inference request joins its access line), opens its SERVER span (continuing
the `traceparent` header), turns anything raised into OpenAI's error body, and writes the
one access line when the answer has gone out: at once for a whole answer, at the stream's
end for a stream (`HttpCall.finish`, called by streams.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from inferwire.core.auth import UNRESTRICTED, Principal, Scope
from inferwire.edge.access import access_logged, write_access_line
from inferwire.edge.callers import Callers
from inferwire.edge.calls import CallRecord, begin_call
from inferwire.edge.errors import Code
from inferwire.edge.tracing import ServerTracing
from inferwire.http.bodies import ClientGone
from inferwire.http.errors import HTTP_STATUS, http_error

log = logging.getLogger(__name__)

# A route's handler: the call and the request in, the response out.
Handler = Callable[["HttpCall", Request], Awaitable[Response]]
TLS_SUBJECTS = "inferwire.tls_subjects"  # the connection's client certificate (server.py)


def peer_of(request: Request) -> str:
    """The client as grpc names its peers: `ipv4:127.0.0.1:52110`, `ipv6:[::1]:52110`."""
    client = request.client
    if client is None:
        return ""
    host, port = client
    return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"


class HttpCall(CallRecord):
    """One HTTP request being served."""

    __slots__ = (
        "_done",
        "_span",
        "_tracing",
        "inference",
        "method",
        "named",
        "peer",
        "principal",
        "started",
    )

    def __init__(self, method: str, peer: str, inference: bool) -> None:
        super().__init__()
        self.method, self.peer, self.inference = method, peer, inference
        self.principal: Principal = UNRESTRICTED
        self.named = ("", "")  # the model and request id the request names, once read
        self.started = time.perf_counter()
        self._span: Any = None
        self._tracing: ServerTracing | None = None
        self._done = False

    def finish(self, status: int, code: Code, why: str = "") -> None:
        """The answer has gone out (or the client has gone): end the span, write the line."""
        if self._done:
            return
        self._done = True
        elapsed = time.perf_counter() - self.started
        if self._span is not None and self._tracing is not None:
            self._span.set_attribute("http.response.status_code", status)
            self._tracing.end(self._span, code, why)
        if access_logged():
            write_access_line(
                self.method,
                self.peer,
                code.name,
                self.principal,
                self.record,
                elapsed,
                inference=self.inference,
                model=self.named[0],
                request_id=self.named[1],
                trace_id=self.trace_id,
                status=status,
            )


class Endpoints:
    """What every route shares: the callers, the tracing, how big a body may be and how
    long it may take to arrive."""

    def __init__(
        self,
        callers: Callers,
        tracing: ServerTracing | None,
        max_body_bytes: int,
        body_timeout_s: float,
    ) -> None:
        self.callers, self.tracing = callers, tracing
        self.max_body_bytes, self.body_timeout_s = max_body_bytes, body_timeout_s

    def route(
        self, method: str, path: str, scope: Scope | None, handler: Handler, inference: bool = False
    ) -> Callable[[Request], Awaitable[Response]]:
        """The Starlette endpoint of `handler`; `scope`: what the caller needs (None: open)."""
        name = f"{method} {path}"
        callers, tracing = self.callers, self.tracing

        async def endpoint(request: Request) -> Response:
            call = HttpCall(name, peer_of(request), inference)
            begin_call(call)
            if tracing is not None:
                call._tracing = tracing
                call._span = tracing.start_server_span(
                    name,
                    request.headers,
                    {"http.request.method": method, "url.path": request.url.path},
                )
                with tracing.current(call._span):
                    return await _served(call, request, handler, callers, scope, name)
            return await _served(call, request, handler, callers, scope, name)

        return endpoint


async def _served(
    call: HttpCall,
    request: Request,
    handler: Handler,
    callers: Callers,
    scope: Scope | None,
    name: str,
) -> Response:
    try:
        call.principal = callers.caller(
            request.headers.get("authorization"),
            scope,
            name,
            lambda: request.scope.get("state", {}).get(TLS_SUBJECTS, ()),
        )
        response = await handler(call, request)
    except ClientGone:
        call.finish(HTTP_STATUS[Code.CANCELLED], Code.CANCELLED)
        return Response(status_code=HTTP_STATUS[Code.CANCELLED])
    except Exception as error:
        return error_response(call, error)
    if not getattr(response, "streams", False):  # a stream's line is written at its end
        call.finish(
            response.status_code, Code.OK if response.status_code < 400 else _code_of(response)
        )
    return response


def error_response(call: HttpCall, error: BaseException) -> JSONResponse:
    """OpenAI's error body for `error`, with its status and headers; the call ends here."""
    status, body, headers, code = http_error(error)
    call.finish(status, code, body["error"]["message"])
    return JSONResponse(body, status_code=status, headers=headers)


def _code_of(response: Response) -> Code:
    """The code of an answer that is not an error body: /health's 503 (not serving)."""
    return Code.UNAVAILABLE if response.status_code == 503 else Code.UNKNOWN

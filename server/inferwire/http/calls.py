"""The HTTP door's side of every call: each route's handler served as the edge's one call.

`HttpCalls.route` makes a route's Starlette endpoint. For each request it makes the edge's
call (edge/calls.py) from what only HTTP shows (the route, its facts from the edge's one
table, the peer, the headers, the client certificate's subjects, from the TLS connection),
which authenticates the caller and keeps its span current; it reads a POST route's body
and lets the call check the model the request names, then runs the handler, whose call
is the current one. What is HTTP's alone stays here: a refusal or error as OpenAI's error
body with its status (the call's reply through the one table, http/errors.py), and when
the call ends: at once for a whole answer, at the stream's end for a stream
(`finish_http`, called by streams.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from inferwire.edge.calls import Call, Method, Reception
from inferwire.edge.errors import Code, ErrorReply
from inferwire.edge.methods import facts_of
from inferwire.http.bodies import ClientGone, read_json
from inferwire.http.errors import HTTP_STATUS, http_answer
from inferwire.http.metrics import HttpMetrics

# A route's handler: the request and its JSON body (None: a route that takes none) in, the
# response out. Its call is the current one (edge/calls.py `current_call`), as on gRPC.
Handler = Callable[[Request, Any], Awaitable[Response]]
# How a route writes an error: its status, body and headers (OpenAI's body by default,
# http/errors.py; Anthropic's on its routes, http/anthropic/errors.py).
ErrorAnswer = Callable[[ErrorReply], tuple[int, dict[str, Any], dict[str, str]]]
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
    counted in the HTTP series, their JSON bodies read within bounds."""

    def __init__(
        self,
        reception: Reception,
        metrics: HttpMetrics,
        max_body_bytes: int,
        body_timeout_s: float,
    ) -> None:
        """`max_body_bytes`, `body_timeout_s`: how large a body may be, and how long it
        may take to arrive (http/bodies.py)."""
        self._reception, self._metrics = reception, metrics
        self._max_body_bytes, self._body_timeout_s = max_body_bytes, body_timeout_s

    def route(
        self, method: str, path: str, handler: Handler, answer: ErrorAnswer = http_answer
    ) -> Callable[[Request], Awaitable[Response]]:
        """The Starlette endpoint of `handler`, served with the facts of `method path` in
        the edge's one table (edge/methods.py). A POST route's body is read before the
        handler runs, so that the model it names is checked first. `answer` writes its
        errors."""
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
        takes_body, inference = method == "POST", spec.facts.inference
        bounds = self._max_body_bytes, self._body_timeout_s

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
                    body = await read_json(request, *bounds) if takes_body else None
                    if inference:  # named by a refusal's access line too
                        call.request_id = request.headers.get("x-request-id") or ""
                    call.check_model(_field_reader(request, body))
                    response = await handler(request, body)
                except ClientGone:
                    finish_http(call, HTTP_STATUS[Code.CANCELLED], Code.CANCELLED)
                    return Response(status_code=HTTP_STATUS[Code.CANCELLED])
                except Exception as error:
                    return error_response(call, error, answer)
            if not getattr(response, "streams", False):  # a stream's call ends with it
                status = response.status_code
                finish_http(call, status, Code.OK if status < 400 else _code_of(response))
            return response

        return endpoint


def _field_reader(request: Request, body: Any) -> Callable[[str], object]:
    """A request's field by name: the route's path parameter, else the body's member."""
    params = request.path_params

    def field(name: str) -> object:
        if name in params:
            return params[name]
        return body.get(name) if isinstance(body, dict) else None

    return field


def error_response(
    call: Call, error: BaseException, answer: ErrorAnswer = http_answer
) -> JSONResponse:
    """The error body for `error` (`answer`'s: OpenAI's by default), with its status and
    headers; the call ends here."""
    reply = call.error_reply(error)
    status, body, headers = answer(reply)
    finish_http(call, status, reply.code, reply.message)
    return JSONResponse(body, status_code=status, headers=headers)


def _code_of(response: Response) -> Code:
    """The code of an answer that is not an error body: /health's 503 (not serving)."""
    return Code.UNAVAILABLE if response.status_code == 503 else Code.UNKNOWN

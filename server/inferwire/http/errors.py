"""An error as OpenAI's error body, with the HTTP status of its code.

The code comes from the edge's one table (edge/errors.py); the status from the standard
mapping of canonical codes to HTTP (the one grpc-gateway and Google APIs use), but
FAILED_PRECONDITION, a model not loaded or unloading, is 503 so that the SDKs' retry
applies, and a door's own refusal that HTTP has a status of its own for (a body too large
413, of the wrong type 415, too slow 408; a head too large 431; a method a route does not
take 405) has it. RESOURCE_EXHAUSTED with a retry delay carries `Retry-After` (whole
seconds, rounded up). The body is `{"error": {"message", "type", "param", "code"}}`:
`param` names the first invalid field (or the part of the request at fault), `code` is
the canonical code's name. Every error body is made here, of an ErrorReply.
"""

from __future__ import annotations

import math
from typing import Any

from inferwire.edge.errors import Code, ErrorReply

HTTP_STATUS: dict[Code, int] = {
    Code.OK: 200,
    Code.CANCELLED: 499,
    Code.UNKNOWN: 500,
    Code.INVALID_ARGUMENT: 400,
    Code.DEADLINE_EXCEEDED: 504,
    Code.NOT_FOUND: 404,
    Code.ALREADY_EXISTS: 409,
    Code.PERMISSION_DENIED: 403,
    Code.RESOURCE_EXHAUSTED: 429,
    Code.FAILED_PRECONDITION: 503,
    Code.ABORTED: 409,
    Code.OUT_OF_RANGE: 400,
    Code.UNIMPLEMENTED: 501,
    Code.INTERNAL: 500,
    Code.UNAVAILABLE: 503,
    Code.DATA_LOSS: 500,
    Code.UNAUTHENTICATED: 401,
}
# OpenAI's `type` for the statuses its SDKs map to their own exception classes.
_ERROR_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    431: "invalid_request_error",
    429: "rate_limit_error",
    499: "cancelled",
    500: "internal_error",
    501: "not_implemented_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


def http_answer(reply: ErrorReply) -> tuple[int, dict[str, Any], dict[str, str]]:
    """The status, OpenAI's error body and the headers of an error's `reply` (edge/errors.py:
    a call's `error_reply`, or `error_reply` of a refusal made before there is a call)."""
    status = reply.http_status or HTTP_STATUS[reply.code]
    body = {
        "error": {
            "message": reply.message,
            "type": _ERROR_TYPE.get(status, "error"),
            "param": reply.violations[0].field if reply.violations else reply.field,
            "code": reply.code.name.lower(),
        }
    }
    return status, body, _headers(reply)


def _headers(reply: ErrorReply) -> dict[str, str]:
    if reply.code is Code.RESOURCE_EXHAUSTED and reply.retry_delay_s is not None:
        return {"retry-after": str(max(1, math.ceil(reply.retry_delay_s)))}
    return {}

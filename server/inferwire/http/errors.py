"""An error as OpenAI's error body, with the HTTP status of its code.

The code comes from the edge's one table (edge/errors.py); the status from the standard
mapping of canonical codes to HTTP (the one grpc-gateway and Google APIs use), but
FAILED_PRECONDITION, a model not loaded or unloading, is 503 so that the SDKs' retry
applies. RESOURCE_EXHAUSTED with a retry delay carries `Retry-After` (whole seconds,
rounded up). The body is `{"error": {"message", "type", "param", "code"}}`: `param` names
the first invalid field, `code` is the canonical code's name.
"""

from __future__ import annotations

import math
from typing import Any

from inferwire.edge.calls import Call
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


class HttpError(Exception):
    """A refusal of the HTTP layer's own: a body too large, of the wrong type, or unreadable."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: Code = Code.INVALID_ARGUMENT,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def error_body(status: int, message: str, param: str | None, code: str) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _ERROR_TYPE.get(status, "error"),
            "param": param,
            "code": code,
        }
    }


def http_error(
    call: Call, error: BaseException
) -> tuple[int, dict[str, Any], dict[str, str], Code]:
    """Status, body, headers and canonical code for `error` (anything a request raised),
    answered as `call`'s (its `error_reply`)."""
    if isinstance(error, HttpError):
        body = error_body(error.status, error.message, error.param, error.code.name.lower())
        return error.status, body, {}, error.code
    reply = call.error_reply(error)
    status = HTTP_STATUS[reply.code]
    return status, reply_body(status, reply), _headers(reply), reply.code


def reply_body(status: int, reply: ErrorReply) -> dict[str, Any]:
    param = reply.violations[0].field if reply.violations else None
    return error_body(status, reply.message, param, reply.code.name.lower())


def _headers(reply: ErrorReply) -> dict[str, str]:
    if reply.code is Code.RESOURCE_EXHAUSTED and reply.retry_delay_s is not None:
        return {"retry-after": str(max(1, math.ceil(reply.retry_delay_s)))}
    return {}

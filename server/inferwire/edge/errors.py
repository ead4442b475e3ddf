"""The one table from domain errors to status codes, and the bounded answer a caller gets.

A transport turns the `ErrorReply` of an error into its own wire: gRPC a status with
`google.rpc` details (api/status.py), HTTP a status line and an error body. The codes are
the canonical ones (google.rpc.Code, which grpc and HTTP gateways map the same way).
Besides the core's errors, the table holds the refusals a door makes of a request itself
(`RequestRefusedError`: a body too large, of the wrong type, too slow, not JSON; a head
too large; a route or a stored response that is not there), each with its code and,
where HTTP has a status of its own for it (413, 415, 408, 431, 405), that status.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass

from inferwire.core import errors

log = logging.getLogger(__name__)


class Code(enum.IntEnum):
    """The canonical status codes (google.rpc.Code), by the number they carry on the wire."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class RequestRefusedError(errors.InferwireError):
    """A refusal a door makes of a request itself: of what only the door reads or keeps
    (its body, its route, the Responses API's store). `field`: the part at fault (`body`,
    or where in it), if any; `http_status`: HTTP's own status for the kind, where that is
    not its code's (http/errors.py)."""

    http_status: int | None = None

    def __init__(self, message: str, field: str | None = "body") -> None:
        super().__init__(message)
        self.field = field


class BodyTooLargeError(RequestRefusedError):
    """The body is larger than the server takes (`server.max_receive_message_bytes`, on
    gRPC RESOURCE_EXHAUSTED too)."""

    http_status = 413


class UnsupportedMediaTypeError(RequestRefusedError):
    """The body is of a content type the door does not read."""

    http_status = 415


class BodyTimeoutError(RequestRefusedError):
    """The body did not arrive in time (a slow sender)."""

    http_status = 408


class MalformedRequestError(RequestRefusedError):
    """The request is not valid HTTP/1.1, or its body not UTF-8, not JSON, nested too
    deeply, or not text."""


class HeadTooLargeError(RequestRefusedError):
    """The request's line and headers are larger than the server takes. INVALID_ARGUMENT,
    as it has always been answered, though gRPC answers metadata over its limit
    RESOURCE_EXHAUSTED."""

    http_status = 431


class NotFoundError(RequestRefusedError):
    """What the request names is not there: a stored response, a route (a model's absence
    is the core's ModelNotFoundError)."""


class MethodNotAllowedError(RequestRefusedError):
    """The route does not take the request's method."""

    http_status = 405


# The design's table; each error kind's docstring (core/errors.py, and the door's own
# refusals above) says when it is raised. Subclasses inherit their parent's code; anything
# not listed is INTERNAL.
CODE_BY_ERROR: dict[type[errors.InferwireError], Code] = {
    errors.InvalidArgumentError: Code.INVALID_ARGUMENT,
    errors.BackendInvalidArgumentError: Code.INVALID_ARGUMENT,
    errors.ModelNotFoundError: Code.NOT_FOUND,
    errors.ModelNotReadyError: Code.FAILED_PRECONDITION,
    errors.BackendUnavailableError: Code.UNAVAILABLE,
    errors.StoreUnavailableError: Code.UNAVAILABLE,
    errors.BackendCancelledError: Code.CANCELLED,
    errors.QueueFullError: Code.RESOURCE_EXHAUSTED,
    errors.MemoryExhaustedError: Code.RESOURCE_EXHAUSTED,
    errors.QuotaExceededError: Code.RESOURCE_EXHAUSTED,
    errors.DeadlineExceededError: Code.DEADLINE_EXCEEDED,
    errors.UnauthenticatedError: Code.UNAUTHENTICATED,
    errors.PermissionDeniedError: Code.PERMISSION_DENIED,
    errors.AlreadyExistsError: Code.ALREADY_EXISTS,
    errors.NotSupportedError: Code.UNIMPLEMENTED,
    BodyTooLargeError: Code.RESOURCE_EXHAUSTED,
    UnsupportedMediaTypeError: Code.INVALID_ARGUMENT,
    BodyTimeoutError: Code.DEADLINE_EXCEEDED,
    MalformedRequestError: Code.INVALID_ARGUMENT,
    HeadTooLargeError: Code.INVALID_ARGUMENT,
    NotFoundError: Code.NOT_FOUND,
    MethodNotAllowedError: Code.UNIMPLEMENTED,
}


def code_for(error: BaseException) -> Code:
    for kind in type(error).__mro__:
        code = CODE_BY_ERROR.get(kind)
        if code is not None:
            return code
    return Code.INTERNAL


# Client input reaches answers through messages and field descriptions (a model name, a
# stop string, a backend's echo of the prompt). Every answer is cut to these sizes, so a
# gRPC status (grpc-message plus grpc-status-details-bin) stays far below the 8 KiB of
# metadata that clients accept, even percent-encoded (up to 3x) and base64 (4/3).
MAX_MESSAGE_BYTES = 512
MAX_FIELD_BYTES = 128
MAX_DESCRIPTION_BYTES = 256
MAX_DETAILS_BYTES = 2048

INTERNAL_MESSAGE = "internal error; see the server log"


def bounded(text: str, max_bytes: int) -> str:
    """`text` when it fits in `max_bytes` of UTF-8; else its head, an ellipsis and its length."""
    encoded = text.encode()
    if len(encoded) <= max_bytes:
        return text
    suffix = f"… ({len(text)} characters)"
    head = encoded[: max_bytes - len(suffix.encode())].decode(errors="ignore")
    return head + suffix


@dataclass(frozen=True)
class QuotaViolation:
    """Which quota a tenant is over (google.rpc.QuotaFailure)."""

    subject: str  # `tenant:<name>`, bounded
    description: str


@dataclass(frozen=True)
class ErrorReply:
    """What a caller is told of an error: its code, a bounded message, and the details a
    client acts on (the fields to fix, the quota, when to retry)."""

    code: Code
    message: str
    violations: tuple[errors.FieldViolation, ...] = ()
    quota: QuotaViolation | None = None
    retry_delay_s: float | None = None
    field: str | None = None  # the part of the request at fault, when no violation names it
    http_status: int | None = None  # HTTP's own status for the error, if not its code's


def error_reply(error: BaseException, field_of: Callable[[str], str] | None = None) -> ErrorReply:
    """The answer to `error`: its mapped code and bounded details, or for an unexpected
    error a generic INTERNAL, its stack trace logged here and never sent. `field_of`: the
    core's field names -> the caller's (Call.name_fields), for the core's violations of
    a request whose door names its fields otherwise."""
    code = code_for(error)
    if not isinstance(error, errors.InferwireError) or code is Code.INTERNAL:
        log.error("unhandled error in a call", exc_info=error)
        return ErrorReply(Code.INTERNAL, INTERNAL_MESSAGE)
    violations: tuple[errors.FieldViolation, ...] = ()
    if isinstance(error, errors.InvalidArgumentError):
        if field_of is not None:
            error = error.renamed(field_of)
        violations = tuple(
            errors.FieldViolation(
                bounded(v.field, MAX_FIELD_BYTES), bounded(v.description, MAX_DESCRIPTION_BYTES)
            )
            for v in error.violations
        )
    quota = None
    if isinstance(error, errors.QuotaExceededError):
        subject = bounded(f"tenant:{error.tenant}", MAX_FIELD_BYTES)
        quota = QuotaViolation(subject, f"{error.limit} exceeded")
    field, http_status = None, None
    if isinstance(error, RequestRefusedError):
        field = None if error.field is None else bounded(error.field, MAX_FIELD_BYTES)
        http_status = error.http_status
    return ErrorReply(
        code,
        bounded(str(error), MAX_MESSAGE_BYTES),
        violations,
        quota,
        error.retry_delay_s,
        field,
        http_status,
    )

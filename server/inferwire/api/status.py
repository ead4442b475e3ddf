"""Where domain errors become gRPC statuses: the edge's ErrorReply (edge/errors.py, the one
table and the bounds) written as a status with google.rpc details.

The call interceptor (api/calls.py) answers whatever any RPC of any service raises with
`client_status`, of the call's `error_reply`; nothing else builds a status.
`serves_every_rpc` refuses a servicer that lacks an RPC of its service, so none answers
with the generated stub's UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf import any_pb2
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from inferwire.core import errors
from inferwire.edge.errors import (
    MAX_DESCRIPTION_BYTES,
    MAX_DETAILS_BYTES,
    Code,
    ErrorReply,
    error_reply,
)


def bad_request(violations: Sequence[errors.FieldViolation]) -> error_details_pb2.BadRequest:
    """Bounded violations (ErrorReply's) as google.rpc.BadRequest, all within
    MAX_DETAILS_BYTES: those that do not fit are counted in a last entry."""
    details = error_details_pb2.BadRequest()
    for index, violation in enumerate(violations):
        entry = error_details_pb2.BadRequest.FieldViolation(
            field=violation.field, description=violation.description
        )
        if details.ByteSize() + entry.ByteSize() + 8 > MAX_DETAILS_BYTES - MAX_DESCRIPTION_BYTES:
            details.field_violations.add(
                field=entry.field,
                description=f"and {len(violations) - index} more violations, not shown",
            )
            break
        details.field_violations.append(entry)
    return details


def reply_status(reply: ErrorReply) -> grpc.Status:
    """An ErrorReply as a grpc status: the code, the message, and google.rpc details
    (BadRequest, QuotaFailure, RetryInfo)."""
    status = status_pb2.Status(code=int(reply.code), message=reply.message)
    details: list[Message] = []
    if reply.violations:
        details.append(bad_request(reply.violations))
    if reply.quota is not None:
        failure = error_details_pb2.QuotaFailure()
        failure.violations.add(subject=reply.quota.subject, description=reply.quota.description)
        details.append(failure)
    if reply.retry_delay_s is not None:
        retry = error_details_pb2.RetryInfo()
        retry.retry_delay.FromNanoseconds(round(reply.retry_delay_s * 1e9))
        details.append(retry)
    for detail in details:
        packed = any_pb2.Any()
        packed.Pack(detail)
        status.details.append(packed)
    return rpc_status.to_status(status)


def to_rpc_status(error: errors.InferwireError) -> grpc.Status:
    return reply_status(error_reply(error))


def client_status(reply: ErrorReply) -> tuple[grpc.StatusCode, str, tuple[Any, ...]]:
    """The code, message and trailing metadata a client gets for an error's `reply`
    (edge/errors.py `error_reply`, the call's `error_reply`)."""
    if reply.code is Code.INTERNAL:
        return grpc.StatusCode.INTERNAL, reply.message, ()
    status = reply_status(reply)
    return status.code, status.details or "", tuple(status.trailing_metadata or ())


T = TypeVar("T")


def serves_every_rpc(service: ServiceDescriptor) -> Callable[[type[T]], type[T]]:
    """Class decorator: refuse a servicer that lacks an RPC of `service`.

    A method the service declares but the class does not define (only the generated
    base's UNIMPLEMENTED stub) is a bug, so it fails at import time, not at call time.
    """

    def check(cls: type[T]) -> type[T]:
        for method in service.methods:
            if method.name not in cls.__dict__:
                raise TypeError(
                    f"{cls.__name__} does not implement {service.full_name}.{method.name}"
                )
        return cls

    return check


# ---- the code an RPC ended with ----------------------------------------------------

_CODES = {code.value[0]: code for code in grpc.StatusCode}


def deadline_of(context: grpc.aio.ServicerContext[Any, Any]) -> float | None:
    """The call's deadline on the `time.monotonic` clock, or None; read when the RPC starts
    (see the rule in api/handlers.py)."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


def rpc_code(
    context: grpc.aio.ServicerContext[Any, Any],
    deadline: float | None,
    error: BaseException | None,
) -> grpc.StatusCode:
    """The status an RPC ended with, given what escaped its handler (None: nothing) and its
    `deadline_of`. Called as the handler's task ends: `code()` is the status a handler set
    or aborted with, kept on the Python side."""
    if isinstance(error, asyncio.CancelledError | GeneratorExit):
        deadline_passed = deadline is not None and time.monotonic() >= deadline
        return grpc.StatusCode.DEADLINE_EXCEEDED if deadline_passed else grpc.StatusCode.CANCELLED
    if error is not None and not isinstance(error, grpc.aio.AbortError):
        return grpc.StatusCode.UNKNOWN
    return status_code(context.code())


def status_code(code: Any) -> grpc.StatusCode:
    """grpc.aio's `context.code()`, whichever form it takes; OK when none was set."""
    if isinstance(code, grpc.StatusCode):
        return code
    return _CODES.get(code, grpc.StatusCode.OK) if isinstance(code, int) else grpc.StatusCode.OK

"""The one place where domain errors become gRPC status codes, and statuses are bounded.

Every RPC of a servicer goes through `map_errors`: `maps_errors_on_every_rpc`
wraps each method the service descriptor names, and refuses a class that lacks
one, so a new RPC cannot skip the mapping. Nothing else builds a status.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar, cast

import grpc
from google.protobuf import any_pb2
from google.protobuf.descriptor import ServiceDescriptor
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from inferwire.core import errors

log = logging.getLogger(__name__)

# Error kind -> status code, as in the design's table. Subclasses inherit their
# parent's code; anything not listed is INTERNAL with a generic message.
STATUS_CODE_BY_ERROR: dict[type[errors.InferwireError], grpc.StatusCode] = {
    # A request field is invalid; details carry google.rpc.BadRequest.
    errors.InvalidArgumentError: grpc.StatusCode.INVALID_ARGUMENT,
    # The backend (e.g. Triton) refused the request as invalid; its message says why.
    errors.BackendInvalidArgumentError: grpc.StatusCode.INVALID_ARGUMENT,
    # The model is not configured (or not on its backend).
    errors.ModelNotFoundError: grpc.StatusCode.NOT_FOUND,
    # The model is known but not READY: fail closed.
    errors.ModelNotReadyError: grpc.StatusCode.FAILED_PRECONDITION,
    # The backend cannot be reached or is unhealthy.
    errors.BackendUnavailableError: grpc.StatusCode.UNAVAILABLE,
    # The backend cancelled the request by itself.
    errors.BackendCancelledError: grpc.StatusCode.CANCELLED,
    # Concurrency slots and the wait queue are full.
    errors.QueueFullError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    # A model does not fit its memory budget; for a request, details carry RetryInfo.
    errors.MemoryExhaustedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    # A tenant is over a quota; details carry QuotaFailure and RetryInfo.
    errors.QuotaExceededError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    # The request's deadline passed.
    errors.DeadlineExceededError: grpc.StatusCode.DEADLINE_EXCEEDED,
    # No valid credentials.
    errors.UnauthenticatedError: grpc.StatusCode.UNAUTHENTICATED,
    # Credentials lack the needed scope.
    errors.PermissionDeniedError: grpc.StatusCode.PERMISSION_DENIED,
    # A model of that name exists with another definition.
    errors.AlreadyExistsError: grpc.StatusCode.ALREADY_EXISTS,
    # An RPC (or a feature of one) this server does not offer.
    errors.NotSupportedError: grpc.StatusCode.UNIMPLEMENTED,
}


def status_code_for(error: BaseException) -> grpc.StatusCode:
    for kind in type(error).__mro__:
        code = STATUS_CODE_BY_ERROR.get(kind)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


# Client input reaches statuses through messages and field descriptions (a model name,
# a stop string, a backend's echo of the prompt). Every status is cut to these sizes, so
# grpc-message plus grpc-status-details-bin stay far below the 8 KiB of metadata that
# clients accept, even after percent-encoding (up to 3x) and base64 (4/3).
MAX_MESSAGE_BYTES = 512
MAX_FIELD_BYTES = 128
MAX_DESCRIPTION_BYTES = 256
MAX_DETAILS_BYTES = 2048


def bounded(text: str, max_bytes: int) -> str:
    """`text` when it fits in `max_bytes` of UTF-8; else its head, an ellipsis and its length."""
    encoded = text.encode()
    if len(encoded) <= max_bytes:
        return text
    suffix = f"… ({len(text)} characters)"
    head = encoded[: max_bytes - len(suffix.encode())].decode(errors="ignore")
    return head + suffix


def bad_request(violations: list[errors.FieldViolation]) -> error_details_pb2.BadRequest:
    """The violations as google.rpc.BadRequest, each bounded, all within MAX_DETAILS_BYTES."""
    details = error_details_pb2.BadRequest()
    for index, violation in enumerate(violations):
        entry = error_details_pb2.BadRequest.FieldViolation(
            field=bounded(violation.field, MAX_FIELD_BYTES),
            description=bounded(violation.description, MAX_DESCRIPTION_BYTES),
        )
        if details.ByteSize() + entry.ByteSize() + 8 > MAX_DETAILS_BYTES - MAX_DESCRIPTION_BYTES:
            details.field_violations.add(
                field=entry.field,
                description=f"and {len(violations) - index} more violations, not shown",
            )
            break
        details.field_violations.append(entry)
    return details


def to_rpc_status(error: errors.InferwireError) -> grpc.Status:
    code = status_code_for(error)
    status = status_pb2.Status(
        code=getattr(code_pb2, code.name), message=bounded(str(error), MAX_MESSAGE_BYTES)
    )
    if isinstance(error, errors.InvalidArgumentError) and error.violations:
        detail = any_pb2.Any()
        detail.Pack(bad_request(error.violations))
        status.details.append(detail)
    if isinstance(error, errors.QuotaExceededError):
        failure = error_details_pb2.QuotaFailure()
        failure.violations.add(
            subject=bounded(f"tenant:{error.tenant}", MAX_FIELD_BYTES),
            description=f"{error.limit} exceeded",
        )
        detail = any_pb2.Any()
        detail.Pack(failure)
        status.details.append(detail)
    if error.retry_delay_s is not None:
        retry = error_details_pb2.RetryInfo()
        retry.retry_delay.FromNanoseconds(round(error.retry_delay_s * 1e9))
        detail = any_pb2.Any()
        detail.Pack(retry)
        status.details.append(detail)
    return rpc_status.to_status(status)


INTERNAL_MESSAGE = "internal error; see the server log"


def client_status(error: Exception) -> tuple[grpc.StatusCode, str, tuple[Any, ...]]:
    """The code, message and trailing metadata a client gets for `error`: its mapped status,
    or for an unexpected error a generic INTERNAL, its stack trace logged here, never sent."""
    if (
        isinstance(error, errors.InferwireError)
        and status_code_for(error) != grpc.StatusCode.INTERNAL
    ):
        status = to_rpc_status(error)
        return status.code, status.details or "", tuple(status.trailing_metadata or ())
    log.exception("unhandled error in RPC", exc_info=error)
    return grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE, ()


async def _abort(context: grpc.aio.ServicerContext, error: Exception) -> None:
    await context.abort(*client_status(error))


F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
MAPS_ERRORS = "__inferwire_maps_errors__"


@contextlib.asynccontextmanager
async def _mapped(context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
    """Abort the RPC with the mapped status of any error raised inside."""
    try:
        yield
    except grpc.aio.AbortError:
        raise
    except Exception as exc:
        await _abort(context, exc)


def map_errors(method: F) -> F:
    """Decorate a servicer method so domain errors abort the RPC with the mapped status."""
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream_wrapper(
            self: Any, request: Any, context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            async with _mapped(context):
                async for response in method(self, request, context):
                    yield response

        setattr(stream_wrapper, MAPS_ERRORS, True)
        return cast(F, stream_wrapper)

    @functools.wraps(method)
    async def unary_wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        # `_mapped` written out: an async context manager costs a unary RPC an async
        # generator and two awaits.
        try:
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc)
            return None  # not reached: the abort raises

    setattr(unary_wrapper, MAPS_ERRORS, True)
    return cast(F, unary_wrapper)


def maps_errors_on_every_rpc(service: ServiceDescriptor) -> Callable[[type[T]], type[T]]:
    """Class decorator: wrap every RPC of `service` in `map_errors`.

    A method the service declares but the class does not define (only the generated
    base's UNIMPLEMENTED stub) is a bug, so it fails at import time, not at call time.
    """

    def decorate(cls: type[T]) -> type[T]:
        for method in service.methods:
            implementation = cls.__dict__.get(method.name)
            if implementation is None:
                raise TypeError(
                    f"{cls.__name__} does not implement {service.full_name}.{method.name}"
                )
            setattr(cls, method.name, map_errors(implementation))
        return cls

    return decorate


def maps_errors(method: Callable[..., Any]) -> bool:
    """Whether a servicer method is wrapped by `map_errors`."""
    return getattr(method, MAPS_ERRORS, False)


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


def _go_name(code: grpc.StatusCode) -> str:
    if code is grpc.StatusCode.CANCELLED:
        return "Canceled"  # Go's spelling (codes.Canceled)
    return (
        "".join(word.capitalize() for word in code.name.split("_")) if code.name != "OK" else "OK"
    )


# Status codes as Go's grpc spells them (`codes.Code.String()`): the `grpc_code` label of the
# grpc-ecosystem metrics, which shared dashboards and alert rules match.
GO_CODE_NAME: dict[grpc.StatusCode, str] = {code: _go_name(code) for code in grpc.StatusCode}

"""The one place where domain errors become gRPC status codes.

Every servicer method goes through `map_errors`; nothing else builds a status.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from inferwire import errors

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
    # Concurrency slots and the wait queue are full.
    errors.QueueFullError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    # The request's deadline passed.
    errors.DeadlineExceededError: grpc.StatusCode.DEADLINE_EXCEEDED,
    # No valid credentials.
    errors.UnauthenticatedError: grpc.StatusCode.UNAUTHENTICATED,
    # Credentials lack the needed scope.
    errors.PermissionDeniedError: grpc.StatusCode.PERMISSION_DENIED,
}


def status_code_for(error: BaseException) -> grpc.StatusCode:
    for kind in type(error).__mro__:
        code = STATUS_CODE_BY_ERROR.get(kind)  # type: ignore[call-overload]
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


def to_rpc_status(error: errors.InferwireError) -> grpc.Status:
    code = status_code_for(error)
    status = status_pb2.Status(code=getattr(code_pb2, code.name), message=str(error))
    if isinstance(error, errors.InvalidArgumentError) and error.violations:
        detail = any_pb2.Any()
        detail.Pack(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field=v.field, description=v.description
                    )
                    for v in error.violations
                ]
            )
        )
        status.details.append(detail)
    return rpc_status.to_status(status)


async def _abort(context: grpc.aio.ServicerContext, error: Exception) -> None:
    if (
        isinstance(error, errors.InferwireError)
        and status_code_for(error) != grpc.StatusCode.INTERNAL
    ):
        status = to_rpc_status(error)
        await context.abort(status.code, status.details, status.trailing_metadata)
    # Unexpected: log the stack trace here, never send it to the client.
    log.exception("unhandled error in RPC", exc_info=error)
    await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the server log")


F = TypeVar("F", bound=Callable[..., Any])


def map_errors(method: F) -> F:
    """Decorate a servicer method so domain errors abort the RPC with the mapped status."""
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream_wrapper(
            self: Any, request: Any, context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            try:
                async for response in method(self, request, context):
                    yield response
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                await _abort(context, exc)

        return stream_wrapper  # type: ignore[return-value]

    @functools.wraps(method)
    async def unary_wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc)

    return unary_wrapper  # type: ignore[return-value]

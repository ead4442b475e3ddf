"""Bearer-token authentication and scopes for gRPC calls, through the edge's `Callers`.

Two checks, in two places, because they need different things:
- **The service-level check** (is there a valid token, does it have the RPC's scope, which
  tenant does a client certificate name) is an interceptor: it needs only the method name,
  the metadata and the connection's certificate, it runs before the servicer, and it
  covers every service the server hosts, including ones added later, with an explicit
  list of open services (health, reflection).
- **The model-level check** (does the token cover this model) needs the request's
  `model`. It runs in the servicer, through `current_principal()`, inside the one error
  mapping.

The interceptor hands the principal to the servicer in a context variable, set by a
wrapper around the RPC's handler: each RPC runs in its own task, so it sees only its own.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import AsyncIterator
from typing import Any

import grpc

from inferwire.api.handlers import (
    Behaviour,
    HandlerCache,
    RebuildingInterceptor,
    rebuild_handler,
    split_method,
)
from inferwire.api.status import to_rpc_status
from inferwire.core.auth import UNRESTRICTED, Principal, Scope
from inferwire.core.errors import InferwireError
from inferwire.edge.callers import Callers
from inferwire.v1 import inference_pb2 as pb
from inferwire.wire.oip import SERVICE_NAME as KSERVE_SERVICE

INFERENCE_SERVICE = pb.DESCRIPTOR.services_by_name["InferenceService"]
# The scope each InferenceService RPC needs; an RPC missing here needs admin (fail closed),
# and a unit test requires every RPC of the service to be listed.
SCOPE_BY_RPC: dict[str, Scope] = {
    "Infer": Scope.INFER,
    "InferStream": Scope.INFER,
    "ListModels": Scope.INFER,
    "Health": Scope.INFER,
    "Tokenize": Scope.INFER,
    "LoadModel": Scope.ADMIN,
    "UnloadModel": Scope.ADMIN,
}

# The same for inference.GRPCInferenceService (KServe v2; api/kserve): live and ready are
# open, like grpc.health.v1; what reads or runs a model needs infer (and the per-model rule,
# in the servicer), the repository admin. Its shared-memory, trace and log RPCs, which are
# not offered, fall to admin too.
KSERVE_OPEN_RPCS = frozenset({"ServerLive", "ServerReady", "ModelReady"})
KSERVE_SCOPE_BY_RPC: dict[str, Scope] = {
    "ServerMetadata": Scope.INFER,
    "ModelMetadata": Scope.INFER,
    "ModelConfig": Scope.INFER,
    "ModelStatistics": Scope.INFER,
    "ModelInfer": Scope.INFER,
    "ModelStreamInfer": Scope.INFER,
    "RepositoryIndex": Scope.ADMIN,
    "RepositoryModelLoad": Scope.ADMIN,
    "RepositoryModelUnload": Scope.ADMIN,
}
_SCOPES_BY_SERVICE = {
    INFERENCE_SERVICE.full_name: SCOPE_BY_RPC,
    KSERVE_SERVICE: KSERVE_SCOPE_BY_RPC,
}

_PRINCIPAL: contextvars.ContextVar[Principal] = contextvars.ContextVar(
    "inferwire_principal", default=UNRESTRICTED
)


def current_principal() -> Principal:
    """The caller of the RPC being served; unrestricted when no tokens file is configured."""
    return _PRINCIPAL.get()


def authorization_of(metadata: tuple[tuple[str, str | bytes], ...] | None) -> str | None:
    """The call's `authorization` metadata value, if it sent one."""
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str):
            return value
    return None


def certificate_subjects(context: Any) -> list[str]:
    """The client certificate's subject CN and URI SANs (mutual TLS), or none."""
    properties = context.auth_context() or {}
    subjects = []
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        for value in properties.get(key, ()):
            subjects.append(value.decode() if isinstance(value, bytes) else str(value))
    return subjects


class AuthInterceptor(RebuildingInterceptor):
    """Runs every call as its principal (edge/callers.py), refusing it before its handler
    runs when its credentials do not allow the method; the open services, and KServe's
    open RPCs, run as anyone."""

    def __init__(self, callers: Callers, open_services: frozenset[str]) -> None:
        self._callers = callers
        self._open_services = open_services
        self._rebuilt = HandlerCache()

    def rebuilt(self, handler: Any, handler_call_details: grpc.HandlerCallDetails) -> Any:
        # The handler is the same for every call of a method; the principal is per call.
        method = handler_call_details.method
        rebuilt = self._rebuilt.get(method, handler)
        if rebuilt is None:
            service, name = split_method(method)
            scope = self._scope_of(service, name)
            rebuilt = self._rebuilt.put(
                method, handler, rebuild_handler(handler, lambda b: self._as_caller(b, scope, name))
            )
        return rebuilt

    def _scope_of(self, service: str, method: str) -> Scope | None:
        """What `service/method` needs; None: it is open."""
        if service in self._open_services:
            return None
        if service == KSERVE_SERVICE and method in KSERVE_OPEN_RPCS:
            return None
        return _SCOPES_BY_SERVICE.get(service, {}).get(method, Scope.ADMIN)

    def _as_caller(self, behaviour: Behaviour, scope: Scope | None, name: str) -> Behaviour:
        callers = self._callers

        async def principal_or_refusal(context: Any) -> None:
            try:
                principal = callers.caller(
                    authorization_of(context.invocation_metadata()),
                    scope,
                    name,
                    lambda: certificate_subjects(context),
                )
            except InferwireError as error:
                # Refused before its handler; the observing interceptor writes its access line.
                status = to_rpc_status(error)
                await context.abort(status.code, status.details, status.trailing_metadata)
            _PRINCIPAL.set(principal)  # each RPC runs in a task of its own

        if inspect.isasyncgenfunction(behaviour):

            async def streamed(request: Any, context: Any) -> AsyncIterator[Any]:
                await principal_or_refusal(context)
                async for response in behaviour(request, context):
                    yield response

            return streamed

        async def called(request: Any, context: Any) -> Any:
            await principal_or_refusal(context)
            return await behaviour(request, context)

        return called


def auth_interceptors(
    callers: Callers, open_services: frozenset[str]
) -> list[grpc.aio.ServerInterceptor]:
    """The interceptor `callers` needs: none without a tokens file and without certificate
    tenants (every call open)."""
    if not callers.checks_anything:
        return []
    return [AuthInterceptor(callers, open_services)]

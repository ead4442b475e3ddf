"""Bearer-token authentication and scopes for gRPC calls.

Two checks, in two places, because they need different things:
- **The service-level check** (is there a valid token, does it have the RPC's scope) is
  an interceptor: it needs only the method name and the metadata, it runs before the
  request is even deserialised, and it covers every service the server hosts, including
  ones added later, with an explicit list of open services (health, reflection).
- **The model-level check** (does the token cover this model) needs the request's
  `model`, which an interceptor would have to deserialise itself. It runs in the
  servicer, through `current_principal()`, inside the one error mapping.

The interceptor hands the principal to the servicer in a context variable, set by a
wrapper around the RPC's handler: each RPC runs in its own task, so it sees only its own.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import grpc

from inferwire.api.handlers import Behaviour, Call, calls_within, rebuild_handler, split_method
from inferwire.api.status import to_rpc_status
from inferwire.config import AuthSettings
from inferwire.core.auth import (
    ANONYMOUS,
    UNRESTRICTED,
    Principal,
    Scope,
    TokenStore,
    anonymous_principal,
    authorize,
    identify,
)
from inferwire.core.errors import InferwireError
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


def bearer_token(metadata: tuple[tuple[str, str | bytes], ...] | None) -> str | None:
    """The token of an `authorization: Bearer <token>` header, or None when there is none."""
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str):
            scheme, _, token = value.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def _refusing(error: InferwireError) -> Callable[[Behaviour], Behaviour]:
    status = to_rpc_status(error)  # the mapped code and a bounded message

    def wrap(_: Behaviour) -> Behaviour:
        async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
            await context.abort(status.code, status.details, status.trailing_metadata)

        return refuse

    return wrap


def _as(principal: Principal) -> Callable[[Behaviour], Behaviour]:
    @contextlib.contextmanager
    def scope(request: Any, context: Any) -> Iterator[Call]:
        _PRINCIPAL.set(principal)  # each RPC runs in a task of its own
        yield request, context

    return lambda behaviour: calls_within(behaviour, scope)


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Requires a bearer token with the RPC's scope on every service but the open ones."""

    def __init__(self, store: TokenStore, settings: AuthSettings) -> None:
        self._store = store
        self._anonymous = anonymous_principal(Scope(s) for s in settings.anonymous_scopes)
        self._open_services = frozenset(settings.open_services)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        service, method = split_method(handler_call_details.method)
        if handler is None or service in self._open_services:
            return handler
        if service == KSERVE_SERVICE and method in KSERVE_OPEN_RPCS:
            return handler
        scope = _SCOPES_BY_SERVICE.get(service, {}).get(method, Scope.ADMIN)
        try:
            token = bearer_token(handler_call_details.invocation_metadata)
            principal = identify(self._store, self._anonymous, token)
            principal = authorize(principal, scope, method)
        except InferwireError as error:
            # The observing interceptor writes the refused call's access line.
            return rebuild_handler(handler, _refusing(error))
        return rebuild_handler(handler, _as(principal))


Details = grpc.HandlerCallDetails
Continuation = Callable[[Details], Awaitable[Any]]


def certificate_subjects(context: Any) -> list[str]:
    """The client certificate's subject CN and URI SANs (mutual TLS), or none."""
    properties = context.auth_context() or {}
    subjects = []
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        for value in properties.get(key, ()):
            subjects.append(value.decode() if isinstance(value, bytes) else str(value))
    return subjects


class CertificateTenantInterceptor(grpc.aio.ServerInterceptor):
    """Maps a mutual-TLS client's certificate subject to its tenant.

    Runs inside the token check: a call that sent a token keeps the token's tenant; one
    without (anonymous) becomes the certificate's subject, counted against its tenant.
    """

    def __init__(self, tenant_by_subject: dict[str, str]) -> None:
        self._tenant_by_subject = dict(tenant_by_subject)

    async def intercept_service(self, continuation: Continuation, details: Details) -> Any:
        handler = await continuation(details)
        wrap: Callable[[Behaviour], Behaviour] = lambda b: calls_within(b, self._scope)  # noqa: E731
        return None if handler is None else rebuild_handler(handler, wrap)

    @contextlib.contextmanager
    def _scope(self, request: Any, context: Any) -> Iterator[Call]:
        principal = current_principal()
        if principal.name == ANONYMOUS:
            for subject in certificate_subjects(context):
                if (tenant := self._tenant_by_subject.get(subject)) is not None:
                    _PRINCIPAL.set(dataclasses.replace(principal, name=subject, tenant_name=tenant))
                    break
        yield request, context


def auth_interceptors(
    settings: AuthSettings, tenants: frozenset[str] | set[str] | None = None
) -> list[grpc.aio.ServerInterceptor]:
    """The interceptors `settings` asks for: none without a tokens file (everything open)
    and without certificate tenants. `tenants`: the names tokens may give as their tenant.

    Raises ConfigurationError when the tokens file is missing or invalid.
    """
    interceptors: list[grpc.aio.ServerInterceptor] = []
    if settings.tokens_file is not None:
        store = TokenStore(
            settings.tokens_file, tenants=None if tenants is None else frozenset(tenants)
        )
        interceptors.append(TokenAuthInterceptor(store, settings))
    if settings.certificate_tenants:
        interceptors.append(CertificateTenantInterceptor(settings.certificate_tenants))
    return interceptors

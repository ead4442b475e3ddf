"""Who is calling: the principal of a call, from what any door reads off it.

The call (edge/calls.py) hands over its `Authorization` header (gRPC metadata or HTTP)
and, where its method takes one (edge/methods.py `key_header`: Anthropic's `x-api-key`),
the header that carries the bare token instead; the scope its method needs (None for an
open one: health, reflection, metrics); and, only if asked, its client certificate's
subjects (mutual TLS). `Authenticator` answers with the
principal, or raises UnauthenticatedError / PermissionDeniedError; the per-model check
is the principal's own (`Principal.require_model`), made by the call from the field its
method's facts say names the model (`Call.check_model`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

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


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `authorization: Bearer <token>` value, or None when there is none."""
    if authorization is None:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


def _bare_token(value: str | None) -> str | None:
    """The token of a header that carries one as it is (`x-api-key: <token>`)."""
    token = value.strip() if value is not None else ""
    return token or None


class Authenticator:
    """The server's credentials: its tokens file (re-read when it changes), the scopes of
    anonymous callers, and which certificate subject counts against which tenant."""

    def __init__(self, settings: AuthSettings, tenants: frozenset[str] | None = None) -> None:
        """`tenants`: the names tokens may give as their tenant (None: any).

        Raises ConfigurationError when the tokens file is missing or invalid."""
        self._store = (
            TokenStore(settings.tokens_file, tenants=tenants)
            if settings.tokens_file is not None
            else None
        )
        self._anonymous = anonymous_principal(Scope(s) for s in settings.anonymous_scopes)
        self._tenant_by_subject = dict(settings.certificate_tenants)
        self._gateway_subjects = frozenset(settings.gateway_subjects)

    @property
    def checks_anything(self) -> bool:
        """False without a tokens file, certificate tenants and gateway subjects: every call
        is unrestricted."""
        return (
            self._store is not None or bool(self._tenant_by_subject) or bool(self._gateway_subjects)
        )

    def principal(
        self,
        authorization: str | None,
        scope: Scope | None,
        what: str,
        subjects: Callable[[], Iterable[str]] = tuple,
        api_key: str | None = None,
    ) -> Principal:
        """The principal a call of `what` runs as. `scope`: what it needs (None: open to
        anyone); `subjects`: the client certificate's subjects, read only when they can
        name the caller's tenant (an anonymous caller with certificate tenants set);
        `api_key`: the bare token of a header that carries one (`x-api-key`), taken when
        `authorization` has no bearer token."""
        if self._store is None or scope is None:
            principal = UNRESTRICTED
        else:
            token = bearer_token(authorization) or _bare_token(api_key)
            principal = authorize(identify(self._store, self._anonymous, token), scope, what)
        if principal.name == ANONYMOUS and self._tenant_by_subject:
            # A call that sent a token keeps the token's tenant; one without counts against
            # its certificate's tenant, the subject becoming its principal.
            for subject in subjects():
                if (tenant := self._tenant_by_subject.get(subject)) is not None:
                    principal = dataclasses.replace(principal, name=subject, tenant_name=tenant)
                    break
        if self._gateway_subjects and not self._gateway_subjects.isdisjoint(subjects()):
            # The connection's certificate is the inference gateway's: it speaks for others.
            principal = dataclasses.replace(principal, scopes=principal.scopes | {Scope.GATEWAY})
        return principal

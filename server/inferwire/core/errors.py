"""Domain errors raised by the core and the backends.

These carry no transport detail. The servicer maps each kind to a gRPC status
code in exactly one place (`inferwire.api.status`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


class InferwireError(Exception):
    """Base class for every error inferwire reports to a caller."""

    retry_delay_s: float | None = None  # set: the caller may retry after this long (RetryInfo)


@dataclass(frozen=True)
class FieldViolation:
    """One invalid request field: its path (e.g. `parameters.top_p`) and why."""

    field: str
    description: str


class InvalidArgumentError(InferwireError):
    """One or more request fields are invalid."""

    def __init__(self, violations: list[FieldViolation]) -> None:
        self.violations = violations
        super().__init__("; ".join(f"{v.field}: {v.description}" for v in violations))

    def renamed(self, field_of: Callable[[str], str]) -> InvalidArgumentError:
        """The same violations, each field named as the caller sent it (`field_of`: the
        core's name -> the caller's, for a door whose fields differ from the core's). An
        error that names no field (a backend's refusal) is itself: its message says why."""
        if not self.violations:
            return self
        return InvalidArgumentError(
            [FieldViolation(field_of(v.field), v.description) for v in self.violations]
        )


class BackendInvalidArgumentError(InvalidArgumentError):
    """The backend refused the request as invalid; its message says why, no field is known."""

    def __init__(self, message: str) -> None:
        self.violations = []
        InferwireError.__init__(self, message)


class ModelNotFoundError(InferwireError):
    """The named model is not configured (or not present on its backend)."""

    def __init__(self, model: str, detail: str = "") -> None:
        self.model = model
        super().__init__(detail or f"model {model!r} is not configured")


class ModelNotReadyError(InferwireError):
    """The model is known but not READY: inference is refused (fail-closed)."""


class BackendUnavailableError(InferwireError):
    """The backend cannot be reached or reports itself unhealthy."""


class StoreUnavailableError(InferwireError):
    """A store the server keeps state in (the Responses API's responses) cannot be read or
    written: its database is unreachable or refuses; the message names the store."""


class BackendCancelledError(InferwireError):
    """The backend cancelled the request by itself (our client did not)."""


class QueueFullError(InferwireError):
    """The model's concurrency slots and its wait queue are all taken."""


class MemoryExhaustedError(InferwireError):
    """A model does not fit its device's memory budget, and no idle model can make room."""

    def __init__(self, message: str, retry_delay_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_delay_s = retry_delay_s


class QuotaExceededError(InferwireError):
    """A tenant is over one of its quotas; details carry QuotaFailure and RetryInfo."""

    def __init__(self, tenant: str, limit: str, message: str, retry_delay_s: float | None):
        super().__init__(f"{message}; retry later")
        self.tenant = tenant
        self.limit = limit
        self.retry_delay_s = retry_delay_s


class DeadlineExceededError(InferwireError):
    """The request's deadline passed before it finished."""


class UnauthenticatedError(InferwireError):
    """The call carries no valid credentials."""


class PermissionDeniedError(InferwireError):
    """The credentials lack the scope the RPC needs."""


class AlreadyExistsError(InferwireError):
    """A model of that name already exists with another definition (an adapter
    registered again from another source)."""


class NotSupportedError(InferwireError):
    """The server does not offer what the call asks for: an RPC, or a feature of one."""


class ConfigurationError(InferwireError):
    """The server's configuration is invalid; raised at start-up."""


class MissingDependencyError(ConfigurationError):
    """A backend's optional SDK is not installed."""

    def __init__(self, backend: str, module: str, extra: str) -> None:
        super().__init__(
            f"backend {backend!r} needs the Python module {module!r}, which is not "
            f"installed; install it with: pip install 'inferwire[{extra}]'"
        )

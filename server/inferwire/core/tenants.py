"""Tenants: who shares the server, at which priority, with which weight and quotas.

A tenant is named in the configuration (`server.tenants`); a token names its tenant in
the tokens file, a client certificate through `server.auth.certificate_tenants`. A
caller whose credentials name no configured tenant is a tenant named like them, with
`server.default_tenant`'s settings. `Tenants` resolves names to `Tenant`s, each with its
quota buckets (core/quotas.py); the scheduler (core/scheduling.py) orders their requests.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from inferwire.core.errors import ConfigurationError, PermissionDeniedError, QuotaExceededError
from inferwire.core.quotas import TenantQuota, TokenCharge
from inferwire.core.record import RequestRecord
from inferwire.core.requests import Priority
from inferwire.core.scheduling import Claim

UNCONFIGURED_LABEL = "unconfigured"
MAX_UNCONFIGURED_TENANTS = 1024  # the metrics label of a tenant not in server.tenants
# The tenant of a request that names none (no tokens file: every caller is anonymous).
ANONYMOUS_TENANT = "anonymous"
# A tenant's priority is one of Priority's labels: ^(interactive|standard|batch)$.
_PRIORITY_NAMES = f"^({'|'.join(p.label for p in Priority)})$"


class TenantRequest(Protocol):
    """What tenancy reads of any request (a generation, an embedding, a rerank)."""

    @property
    def tenant(self) -> str: ...  # whose request it is; "": anonymous

    @property
    def priority(self) -> Priority | None: ...  # the priority it asks for

    @property
    def priority_hint(self) -> Priority | None: ...  # what the gateway asks on its behalf


class TenantSettings(BaseModel):
    """A tenant's share and limits; unset limits do not apply."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    priority: str = Field(default="standard", pattern=_PRIORITY_NAMES)
    """interactive > standard > batch: a waiting request of a higher class goes first."""
    weight: int = Field(default=1, ge=1, le=1000)
    """Share of a model's slots against other tenants of the same priority."""
    max_concurrency: int | None = Field(default=None, ge=1)
    """Requests in flight or queued, over all models."""
    requests_per_minute: float | None = Field(default=None, gt=0)
    """Request rate; bursts up to one minute's worth."""
    generated_tokens_per_minute: float | None = Field(default=None, gt=0)
    """Generated-token rate, charged as tokens are produced; a request that runs over
    finishes, and the debt delays the tenant's next admission."""

    @property
    def level(self) -> Priority:
        return Priority[self.priority.upper()]


class TenantConfig(TenantSettings):
    """One entry of `server.tenants`."""

    name: str = Field(min_length=1, max_length=64)
    """The tenant's name: tokens name it, and it is the `tenant` label of its metrics."""


class SchedulingSettings(BaseModel):
    """The `server.scheduling:` block."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    max_wait_s: float = Field(default=60.0, gt=0)
    """A batch request waiting this long ages up one class (to standard)."""


class Tenant:
    """One tenant at run time: its settings and its quota."""

    def __init__(
        self, name: str, settings: TenantSettings, configured: bool, clock: Callable[[], float]
    ) -> None:
        self.name = name
        self.settings = settings
        self.configured = configured
        self.quota = TenantQuota(
            name,
            settings.max_concurrency,
            settings.requests_per_minute,
            settings.generated_tokens_per_minute,
            clock,
        )

    @property
    def label(self) -> str:
        """Its metrics label: only configured names become labels."""
        return self.name if self.configured else UNCONFIGURED_LABEL

    def priority_for(self, asked: Priority | None, hint: Priority | None = None) -> Priority:
        """The priority a request runs at: the tenant's, or a lower one it asked for; a
        gateway's `hint` (its objective) is taken up to the tenant's own, never above."""
        own = self.settings.level
        if asked is None:
            return own if hint is None else max(hint, own)
        if asked < own:
            raise PermissionDeniedError(
                f"priority: {asked.label} is above tenant {self.name!r}'s priority "
                f"{own.label}; a request may lower its priority, never raise it"
            )
        return asked


def duplicate_tenant(configured: Iterable[TenantConfig]) -> str | None:
    """Why `configured` cannot be the tenants (a name given twice), or None."""
    names = [t.name for t in configured]
    if duplicated := sorted({n for n in names if names.count(n) > 1}):
        return f"{duplicated[0]!r} appears twice"
    return None


class Tenants:
    """The configured tenants, and those made on first use from `default`."""

    def __init__(
        self,
        configured: Sequence[TenantConfig] = (),
        default: TenantSettings | None = None,
        scheduling: SchedulingSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if (problem := duplicate_tenant(configured)) is not None:
            raise ConfigurationError(f"server.tenants: {problem}")
        self.clock = clock
        self.default = default or TenantSettings()
        self.scheduling = scheduling or SchedulingSettings()
        self._tenants = {
            t.name: Tenant(t.name, TenantSettings(**t.model_dump(exclude={"name"})), True, clock)
            for t in configured
        }
        self._unconfigured = 0  # tenants made up on first use
        # Whether a configured tenant (or the default one) is interactive: models then
        # reserve an interactive slot unless they say otherwise (core/reserve.py).
        self.interactive_configured = any(
            t.level is Priority.INTERACTIVE for t in (*configured, self.default)
        )

    def of(self, request: TenantRequest) -> Tenant:
        """The tenant a request counts against (anonymous when it names none)."""
        return self.get(request.tenant or ANONYMOUS_TENANT)

    def get(self, name: str) -> Tenant:
        """The tenant called `name`; an unconfigured one gets the default settings. Past
        MAX_UNCONFIGURED_TENANTS names made up on first use (a gateway's fairness ids are
        its callers' choice), further ones share one tenant, so memory stays bounded."""
        tenant = self._tenants.get(name)
        if tenant is not None:
            return tenant
        if self._unconfigured < MAX_UNCONFIGURED_TENANTS:
            self._unconfigured += 1
        else:
            name = UNCONFIGURED_LABEL
            if (shared := self._tenants.get(name)) is not None:
                return shared
        tenant = self._tenants[name] = Tenant(name, self.default, False, self.clock)
        return tenant


@dataclass(frozen=True)
class Admission:
    """A request let in by its tenant's quota: its claim on a slot, its token charge."""

    claim: Claim
    charge: TokenCharge


@contextlib.contextmanager
def admitted(
    tenants: Tenants, request: TenantRequest, record: RequestRecord
) -> Iterator[Admission]:
    """Hold the request's place in its tenant's quota while it queues and runs.

    Raises PermissionDeniedError for a priority above the tenant's and QuotaExceededError
    (before the request queues) for a quota it is over; its tokens are charged at the end
    at the latest.
    """
    tenant = tenants.get(record.tenant)  # the one `_arrived` found for the request
    priority = tenant.priority_for(request.priority, request.priority_hint)
    record.priority = priority.label
    try:
        tenant.quota.admit()
    except QuotaExceededError as error:
        record.throttled = error.limit
        raise
    charge = TokenCharge(tenant.quota)
    try:
        yield Admission(Claim(tenant.name, tenant.settings.weight, priority), charge)
    finally:
        tenant.quota.release()
        charge.up_to(record.completion_tokens)

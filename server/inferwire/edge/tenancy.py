"""Which tenant a call runs as, and the priority its gateway asks for, on every door.

The Kubernetes inference gateway (Gateway API Inference Extension; llm-d's endpoint picker)
sends two headers, read alike from HTTP headers and gRPC metadata:
`x-gateway-inference-fairness-id` names the tenant a request is shared fairly as, and
`x-gateway-inference-objective` an objective that maps to a priority
(`server.gateway.objectives`; never above the tenant's own). `Tenancy` honours them only
from a principal allowed to speak for others (the `gateway` scope: a token entry that
lists it, or an mTLS subject in `server.auth.gateway_subjects`); from anyone else they are
ignored, logged once per principal, so no client picks its own tenant.
"""

from __future__ import annotations

import logging

from inferwire.config import GatewaySettings
from inferwire.core.auth import Principal, Scope
from inferwire.core.requests import Priority

log = logging.getLogger(__name__)

FAIRNESS_HEADER = "x-gateway-inference-fairness-id"
OBJECTIVE_HEADER = "x-gateway-inference-objective"
_MAX_FAIRNESS_ID_CHARS = 64  # as a tenant's name may be (core/tenants.py)
_LOGGED_LIMIT = 1000  # principals and objectives already logged, at most


class Tenancy:
    """The tenant and priority hint a call runs as: its principal's tenant, or what the
    inference gateway's headers say when the principal may speak for others."""

    def __init__(self, settings: GatewaySettings) -> None:
        self._objectives = {
            name: Priority[level.upper()] for name, level in settings.objectives.items()
        }
        self._logged: set[str] = set()

    def resolve(
        self, principal: Principal, fairness_id: str | None, objective: str | None
    ) -> tuple[str, Priority | None]:
        """(tenant, priority hint) for a request of `principal` that sent these headers."""
        if fairness_id is None and objective is None:
            return principal.tenant, None
        if not principal.has_scope(Scope.GATEWAY):
            self._once(
                f"principal:{principal.name}",
                "gateway headers ignored: the caller has no gateway scope",
                principal=principal.name,
            )
            return principal.tenant, None
        tenant = principal.tenant
        if fairness_id:
            tenant = fairness_id.strip()[:_MAX_FAIRNESS_ID_CHARS] or tenant
        hint = None
        if objective:
            hint = self._objectives.get(objective)
            if hint is None:
                self._once(
                    f"objective:{objective[:64]}",
                    "unknown gateway objective ignored (server.gateway.objectives)",
                    objective=objective[:64],
                )
        return tenant, hint

    def _once(self, key: str, message: str, **fields: str) -> None:
        if key not in self._logged and len(self._logged) < _LOGGED_LIMIT:
            self._logged.add(key)
            log.warning(message, extra=fields)

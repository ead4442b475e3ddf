"""What the Kubernetes inference gateway reads and sends (Gateway API Inference Extension,
llm-d's endpoint picker), for any door.

**Gauges.** The endpoint picker scrapes each pod's /metrics and, for a pod labelled
`llm-d.ai/engine-type: vllm`, reads vLLM's gauges, taking ONE series per family (the one
with the latest timestamp, else the first). So `ModelServerMetrics` exports each family
once, for the whole server (core/server_load.py), computed at every scrape, so it moves
with the change it reports; the per-model detail stays in the `inferwire_*` families:
- `vllm:num_requests_waiting`, `vllm:num_requests_running`;
- `vllm:kv_cache_usage_perc` (a fraction, 0 to 1);
- `vllm:lora_requests_info` (value: the Unix time its labels last changed; labels
  `max_lora`, `running_lora_adapters`, `waiting_lora_adapters`, comma-separated names).

**Headers.** `x-gateway-inference-fairness-id` names the tenant a request is shared
fairly as, and `x-gateway-inference-objective` an objective that maps to a priority
(`server.gateway.objectives`; never above the tenant's own). `GatewayHeaders` honours
them only from a principal allowed to speak for others (the `gateway` scope: a token
entry that lists it, or an mTLS subject in `server.auth.gateway_subjects`); from anyone
else they are ignored, logged once per principal, so no client picks its own tenant.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from inferwire.config import GatewaySettings
from inferwire.core.auth import Principal, Scope
from inferwire.core.server_load import ServerLoad
from inferwire.core.types import Priority

log = logging.getLogger(__name__)

FAIRNESS_HEADER = "x-gateway-inference-fairness-id"
OBJECTIVE_HEADER = "x-gateway-inference-objective"
_MAX_FAIRNESS_ID_CHARS = 64  # as a tenant's name may be (core/tenants.py)
_LOGGED_LIMIT = 1000  # principals and objectives already logged, at most


class GatewayHeaders:
    """The tenant and priority a request runs as, given the gateway's headers."""

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


class ModelServerMetrics(Collector):
    """vLLM's gauges, one series each, for the whole server, read at every scrape."""

    def __init__(self, load: Callable[[], ServerLoad]) -> None:
        self._load = load
        self._lora: tuple[tuple[str, str, str], float] | None = None  # labels, changed at

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # registering reads nothing; every scrape reads the load

    def collect(self) -> Iterator[GaugeMetricFamily]:
        load = self._load()
        yield _gauge(
            "vllm:num_requests_waiting", "Requests waiting to start, all models.", load.waiting
        )
        yield _gauge("vllm:num_requests_running", "Requests generating, all models.", load.running)
        yield _gauge(
            "vllm:kv_cache_usage_perc",
            "Fraction (0-1) of the KV cache held by running requests (the fullest pool).",
            load.kv_cache_usage,
        )
        labels = (
            str(load.max_adapters),
            ",".join(load.adapters_running),
            ",".join(load.adapters_waiting),
        )
        if self._lora is None or self._lora[0] != labels:
            self._lora = (labels, time.time())
        family = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Adapters running (resident or in flight) and waiting; value: when this last changed.",
            labels=("max_lora", "running_lora_adapters", "waiting_lora_adapters"),
        )
        family.add_metric(list(labels), self._lora[1])
        yield family


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)

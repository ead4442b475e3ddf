"""The house's metrics: one server's series of its models, tenants and memory.

`ServerMetrics` holds them in the server's own registry (several servers in one process do
not clash), which each door adds its per-call series to (api/metrics.py, http/metrics.py)
and which /metrics serves (`metrics.endpoint`). It is the core's MetricsListener and
MemoryMetrics: the core hands it each ended request's record (through the edge's
`RecordsToCalls`, which also joins the record to its call's access line), its queues'
and slots' changes, readiness and what residency does. Every label set known up front
(each configured model's series, each configured tenant's) is created at zero, so
`rate()` sees the first requests after start-up.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from inferwire.core.quotas import LIMITS
from inferwire.core.record import Outcome, RequestRecord
from inferwire.core.requests import Priority
from inferwire.core.tenants import UNCONFIGURED_LABEL

FIRST_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
PER_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
LOAD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
LOAD_TRIGGERS = ("startup", "explicit", "on_demand")
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
QUEUE_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServerMetrics:
    """One server's metrics of models, tenants and memory (names and labels: docs/metrics.md),
    and the registry every door adds its own series to."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()

        def per_model(name: str, doc: str) -> Counter:
            return Counter(name, doc, ("model",), registry=r)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, ("model",), registry=r)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, ("model",), registry=r, buckets=buckets)

        self.requests = Counter(
            "inferwire_requests_total",
            "Inference requests for configured models, by outcome.",
            ("model", "outcome"),
            registry=r,
        )
        self.prompt_tokens = per_model("inferwire_prompt_tokens_total", "Prompt tokens.")
        self.generated_tokens = per_model("inferwire_generated_tokens_total", "Tokens generated.")
        self.tool_calls = per_model("inferwire_tool_calls_total", "Tool calls in answers.")
        self.first_token = histogram(
            "inferwire_time_to_first_token_seconds",
            "Time from a request's arrival (queue included) to its first token.",
            FIRST_TOKEN_BUCKETS,
        )
        self.per_token = histogram(
            "inferwire_time_per_output_token_seconds",
            "Mean time per output token after the first, per request.",
            PER_TOKEN_BUCKETS,
        )
        self.embedding_inputs = per_model(
            "inferwire_embedding_inputs_total", "Inputs of embedding and rerank requests."
        )
        self.batch_inputs = histogram(
            "inferwire_embedding_batch_inputs",
            "Per embedding or rerank request: the most inputs (its own and other requests')"
            " its inputs ran in one engine batch with.",
            BATCH_BUCKETS,
        )
        self.queue_depth = gauge("inferwire_queue_depth", "Requests waiting for a slot.")
        self.inflight = gauge("inferwire_inflight_requests", "Requests running on the backend.")
        self.ready = gauge("inferwire_model_ready", "1 when the model serves, else 0.")
        self.loads = Counter(
            "inferwire_model_loads_total",
            "Model loads that succeeded, by what triggered them.",
            ("model", "trigger"),
            registry=r,
        )
        self.evictions = per_model(
            "inferwire_model_evictions_total", "Times the model was evicted to make room."
        )
        self.load_seconds = histogram(
            "inferwire_model_load_seconds", "How long a model's load took.", LOAD_BUCKETS
        )
        self.resident_bytes = gauge(
            "inferwire_model_resident_bytes",
            "Bytes the model holds against its device's budget while loaded (else 0).",
        )
        self.budget_bytes = Gauge(
            "inferwire_memory_budget_bytes",
            "The device's memory budget (server.memory.budgets).",
            ("device",),
            registry=r,
        )
        self.used_bytes = Gauge(
            "inferwire_memory_used_bytes",
            "The sum of the footprints of the models resident on the device.",
            ("device",),
            registry=r,
        )
        # Tenants: only configured names become labels (the others: `unconfigured`).
        tenant_series = (
            ("requests", "Inference requests, by outcome.", ("outcome",)),
            ("generated_tokens", "Tokens generated for the tenant.", ()),
            ("throttled", "Requests a quota of the tenant refused, by the limit.", ("limit",)),
        )
        self.tenant_requests, self.tenant_generated_tokens, self.tenant_throttled = (
            Counter(f"inferwire_tenant_{name}_total", doc, ("tenant", *labels), registry=r)
            for name, doc, labels in tenant_series
        )
        self.queue_wait = Histogram(
            "inferwire_queue_wait_seconds",
            "Time an admitted request waited for a slot, by the class it queued in.",
            ("model", "priority"),
            registry=r,
            buckets=QUEUE_WAIT_BUCKETS,
        )
        self._children: dict[tuple[MetricWrapperBase, tuple[str, ...]], Any] = {}

    def child(self, metric: MetricWrapperBase, *labels: str) -> Any:
        """`metric.labels(*labels)`, kept: prometheus_client checks the labels and takes a
        lock on every call, a few times per request. The label sets are bounded (configured
        models, the served methods, status codes), so the dict is too."""
        key = (metric, labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    # ---- series created at zero -----------------------------------------

    def model_added(self, model: str) -> None:
        """Every series of a configured model, at zero, before its first request."""
        for outcome in Outcome:
            self.child(self.requests, model, outcome.value)
        per_model: tuple[MetricWrapperBase, ...] = (
            self.prompt_tokens,
            self.generated_tokens,
            self.tool_calls,
            self.embedding_inputs,
            self.batch_inputs,
            self.first_token,
            self.per_token,
            self.queue_depth,
            self.inflight,
            self.ready,
            self.evictions,
            self.load_seconds,
            self.resident_bytes,
        )
        for metric in per_model:
            self.child(metric, model)
        for trigger in LOAD_TRIGGERS:
            self.child(self.loads, model, trigger)
        for priority in Priority:
            self.child(self.queue_wait, model, priority.label)

    def tenants_configured(self, tenants: Iterable[str]) -> None:
        """Every series of each configured tenant (and of the unconfigured ones), at zero."""
        for tenant in (*tenants, UNCONFIGURED_LABEL):
            for outcome in Outcome:
                self.child(self.tenant_requests, tenant, outcome.value)
            self.child(self.tenant_generated_tokens, tenant)
            for limit in LIMITS:
                self.child(self.tenant_throttled, tenant, limit)

    # ---- what happened --------------------------------------------------

    def request_finished(self, record: RequestRecord) -> None:
        if tenant := record.tenant_label:  # set once the request reached its tenant
            self.child(self.tenant_requests, tenant, record.outcome.value).inc()
            self.child(self.tenant_generated_tokens, tenant).inc(record.completion_tokens)
            if record.throttled:
                self.child(self.tenant_throttled, tenant, record.throttled).inc()
        if not record.configured:  # a made-up model name never becomes a label
            return
        child, model = self.child, record.model
        if record.admitted is not None and record.priority:
            child(self.queue_wait, model, record.priority).observe(record.queue_s)
        child(self.requests, model, record.outcome.value).inc()
        child(self.prompt_tokens, model).inc(record.prompt_tokens)
        child(self.generated_tokens, model).inc(record.completion_tokens)
        if record.tool_calls:
            child(self.tool_calls, model).inc(record.tool_calls)
        if record.inputs:
            child(self.embedding_inputs, model).inc(record.inputs)
        if record.batch_inputs:
            child(self.batch_inputs, model).observe(record.batch_inputs)
        if (first_token_s := record.time_to_first_token_s) is not None:
            child(self.first_token, model).observe(first_token_s)
        if (per_token_s := record.time_per_output_token_s) is not None:
            child(self.per_token, model).observe(per_token_s)

    def load_changed(self, model: str, queued: int, running: int) -> None:
        self.child(self.queue_depth, model).set(queued)
        self.child(self.inflight, model).set(running)

    def readiness_changed(self, model: str, ready: bool) -> None:
        self.child(self.ready, model).set(int(ready))

    # ---- residency (the core's MemoryMetrics) ---------------------------

    def model_loaded(self, model: str, trigger: str, seconds: float) -> None:
        self.child(self.loads, model, trigger).inc()
        self.child(self.load_seconds, model).observe(seconds)

    def model_evicted(self, model: str) -> None:
        self.child(self.evictions, model).inc()

    def memory_changed(self, device: str, budget: int | None, used: int) -> None:
        if budget is not None:
            self.child(self.budget_bytes, device).set(budget)
        self.child(self.used_bytes, device).set(used)

    def resident_changed(self, model: str, resident_bytes: int) -> None:
        self.child(self.resident_bytes, model).set(resident_bytes)

"""What every request that runs on a model passes, whatever it asks of the model: a
generation (core/request_path.py), an embedding or a rerank (core/retrieval_path.py).

Its record is made on arrival; then it is validated, its tenant's quotas admit it, its model
is loaded if needed and must be READY and able to serve it, and it waits for one of the
model's slots. Whatever happens, its record ends once, the model's failure breaker hears
how it went, and the listeners (metrics, the access line, the span) get the record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from inferwire.core.errors import DeadlineExceededError
from inferwire.core.facts import ModelFacts
from inferwire.core.lifecycle import Lifecycle
from inferwire.core.metrics import MetricsListener
from inferwire.core.models import ManagedModel, find_model
from inferwire.core.record import Outcome, RequestRecord
from inferwire.core.scheduling import Grant
from inferwire.core.tenants import Admission, TenantRequest, Tenants, admitted
from inferwire.core.tracing import Tracer

log = logging.getLogger("inferwire.core.manager")  # readiness changes: the manager's log

Prepared = TypeVar("Prepared")


class ModelRequest(TenantRequest, Protocol):
    """What the gate reads of a request besides its tenancy."""

    @property
    def model(self) -> str: ...

    @property
    def request_id(self) -> str: ...

    @property
    def deadline(self) -> float | None: ...


@dataclass(frozen=True)
class Admitted(Generic[Prepared]):
    """A request holding a slot of its model."""

    model: ManagedModel
    prepared: Prepared  # what `ready` made of the request for the model
    admission: Admission
    grant: Grant


@dataclass(frozen=True)
class RequestGate:
    """The parts the gate runs on (the model manager's)."""

    models: Mapping[str, ManagedModel]
    tenants: Tenants
    lifecycle: Lifecycle
    publish_health: Callable[[], Awaitable[None]]  # readiness changed (core/readiness.py)
    metrics: MetricsListener
    tracer: Tracer

    def arrived(self, request: ModelRequest, **fields: Any) -> RequestRecord:
        """The request's record (`fields`: what else the record keeps of it)."""
        tenant = self.tenants.of(request)  # counted for it even if refused before its quota
        return RequestRecord(
            tenant=tenant.name,
            tenant_label=tenant.label,
            request_id=request.request_id or uuid.uuid4().hex,
            model=request.model,
            deadline=request.deadline,
            configured=request.model in self.models,
            tracer=self.tracer,
            **fields,
        )

    @contextlib.asynccontextmanager
    async def admitted(
        self,
        request: ModelRequest,
        record: RequestRecord,
        validate: Callable[[], None],
        ready: Callable[[ManagedModel, ModelFacts], Prepared],
    ) -> AsyncIterator[Admitted[Prepared]]:
        """Validate, admit, load, check READY and what `ready` checks (it raises
        InvalidArgumentError for a model that cannot serve the request, before a slot is
        taken), and hold a slot while the caller runs the request; end the record once."""
        model: ManagedModel | None = None
        try:
            validate()
            model = find_model(self.models, record.model)
            with admitted(self.tenants, request, record) as admission:
                model.used(time.monotonic(), time.time())
                record.load_s = await self.lifecycle.ensure_loaded(model, record.deadline)
                prepared = ready(model, model.require_ready())
                async with model.slot(self.tracer, admission.claim) as grant:
                    record.admitted = time.perf_counter()
                    model.request_started(record)
                    yield Admitted(model, prepared, admission, grant)
        except (GeneratorExit, asyncio.CancelledError):
            # The caller went away (cancel or deadline) or stopped reading.
            record.end(Outcome.CANCELLED)
            raise
        except DeadlineExceededError:
            record.end(Outcome.DEADLINE_EXCEEDED if record.admitted else Outcome.REJECTED)
            raise
        except Exception as error:
            record.end(Outcome.ERROR if record.admitted else Outcome.REJECTED)
            if record.admitted and model is not None and model.request_failed(error):
                log.warning(
                    "model not ready: its requests fail",
                    extra={"model": model.name, "error": str(error)},
                )
                await self.publish_health()
            raise
        else:
            if model is not None and model.request_succeeded():
                await self.publish_health()
        finally:
            record.end(Outcome.ERROR)  # ended without an answer
            if model is not None:
                model.request_ended(record)
                model.used(time.monotonic(), time.time())
                if not model.busy:
                    self.lifecycle.residency.memory_may_have_freed()
            self.metrics.request_finished(record)
            self.tracer.request_finished(record)

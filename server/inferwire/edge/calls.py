"""One call through any door, from its arrival to its access line.

Every RPC and every HTTP route is served as a `Call`, which the house's `Reception` makes
as the call arrives. A door hands over only what it alone can read (its `Method`, the
peer, the call's headers or metadata, the client certificate's subjects) and writes its
own answer; the call does the rest, alike for every door:
- `authenticate`: who is calling (edge/authentication.py: the principal, the scope its method
  needs, a client certificate's tenant), and the tenant and priority hint it runs as
  (`tenant`, `priority_hint`; edge/tenancy.py: the inference gateway's headers, from a
  gateway principal only);
- `check_model`: whether the caller may use the model its request names, where its
  method's facts say (edge/methods.py), checked before anything looks the model up, so an
  unknown model and a forbidden one look the same to a caller who may not see it;
- `name_fields` and `error_reply`: the answer to an error through the one table
  (edge/errors.py), the core's field violations named as the caller sent them;
- its SERVER span (edge/tracing.py), continuing the caller's trace context, current while
  the door serves the call (`served`);
- the core's record of its inference request, joined to it as the request ends (the
  core's listener is `RecordsToCalls`), so the access line says what the core decided;
- `finish`: counts it in its door's series (method or route, code, duration), ends the
  span with the code and writes the one access line (edge/access.py).
A door writes the `error_reply` as its own answer.

Both doors' handlers find their call the same way, as the one current in the task
(`current_call`, which says why).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from inferwire.core.auth import UNRESTRICTED, Principal
from inferwire.core.metrics import MetricsListener
from inferwire.core.record import RequestRecord
from inferwire.core.requests import Priority
from inferwire.edge.access import access_logged, write_access_line
from inferwire.edge.authentication import Authenticator
from inferwire.edge.errors import Code, ErrorReply, error_reply
from inferwire.edge.methods import MethodFacts
from inferwire.edge.tenancy import FAIRNESS_HEADER, OBJECTIVE_HEADER, Tenancy
from inferwire.edge.tracing import ServerTracing, current_trace_id


class CallSeries(Protocol):
    """A door's per-call series of one method or route."""

    def finished(self, code: Code, status: int | None, elapsed_s: float) -> None:
        """Count an ended call: its code, its HTTP status (None on gRPC), its duration."""


@dataclass(frozen=True)
class Method:
    """What a door serves, described once per RPC or route."""

    name: str  # the access line's: `/inferwire.v1.InferenceService/Infer`, `POST /v1/models`
    what: str  # a refusal's words: `Infer`, `POST /v1/models`
    facts: MethodFacts  # its row of the one table (edge/methods.py): scope, inference, model
    series: CallSeries
    span_name: str
    span_attributes: Mapping[str, Any] = field(default_factory=dict)


_NO_SPAN = contextlib.nullcontext()


class Call:
    """One call being served: who makes it, its span, and what the core recorded of it."""

    __slots__ = (
        "_done",
        "_field_of",
        "_headers",
        "_reception",
        "_span",
        "_subjects",
        "method",
        "model",
        "peer",
        "principal",
        "priority_hint",
        "record",
        "request_id",
        "started",
        "tenant",
        "trace_id",
    )

    def __init__(
        self,
        reception: Reception,
        method: Method,
        peer: str,
        headers: Mapping[str, str],
        subjects: Callable[[], Iterable[str]],
    ) -> None:
        self.started = time.perf_counter()
        self._reception, self.method, self.peer = reception, method, peer
        self._headers, self._subjects = headers, subjects
        self.principal: Principal = UNRESTRICTED
        # The tenant its request runs as, and the priority its gateway asks for: set
        # when it is authenticated.
        self.tenant = UNRESTRICTED.tenant
        self.priority_hint: Priority | None = None
        self.record: RequestRecord | None = None  # the core's, once its request ended
        self.trace_id = ""  # the request's trace, when tracing is on
        # What the request names, for the access line of a call the core did not see.
        self.model = self.request_id = ""
        self._done = False
        self._field_of: Callable[[str], str] | None = None
        tracing = reception.tracing
        self._span = (
            None
            if tracing is None
            else tracing.start_server_span(method.span_name, headers, method.span_attributes)
        )
        _CALL.set(self)  # each call runs in a task of its own

    def served(self) -> contextlib.AbstractContextManager[Any]:
        """Keep the call's span current while the door serves it (nothing without tracing)."""
        if self._span is None:
            return _NO_SPAN
        assert self._reception.tracing is not None
        return self._reception.tracing.current(self._span)

    def authenticate(self) -> None:
        """Find the caller, and the tenant and priority hint it runs as; raise
        UnauthenticatedError or PermissionDeniedError when its credentials do not allow
        the method."""
        authenticator = self._reception.authenticator
        if authenticator.checks_anything:
            key_header = self.method.facts.key_header
            self.principal = authenticator.principal(
                self._headers.get("authorization"),
                self.method.facts.scope,
                self.method.what,
                self._subjects,
                self._headers.get(key_header) if key_header else None,
            )
        headers = self._headers
        fairness_id, objective = headers.get(FAIRNESS_HEADER), headers.get(OBJECTIVE_HEADER)
        if fairness_id is None and objective is None:
            self.tenant = self.principal.tenant
        else:
            self.tenant, self.priority_hint = self._reception.tenancy.resolve(
                self.principal, fairness_id, objective
            )

    def check_model(self, field: Callable[[str], object]) -> None:
        """Raise PermissionDeniedError unless the caller may use the model its request
        names, before anything looks the model up. `field`: the door's reading of its
        request's field by name; the method's facts say which field names the model. A
        value that is no string is the door's to refuse, and an empty one, where the
        method takes it for every model, names none."""
        facts = self.method.facts
        if facts.model_at is None:
            return
        model = field(facts.model_at)
        if not isinstance(model, str) or (not model and facts.every_model_if_empty):
            return
        self.model = model
        self.principal.require_model(model)

    def name_fields(self, field_of: Callable[[str], str]) -> None:
        """How the request names the core's fields (`field_of`: the core's name -> the
        one the caller sent), for a door whose fields are not the core's: what the core
        refuses from here on is answered naming the caller's fields."""
        self._field_of = field_of

    def error_reply(self, error: BaseException) -> ErrorReply:
        """The answer to `error` through the one table (edge/errors.py)."""
        return error_reply(error, self._field_of)

    @property
    def traced(self) -> bool:
        """Whether the call has a span (tracing is on)."""
        return self._span is not None

    def set_span_attribute(self, key: str, value: Any) -> None:
        if self._span is not None:
            self._span.set_attribute(key, value)

    def finish(self, code: Code, why: str = "", status: int | None = None) -> None:
        """The answer has gone out (or the client has gone): count the call, end its span
        and write its access line, once."""
        if self._done:
            return
        self._done = True
        elapsed = time.perf_counter() - self.started
        self.method.series.finished(code, status, elapsed)
        if self._span is not None:
            assert self._reception.tracing is not None
            self._reception.tracing.end(self._span, code, why)
        if access_logged():
            write_access_line(
                self.method.name,
                self.peer,
                code.name,
                self.principal,
                self.record,
                elapsed,
                inference=self.method.facts.inference,
                request_id=self.request_id,
                model=self.model,
                trace_id=self.trace_id,
                status=status,
            )


class Reception:
    """What every door's calls share: who may call, whose tenant a call is, the tracing."""

    def __init__(
        self, authenticator: Authenticator, tenancy: Tenancy, tracing: ServerTracing | None
    ) -> None:
        self.authenticator, self.tenancy, self.tracing = authenticator, tenancy, tracing

    def call(
        self,
        method: Method,
        peer: str,
        headers: Mapping[str, str],
        subjects: Callable[[], Iterable[str]] = tuple,
    ) -> Call:
        """A call of `method` that has just arrived; it is the one current in this task."""
        return Call(self, method, peer, headers, subjects)


_CALL: contextvars.ContextVar[Call | None] = contextvars.ContextVar("inferwire_call", default=None)


def current_call() -> Call:
    """The call this task serves (a door's handler runs in its call's task, or a child).

    Both doors' handlers find their call here, not as a parameter: grpc calls a servicer's
    method with its own `(request, context)`, which cannot carry it, and the core's record
    of a request reaches its call the same way (`RecordsToCalls`); one way for both."""
    call = _CALL.get()
    if call is None:
        raise RuntimeError("no call is being served in this task")
    return call


class RecordsToCalls:
    """The core's MetricsListener: `metrics`, and each ended request's record joined to the
    call that sent it (the core ends a request in its call's task)."""

    def __init__(self, metrics: MetricsListener) -> None:
        self._metrics = metrics

    def model_added(self, model: str) -> None:
        self._metrics.model_added(model)

    def request_finished(self, record: RequestRecord) -> None:
        self._metrics.request_finished(record)
        call = _CALL.get()
        if call is not None:
            call.record = record
            call.trace_id = current_trace_id()

    def load_changed(self, model: str, queued: int, running: int) -> None:
        self._metrics.load_changed(model, queued, running)

    def readiness_changed(self, model: str, ready: bool) -> None:
        self._metrics.readiness_changed(model, ready)

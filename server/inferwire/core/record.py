"""One record per inference request: what it did, written by the core, read by everyone.

The model manager creates a `RequestRecord` when a request arrives and decides its
`Outcome` once, when the request ends, from how it ended and from the caller's
deadline. Only then do listeners (metrics, the access line, tracing) see it, so they
cannot disagree. The response's `Usage` and `Timing` are derived from it too.

A backend sees the record as `GenerationProgress`: besides its events it only stamps
its first token, reports counts its events cannot carry, and counts tokens made after
a cancel.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from inferwire.core.results import FinishReason, Timing, Usage
from inferwire.core.tracing import NO_TRACER, Tracer

# grpc cancels an RPC on its own deadline timer; the deadline here is the handler's start
# plus the time remaining then, so a cancellation by that timer can read a little early.
DEADLINE_TIMER_SLACK_S = 0.01


class Outcome(enum.Enum):
    """How an inference request ended; the `outcome` of its metrics and access line."""

    REJECTED = "rejected"  # refused before admission: validation, not ready, queue full
    STOP = FinishReason.STOP.value
    STOP_SEQUENCE = FinishReason.STOP_SEQUENCE.value
    LENGTH = FinishReason.LENGTH.value
    ANSWERED = "answered"  # an embedding or rerank request answered in full
    ERROR = "error"  # failed after admission, in the backend or on a model limit
    CANCELLED = "cancelled"  # the caller went away or stopped reading
    DEADLINE_EXCEEDED = "deadline_exceeded"  # the caller's deadline passed

    @classmethod
    def finished(cls, reason: FinishReason) -> Outcome:
        return cls(reason.value)

    @property
    def cancelled(self) -> bool:
        return self in (Outcome.CANCELLED, Outcome.DEADLINE_EXCEEDED)


@dataclass(slots=True, eq=False)
class RequestRecord:
    """What one inference request did. Times are `time.perf_counter()` values."""

    request_id: str
    model: str
    deadline: float | None = None  # time.monotonic() by which the caller needs the result
    configured: bool = False  # `model` names a configured model (only those become labels)
    arrived: float = field(default_factory=time.perf_counter)
    admitted: float | None = None  # took a concurrency slot
    load_s: float = 0.0  # waited for its on-demand model to load, before queueing
    first_token_at: float | None = None
    ended: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tokens_after_cancel: int = 0  # made by the engine after it was told to stop
    outcome: Outcome = Outcome.REJECTED
    prompt: str = ""  # the request's prompt and output text, kept only with keep_text
    text: list[str] | None = None
    tracer: Tracer = NO_TRACER  # times the backend's own stages
    tenant: str = ""  # whose request it is (core/tenants.py), once known
    tenant_label: str = ""  # its metrics label: the name only for a configured tenant
    priority: str = ""  # the class it queued in: interactive, standard or batch
    throttled: str = ""  # the tenant quota that refused it (core/quotas.py), if one did
    tool_calls: int = 0  # calls in its answer (core/tool_calls.py)
    inputs: int = 0  # an embedding or rerank request's inputs (core/embeddings.py)
    batch_inputs: int = 0  # the most inputs (its own and others') it ran in one batch with

    # ---- what a backend reports (GenerationProgress) ---------------------

    def first_token(self, at: float | None = None) -> None:
        """The first token was ready `at` (default: now); later calls change nothing."""
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter() if at is None else at

    def counted(
        self, prompt_tokens: int | None = None, completion_tokens: int | None = None
    ) -> None:
        if prompt_tokens is not None:
            self.prompt_tokens = prompt_tokens
        if completion_tokens is not None:
            self.completion_tokens = completion_tokens

    def generated_after_cancel(self, count: int = 1) -> None:
        self.tokens_after_cancel += count

    def batched(self, inputs: int) -> None:
        """Its inputs ran in an engine batch of `inputs` inputs (EncodingProgress)."""
        self.batch_inputs = max(self.batch_inputs, inputs)

    # ---- decided by the core --------------------------------------------

    def end(self, outcome: Outcome) -> None:
        """Decide the outcome, once; a cancellation is a deadline when it had passed."""
        if self.ended is not None:
            return
        if (
            outcome.cancelled
            and self.deadline is not None
            and time.monotonic() >= self.deadline - DEADLINE_TIMER_SLACK_S
        ):
            outcome = Outcome.DEADLINE_EXCEEDED
        self.outcome, self.ended = outcome, time.perf_counter()

    def usage(self) -> Usage:
        return Usage(self.prompt_tokens, self.completion_tokens)

    def timing(self) -> Timing:
        now = self.ended or time.perf_counter()
        return Timing(
            queue_ms=self.queue_s * 1e3,
            time_to_first_token_ms=((self.first_token_at or now) - self.arrived) * 1e3,
            total_ms=(now - self.arrived) * 1e3,
            load_ms=self.load_s * 1e3,
        )

    @property
    def queue_s(self) -> float:
        return 0.0 if self.admitted is None else self.admitted - self.arrived - self.load_s

    @property
    def time_to_first_token_s(self) -> float | None:
        """From arrival, queue time included; None without a token."""
        return None if self.first_token_at is None else self.first_token_at - self.arrived

    @property
    def time_per_output_token_s(self) -> float | None:
        """Mean time per token after the first; None with fewer than two tokens."""
        if self.first_token_at is None or self.completion_tokens < 2:
            return None
        end = self.ended or time.perf_counter()
        return (end - self.first_token_at) / (self.completion_tokens - 1)

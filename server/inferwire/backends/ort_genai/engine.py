"""The engine path: one `og.Engine` per model, driven by one step loop thread.

What ONNX Runtime GenAI 0.18's engine offers (checked against the installed library and
the bundled model; see docs/ort_genai_batching.md for the measurements):

- Continuous batching (requests joining a running batch between steps) needs
  `{"engine": {"dynamic_batching": {...}}}` in genai_config.json, and that needs a model
  exported with a paged KV cache (the model builder's `use_paged_attention`, which its
  help says is "currently only supported for the CUDA execution provider with fp16 or
  bf16 precision"). On a CPU model `og.Engine` refuses it ("Paged cache input must have
  rank four ..."). So on the CPU the engine runs **static batching**: requests submitted
  while it is idle form one batch, rows leave early (end of sequence, max tokens,
  cancellation) but a request submitted mid-batch waits until the whole batch drained.
  And a step takes at most 4 rows whatever `max_batch_size` says (0.18, on every overlay
  and prompt length tried): 16 requests begun together run as four batches of 4, one
  after the other, in the order begun. The warm-up counts the rows of a full first step
  (`step_width`), and only a batch narrower than that is re-formed: rows begun past it
  wait inside og.Engine for the next batch anyway, as they do when driven directly.
- A per-request seed is refused by a static engine ("A per-turn seed requires an Engine
  configured for dynamic batching"); temperature, top_p and top_k hold per row. Seeded
  requests therefore take the per-request generator unless the model is a
  dynamic-batching one (`EngineStepLoop.serves`), and so do the generator's features,
  log-probabilities and output constraints, and a request in a reserved slot
  (core/reserve.py), so as not to wait for a static batch (docs/ort_genai_batching.md).
- `TurnOptions.set_min_generated_tokens(n)` masks every end-of-sequence id until the turn
  has generated n tokens, on a static engine too (checked on the bundled weights with a
  second end-of-sequence id, the common ".": a turn that ends after 4 tokens without it
  runs 17 with n=10, and exactly max_generated_tokens with n equal to it). So min_tokens
  and ignore_eos (n = max_tokens) stay on the engine, and a row begun again owes only the
  rest of its minimum.
- `Request.cancel_turn` ends one row at the next `run` (one `CANCELLED` event, no token);
  the other rows go on unchanged. A cancelled turn cannot be continued on the same
  request (a new turn there does not resume the sequence exactly), but a new request with
  the prompt plus the tokens generated so far continues it token for token (greedy).

How this step loop uses that:

- Commands from the event loop (start, cancel, resume) are applied between `run` steps.
  On a dynamic engine a started row joins the running batch at once. On a static engine
  it waits for the batch to drain; to bound that head-of-line blocking, a batch is
  *preempted* when it has run `static_batch_steps` steps while others wait, or at once
  when the waiting requests would at least double it (requests sent together arrive one
  by one): its rows are cancelled and begun again (prompt plus their tokens so far) in
  the next batch, together with the waiting requests. `static_batch_steps: 0` never
  preempts. The re-prefill is the price, and outputs are not
  batch-invariant: a re-formed batch pads rows differently, so a greedy near-tie in a
  batch-mate can flip (docs/ort_genai_batching.md).
- A row of a shared batch cannot pause for a slow consumer. Each row buffers at most
  `BUFFERED_DELTAS` undelivered deltas; when its consumer falls that far behind, the row
  is preempted the same way and parked, and it is begun again once the consumer has read
  down to `RESUME_AT`. So a stalled reader costs a bounded buffer and no batch slot.
- Tokens are decoded to text here, on the step loop's thread, with one `TokenizerStream`
  per request (kept across preemptions); they reach each event loop at most once per
  `stream_interval_ms` (first tokens and ends at once) through one `delivery.Outbox`,
  the hand-over the per-request path uses too (delivery.py says why). The consumer's side
  is `consumer.consume`, shared with the per-request path.
- Cancellation (the consumer closing its stream: client cancel, deadline, stop string)
  reaches the engine before its next step: at most one more token is produced, counted
  through `GenerationProgress.generated_after_cancel`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import numpy as np
import onnxruntime_genai as og

from inferwire.backends.ort_genai.model import LoadedModel
from inferwire.backends.ort_genai.sampling import PathRequest
from inferwire.backends.threaded.consumer import Channel, StreamEvent, TokenTally
from inferwire.backends.threaded.shared_thread import (
    BUFFERED_DELTAS,
    RESUME_AT,
    Handover,
    SharedThreadRequest,
)
from inferwire.backends.threaded.step_loop import StepLoop
from inferwire.core.backend import GenerationEvents, GenerationProgress
from inferwire.core.results import FinishReason, TextDelta
from inferwire.core.sampling import GenerationParams

log = logging.getLogger(__name__)


_TOKEN = int(og.EngineEventFlags.TOKEN)
_TURN_FINISHED = int(og.EngineEventFlags.TURN_FINISHED)
_FAILED = int(og.EngineEventFlags.FAILED)
_FINISH_REASON = {
    og.FinishReason.EOS: FinishReason.STOP,
    og.FinishReason.STOP_STRING: FinishReason.STOP_SEQUENCE,
    og.FinishReason.MAX_GENERATED_TOKENS: FinishReason.LENGTH,
    og.FinishReason.MAX_SESSION_TOKENS: FinishReason.LENGTH,
}


@dataclass(frozen=True)
class EngineSettings:
    """How the step loop batches (the backend's options)."""

    max_batch_size: int
    # On a static engine, the steps a batch runs while others wait before it is
    # preempted; 0: a batch always runs to its end.
    static_batch_steps: int
    name: str  # the model's, for the thread's name
    # The least time between two hand-overs to the event loop (delivery.py); 0: every step.
    stream_interval_s: float = 0.0


@dataclass(eq=False, kw_only=True)
class _Row(SharedThreadRequest):
    """One request on the engine, across any number of preemptions (`paused`: preempted
    for a slow consumer, begun again once it catches up)."""

    prepared: PathRequest
    detokenizer: og.TokenizerStream
    generated: list[int] = field(default_factory=list)
    # Scheduler side.
    engine_request: og.Request | None = None
    turn_id: int = 0
    cancel_sent: bool = False
    requeue: bool = False  # preempted to make room: begin again with the next batch


def engine_serves(dynamic: bool, params: GenerationParams, reserved: bool) -> bool:
    """Whether an engine (`dynamic`: continuous batching) serves a request as asked,
    `reserved` in a reserved slot."""
    if params.logprobs or params.constraint is not None:
        return False
    return (params.seed is None and not reserved) or dynamic


class EngineStepLoop(StepLoop[_Row]):
    """Drives one `og.Engine` from one thread; `stream` runs a request on it."""

    what = "og.Engine step loop"

    def __init__(
        self, model: LoadedModel, settings: EngineSettings, handover: Handover | None = None
    ) -> None:
        # Where rows' items go: this process's event loops, or a pipe (engine_host.py).
        super().__init__(
            f"ortgenai-engine-{settings.name}",
            f"engine-{settings.name}",
            handover or Handover(settings.stream_interval_s),
        )
        self.dynamic = model.dynamic_batching
        self.max_batch_size = settings.max_batch_size
        self._model = model
        self._static_batch_steps = settings.static_batch_steps
        self._name = settings.name
        self._running: dict[og.Request, _Row] = {}
        self._paused: set[_Row] = set()
        self._batch_steps = 0
        # The rows one step really takes (_warm_up): og.Engine 0.18's static scheduler
        # steps 4 rows whatever max_batch_size says and queues the rest in order.
        self.step_width = self.max_batch_size
        self.start()  # the engine must be used from the thread that made it: `_open`

    # ---- the event-loop side --------------------------------------------

    def serves(self, params: GenerationParams, reserved: bool = False) -> bool:
        return engine_serves(self.dynamic, params, reserved)

    def stream(self, request: PathRequest, progress: GenerationProgress) -> GenerationEvents:
        """Run one request on the engine: its deltas, then its end."""
        loop = asyncio.get_running_loop()
        row = self.new_row(request, TokenTally(progress, len(request.prompt_ids)), loop)
        return self._consume(row, request.coalesce)

    def new_row(
        self, request: PathRequest, tally: TokenTally, loop: asyncio.AbstractEventLoop
    ) -> _Row:
        """A request for this step loop, its items for `loop`; `start()` submits it."""
        return _Row(
            send=self.send,
            prepared=request,
            tally=tally,
            channel=Channel(loop),
            detokenizer=self._model.tokenizer.create_stream(),
            released=loop.create_future(),
        )

    # ---- the step loop's thread -----------------------------------------

    def _open(self) -> None:
        self._engine = og.Engine(self._model.model)
        self._buffer = self._engine.create_event_buffer(max(64, 4 * self.max_batch_size))
        self._warm_up()

    def _runnable(self) -> bool:
        return bool(self._running or self._waiting)

    def _holding(self) -> list[_Row]:
        return [*self._running.values(), *self._waiting, *self._paused]

    def _resume(self, row: _Row) -> None:
        if row in self._paused and not row.closed:
            self._paused.discard(row)
            row.paused = row.resume_sent = False
            self._waiting.append(row)

    def _cancel(self, row: _Row) -> None:
        if row in self._paused:
            self._paused.discard(row)
            self._release(row)
        elif row.engine_request is not None and not row.cancel_sent:
            row.engine_request.cancel_turn(row.turn_id)
            row.cancel_sent = True

    def _admit(self) -> None:
        """Begin waiting rows: at once on a dynamic engine, as a new batch on a static one."""
        if not self.dynamic and self._running and len(self._running) < self.step_width:
            # A static batch with room: a new row would wait for all of it, so re-form it
            # or wait. Rows begun past a full one queue inside og.Engine for the next.
            if (
                self._waiting
                and self._static_batch_steps
                and (self._batch_would_double() or self._batch_steps >= self._static_batch_steps)
            ):
                for row in self._running.values():
                    self._preempt(row, requeue=True)
            return
        if not self._running:
            self._batch_steps = 0
        while self._waiting and len(self._running) < self.max_batch_size:
            self._begin(self._waiting.popleft())

    def _batch_would_double(self) -> bool:
        """Whether the waiting requests that fit would at least double the running batch.

        Requests that arrive together reach this thread one by one, and a static batch
        begun with the first of them would hold the others back until it drained (or ran
        `static_batch_steps`). Re-forming costs a prefill of each running row's prompt and
        tokens so far, worth it when the batch grows this much; and since each re-forming
        at least doubles a batch that only shrinks as rows finish, arrivals that never stop
        cannot keep re-forming it.
        """
        room = self.step_width - len(self._running)
        return min(room, len(self._waiting)) >= len(self._running)

    def _begin(self, row: _Row) -> None:
        try:
            request = self._engine.create_request()
        except Exception as exc:
            self._emit(row, exc)
            self._release(row)
            return
        try:
            prepared, generated = row.prepared, len(row.generated)
            # A row begun again (preempted) owes only the rest of its minimum.
            turn = prepared.sampling.turn_options(
                request,
                prepared.max_tokens - generated,
                max(prepared.min_tokens - generated, 0),
            )
            tokens = np.array(prepared.prompt_ids + row.generated, dtype=np.int32)
            row.turn_id = request.begin_turn(tokens, turn)
        except Exception as exc:
            request.close()
            self._emit(row, exc)
            self._release(row)
            return
        row.engine_request, row.cancel_sent = request, False
        self._running[request] = row

    def _preempt(self, row: _Row, requeue: bool) -> None:
        if row.cancel_sent or row.engine_request is None:
            return
        row.engine_request.cancel_turn(row.turn_id)
        row.cancel_sent = True
        row.requeue = requeue

    def _step(self) -> None:
        try:
            self._engine.run(self._buffer)
        except Exception as exc:
            log.exception("engine step failed")
            for request, row in list(self._running.items()):
                request.close()
                self._emit(row, exc)
                self._release(row)
            self._running.clear()
            return
        self._batch_steps += 1
        for event in self._buffer:
            owner = self._running.get(event.request)
            if owner is None:
                continue
            flags = int(event.flags)
            if flags & _TOKEN:
                self._on_token(owner, int(event.token))
            if flags & _FAILED:
                error = RuntimeError(f"the engine failed the request: {event.error_code}")
                self._end(owner, error)
            elif flags & _TURN_FINISHED:
                self._on_finished(owner, event.finish_reason)

    def _on_token(self, row: _Row, token: int) -> None:
        closed = row.closed
        generated = row.tally.count(after_cancel=closed)
        if closed:
            return
        row.generated.append(token)
        if token in self._model.eos_token_ids:
            return
        if text := row.detokenizer.decode(token):
            self._emit(row, TextDelta(text, generated))
            if row.unread >= BUFFERED_DELTAS:
                self._preempt(row, requeue=False)

    def _on_finished(self, row: _Row, reason: og.FinishReason) -> None:
        if reason != og.FinishReason.CANCELLED or row.closed:
            end = row.tally.end(_FINISH_REASON.get(reason, FinishReason.LENGTH))
            self._end(row, None if row.closed else end)
            return
        self._detach(row)
        if row.requeue:
            row.requeue = False
            self._waiting.appendleft(row)
        else:
            row.paused = True
            self._paused.add(row)
            if row.unread <= RESUME_AT:  # the consumer caught up meanwhile
                self._resume(row)

    def _end(self, row: _Row, item: StreamEvent | None) -> None:
        self._detach(row)
        if item is not None:
            self._emit(row, item)
        self._release(row)

    def _detach(self, row: _Row) -> None:
        if row.engine_request is not None:
            del self._running[row.engine_request]
            row.engine_request.close()
            row.engine_request = None

    def _warm_up(self) -> None:
        """One token per row of a full batch, so the first real request does not pay the
        engine's first step; the first step's rows give the width it really steps."""
        requests = []
        for _ in range(self.max_batch_size):
            request = self._engine.create_request()
            turn = og.TurnOptions(request)
            turn.set_max_generated_tokens(1)
            request.begin_turn(np.array([0], dtype=np.int32), turn)
            requests.append(request)
        self._engine.run(self._buffer)
        self.step_width = max(1, sum(1 for event in self._buffer if int(event.flags) & _TOKEN))
        while self._engine.has_pending_requests():
            self._engine.run(self._buffer)
        for request in requests:
            request.close()
        if self.step_width < self.max_batch_size:
            log.info(
                "og.Engine steps fewer rows than configured",
                extra={"model": self._name, "rows": self.step_width},
            )

"""The per-request path: one `og.Generator` per request, stepped token by token in a thread.

The thread checks a stop flag before every token, so closing the stream (cancellation, a
passed deadline, a matched stop string) stops the engine within one token, and it waits
for credits from the consumer, so a slow reader bounds how far generation runs ahead.
This path serves every request the engine path cannot: log-probabilities and output
constraints are the generator's features.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import onnxruntime_genai as og

from inferwire.backends.ort_genai.continuous.guidance import guidance_text
from inferwire.backends.ort_genai.logprobs import SamplerSettings, TokenLogprobs
from inferwire.backends.ort_genai.model import LoadedModel
from inferwire.backends.ort_genai.sampling import PathRequest
from inferwire.backends.threaded.consumer import Channel, StreamEvent, TokenTally, consume
from inferwire.backends.threaded.delivery import Outbox
from inferwire.core.backend import GenerationEvents, GenerationProgress
from inferwire.core.errors import FieldViolation, InvalidArgumentError
from inferwire.core.results import FinishReason, TextDelta, TokenLogprob
from inferwire.core.sampling import ConstraintKind, OutputConstraint
from inferwire.core.threads import name_this_thread

# How many deltas the generator may run ahead of the consumer. Bounded so a slow
# or vanished client costs little memory and little wasted compute.
LOOKAHEAD_DELTAS = 8

# llguidance reports a constraint it cannot compile with this prefix, when the generator is made.
_GRAMMAR_ERROR = "Error creating grammar:"
# ... and one whose text the model's tokens cannot spell (a regex of characters its
# vocabulary has no tokens for) with this one, when a token is generated.
_COMMIT_ERROR = "Error committing tokens:"


class Turns:
    """One generator of a path steps at a time, for a slice of `SLICE_S` each, in the order
    they asked (a hand-over, so the thread whose slice ended cannot take the next from those
    waiting).

    `og.Generator` holds the GIL while it steps, so generators in several threads never ran
    together: two made fewer tokens/s than one. Each thread stepping at will only made every
    thread wait for the GIL, the event loop among them, which hands the tokens to the
    clients: at 32 streams a first token made 22 ms after its request reached its client
    after 840 (bench peers). Waiting here for its turn, a thread leaves the GIL to the
    loop. A slice of several steps spares a hand-over (a thread woken, and the GIL passed)
    per token."""

    SLICE_S = 0.002

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._since = 0.0
        self._waiting: collections.deque[threading.Lock] = collections.deque()

    def take(self, first: bool = False) -> None:
        """Before a step: the turn, unless this thread's slice goes on. A request's `first`
        step (its prompt and first token) goes ahead of the others waiting, as a batching
        server takes a new prompt into its next step."""
        me = threading.get_ident()
        if self._owner == me:
            return
        with self._lock:
            if self._owner is None:
                self._owner, self._since = me, time.perf_counter()
                return
            turn = threading.Lock()
            turn.acquire()
            if first:
                self._waiting.appendleft(turn)
            else:
                self._waiting.append(turn)
        turn.acquire()  # released by the thread whose slice ended: ours now
        self._owner, self._since = me, time.perf_counter()

    @property
    def waiting(self) -> int:
        """How many threads wait for the turn."""
        return len(self._waiting)

    def stepped(self) -> None:
        """After a step: pass the turn on if the slice is over and someone waits."""
        if self._waiting and time.perf_counter() - self._since >= self.SLICE_S:
            self.leave()

    def leave(self) -> None:
        """Before this thread waits or ends: pass the turn on (if it holds it)."""
        if self._owner != threading.get_ident():
            return
        with self._lock:
            if self._waiting:
                self._owner = -1  # nobody's until the one woken sets itself: first, so
                self._waiting.popleft().release()  # that this cannot overwrite it
            else:
                self._owner = None


@dataclass(frozen=True)
class ActiveAdapter:
    """The LoRA adapter a path's generators run with (an adapter model's, adapter.py)."""

    adapters: og.Adapters
    name: str


class GeneratorPath:
    """Runs each request on its own `og.Generator` in a pool of worker threads."""

    def __init__(
        self,
        model: LoadedModel,
        max_concurrency: int,
        name: str,
        adapter: ActiveAdapter | None = None,
        stream_interval_s: float = 0.0,
    ) -> None:
        self._model = model
        self._adapter = adapter
        self._stream_interval_s = stream_interval_s
        self._turns = Turns()
        self._executor = ThreadPoolExecutor(
            max_workers=max_concurrency,
            thread_name_prefix=f"ortgenai-{name}",
            initializer=name_this_thread,
            initargs=(f"gen-{name}",),
        )

    def close(self) -> None:
        """Wait for the worker threads; called once no request is in flight."""
        self._executor.shutdown(wait=True)

    def stream(self, request: PathRequest, progress: GenerationProgress) -> GenerationEvents:
        """Run one request: its deltas, then its end."""
        channel = Channel(asyncio.get_running_loop())
        tally = TokenTally(progress, len(request.prompt_ids))
        outbox = Outbox(channel.put_all, self._stream_interval_s)
        run = _GeneratorRun(
            self._model, request, tally, channel, outbox, self._executor, self._turns
        )
        run.adapter = self._adapter
        return consume(channel, run, tally, request.coalesce)


class _GeneratorRun:
    """One request's generator thread, as the consumer's `Producer`."""

    def __init__(
        self,
        model: LoadedModel,
        request: PathRequest,
        tally: TokenTally,
        channel: Channel,
        outbox: Outbox[StreamEvent],
        executor: ThreadPoolExecutor,
        turns: Turns,
    ) -> None:
        self._model = model
        self._request = request
        self._tally = tally
        self._channel = channel
        # Deltas reach the loop at most once per stream_interval_ms (the first at once), as
        # on the engine path (delivery.py says why); held ones go before waiting for credit.
        self._outbox = outbox
        self._executor = executor
        self._credits = threading.Semaphore(LOOKAHEAD_DELTAS)
        self._stop = threading.Event()
        self.adapter: ActiveAdapter | None = None
        self.turns = turns  # the path's, shared by its requests

    def start(self) -> asyncio.Future[None]:
        return self._channel.loop.run_in_executor(self._executor, self._run)

    def taken(self, deltas: int) -> None:
        self._credits.release(deltas)

    def stop(self) -> None:
        self._stop.set()
        self._credits.release()  # wake the worker if it waits for the consumer

    def _run(self) -> None:
        try:
            self._generate()
        except BaseException as exc:  # surfaced to the consumer, re-raised there
            self._hand_over(exc, at_once=True)
        finally:
            self.turns.leave()

    def _generate(self) -> None:
        """Run the request to its end, emitting deltas then its end.

        With `params.logprobs`, each delta carries the entries of the tokens whose text it
        holds; a token whose text is still incomplete (part of a UTF-8 character) rides
        with the delta that completes it, and tokens left without text when generation
        ends ride on a last delta with empty text. The end-of-sequence token has no text
        and no entry.
        """
        model, request, emit = self._model, self._request, self._hand_over
        prompt_tokens = len(request.prompt_ids)
        # ORT GenAI's min_length counts the prompt too; it masks every end-of-sequence id.
        min_length = prompt_tokens + request.min_tokens if request.min_tokens else 0
        options = request.sampling.search_options(prompt_tokens + request.max_tokens, min_length)
        self.turns.take(first=True)
        generator = _make_generator(model.model, request, options)
        if self.adapter is not None:
            generator.set_active_adapter(self.adapter.adapters, self.adapter.name)
        generator.append_tokens(request.prompt_ids)
        scorer = None
        if request.params.logprobs:
            sampler = SamplerSettings.of(model.search_defaults, options)
            scorer = TokenLogprobs(
                model.vocab_size,
                request.prompt_ids,
                sampler,
                request.params.top_logprobs,
                model.token_texts,
                masked=model.eos_token_ids,
                masked_steps=request.min_tokens,
            )
        pending: list[TokenLogprob] = []
        detokenizer = model.tokenizer.create_stream()
        finish = FinishReason.LENGTH
        generated = 0
        while generated < request.max_tokens:
            if self._stop.is_set():
                return
            if generator.is_done():
                break
            # The logits are the raw ones: the engine penalises its own copy when it chooses.
            self.turns.take()
            distribution = None if scorer is None else scorer.distribution(generator.get_logits())
            _next_token(generator, request)
            token = int(generator.get_next_tokens()[0])
            self.turns.stepped()
            cancelled = self._stop.is_set()
            generated = self._tally.count(after_cancel=cancelled)
            if cancelled:
                return
            if token in model.eos_token_ids:
                finish = FinishReason.STOP
                break
            if scorer is not None and distribution is not None:
                pending.append(scorer.entry(distribution, token))
            if text := detokenizer.decode(token):
                self._wait_for_credit()
                emit(TextDelta(text, generated, tuple(pending)))
                pending.clear()
        if pending:
            emit(TextDelta("", generated, tuple(pending)))
        emit(self._tally.end(finish), at_once=True)

    def _hand_over(self, item: StreamEvent, at_once: bool = False) -> None:
        self._outbox.add(self._channel.loop, item, urgent=at_once)
        self._outbox.flush()

    def _wait_for_credit(self) -> None:
        if self._credits.acquire(blocking=False):
            return
        self.turns.leave()  # others step while this one waits for its consumer
        self._outbox.flush(force=True)  # the consumer cannot catch up on what it was not given
        while not self._credits.acquire(timeout=0.1):
            if self._channel.loop.is_closed():  # its consumer went with it (the outbox
                self._stop.set()  # drops what it is handed): stop as if it had left
            if self._stop.is_set():
                return


def _next_token(generator: Any, request: PathRequest) -> None:
    """Generate one token; a constraint the model cannot go on satisfying is the request's
    fault (INVALID_ARGUMENT naming the constraint), not the server's."""
    try:
        generator.generate_next_token()
    except RuntimeError as exc:
        constraint, reason = request.params.constraint, str(exc)
        if constraint is None or not reason.startswith(_COMMIT_ERROR):
            raise
        # llguidance's reason, less the parser state it dumps after it.
        reason = reason.removeprefix(_COMMIT_ERROR).split("\n<state>", 1)[0].strip()
        why = f"the model's tokens cannot spell text that satisfies it: {reason}"
        raise InvalidArgumentError([FieldViolation(constraint.field, why)]) from None


def _make_generator(model: og.Model, request: PathRequest, options: dict[str, Any]) -> Any:
    generator_params = og.GeneratorParams(model)
    generator_params.set_search_options(**options)
    constraint = request.params.constraint
    if constraint is None:
        return og.Generator(model, generator_params)
    generator_params.set_guidance(constraint.kind.value, guidance_text(constraint))
    try:
        return og.Generator(model, generator_params)
    except RuntimeError as exc:
        reason = str(exc)
        if not reason.startswith(_GRAMMAR_ERROR):
            raise
        reason = reason.removeprefix(_GRAMMAR_ERROR).strip()
        field = _part_at_fault(model, constraint, options) or constraint.field
        raise InvalidArgumentError([FieldViolation(field, reason)]) from None


def _part_at_fault(model: og.Model, constraint: OutputConstraint, options: dict[str, Any]) -> str:
    """The field of the first part (a tool's schema) llguidance cannot compile alone; ""
    if none (or the constraint has no parts)."""
    for field, schema in constraint.parts:
        generator_params = og.GeneratorParams(model)
        generator_params.set_search_options(**options)
        generator_params.set_guidance(ConstraintKind.JSON_SCHEMA.value, schema)
        try:
            og.Generator(model, generator_params)
        except RuntimeError as exc:
            if str(exc).startswith(_GRAMMAR_ERROR):
                return field
            raise
    return ""

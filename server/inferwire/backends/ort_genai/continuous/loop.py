"""Continuous batching on one ONNX Runtime session, driven by one thread (the step loop).

Each iteration reads one chunk of one prompt (`prefill_tokens` at most) and then takes
one decode step of every running request together, so a request joins the running batch
as soon as its prompt is read (its first token goes out then, before the step) and leaves
it when it ends; 32 streams read the weights once a step. One prompt an iteration, not
every waiting one in one run: in a closed loop of equal answers, prompts read together end
together and come back together, and each wave waits for the whole wave's read (8 streams
on OpenVINO's kernels: TTFT p50 749 against 308 ms, the notebook). A step's rows are
contiguous (decoder.py binds rows 0..n-1), so the slots are kept packed:

    rows 0 .. D-1   the requests decoding
    row D           the request whose prompt is being read, if any
    rows after      free slots, each holding the tokens its last request left (a cache)

A request that ends trades rows with the last decoding one, so its tokens stay as a free
slot's cache; a new request takes the free slot whose cache shares the longest prefix
with its prompt (more than a tenth of it, else the least recently used: llama-server's
slot choice) and reads only the rest of its prompt, so a conversation's next turn reads
only its new messages. A request whose consumer has `BUFFERED_DELTAS` undelivered deltas
stays in the step but does not advance (its row recomputes the same position) until its
consumer reads down to `RESUME_AT`.

Exactness. Rows of a step of two or more do not depend on each other (decoder.py), and a
prompt read in chunks of two or more tokens is bit for bit the prompt read at once. A
one-row run takes ONNX Runtime's one-row kernels, which round differently (a SmolLM2 int4
logit moved by 0.5). So a prompt's last two tokens are read together, and a seeded row
(every row with `batch_invariant`) never steps alone (`_shadowed`) and takes from a cache
only what a prompt read (`Slot.exact`), never an answer's tokens, decoded one at a time:
its tokens depend on its own inputs only. An unseeded row alone steps alone (9.9 against
11.3 ms a step, SmolLM2 on AVX2) and takes the whole cached conversation, so its greedy
text can differ from a batched one's, as vLLM's can (docs/generation.md has the rate).

Two kernels (`kernels: both`). A second decoder (paged_decoder.py: OpenVINO's kernels on
the GGUF the folder came from) steps batches for about half ONNX Runtime's CPU but a lone
row for 1.35x (bench/openvino_decoder.py). Each slot's KV lives in one decoder
(`Slot.kernels`); a request is read and stepped where it was seated (`_kernels_for`): an
unseeded request that would run alone, and an adapter's, on ONNX Runtime's; every other
on OpenVINO's, a seeded one always (they round a row alike in any batch: no shadow). A
lone request whose prompt continues no cache on ONNX Runtime's is read on OpenVINO's (0.7x
the CPU), and its KV copied to its ONNX Runtime row if it is still alone (`_hand_off`: the
two hold KV alike, 3-15% apart, as their weights are). Once others join a lone
request, its tokens so far are read again into OpenVINO blocks and it steps with them
(`_gather`): a row on ONNX Runtime's beside a batch costs a run of its own every step. A
slot's cache serves only requests on its kernels.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from inferwire.backends.ort_genai.continuous.decoder import Decoder
from inferwire.backends.ort_genai.continuous.guidance import Grammars, allowed, apply_mask
from inferwire.backends.ort_genai.continuous.paged_decoder import PagedDecoder
from inferwire.backends.ort_genai.continuous.rows import (
    SLOT_SIMILARITY,
    ContinuousRequest,
    Job,
    LoopShape,
    Slot,
    cache_holder,
    live_prefix,
    row_stretches,
)
from inferwire.backends.ort_genai.continuous.sampler import RowSampler, greedy_tokens
from inferwire.backends.threaded.consumer import StreamEvent
from inferwire.backends.threaded.shared_thread import Handover
from inferwire.backends.threaded.step_loop import SlotStepLoop
from inferwire.core.backend import GenerationEvents, GenerationProgress
from inferwire.core.errors import FieldViolation, InvalidArgumentError
from inferwire.core.facts import PromptCacheStats
from inferwire.core.kv_blocks import BlockLedger
from inferwire.core.results import FinishReason, TextDelta, TokenLogprob

log = logging.getLogger(__name__)


class ContinuousLoop(SlotStepLoop[Job]):
    """One model's session and slots, stepped by one thread; `stream` runs a request."""

    what = "continuous batching loop"

    def __init__(
        self,
        decoder: Decoder | PagedDecoder,
        tokenizer: Tokenizer,
        grammars: Grammars | None,
        eos_ids: frozenset[int],
        shape: LoopShape,
        reuse_prompts: bool = True,
        blocks: BlockLedger | None = None,
        batch_decoder: PagedDecoder | None = None,
    ) -> None:
        super().__init__(
            f"ortgenai-continuous-{shape.name}",
            f"batch-{shape.name}",
            Handover(shape.stream_interval_s),
        )
        self._decoders: tuple[Decoder | PagedDecoder, ...] = (decoder,)
        if batch_decoder is not None:
            self._decoders += (batch_decoder,)
        self._tokenizer, self._grammars = tokenizer, grammars
        self._eos = eos_ids
        self.shape = shape
        self._reuse = reuse_prompts
        self._blocks = blocks if reuse_prompts else None  # KV events: the slots' caches
        self._slots = [Slot(row) for row in range(shape.slots)]
        self._decoding = 0  # rows 0..decoding-1
        self._reading: Job | None = None  # at row `decoding`
        self._uses = self._prompt_tokens_total = self._reused_tokens_total = 0
        self._token_texts: dict[int, str] = {}
        self.start()

    # ---- the event-loop side --------------------------------------------

    def stream(self, request: ContinuousRequest, progress: GenerationProgress) -> GenerationEvents:
        params = request.params
        job = Job(
            **self._handed_over(request, progress),
            sampler=RowSampler(
                params, request.prompt_ids, self._eos, request.min_tokens, self.token_text
            ),
            detokenizer=DecodeStream(skip_special_tokens=True),
        )
        return self._consume(job, request.coalesce)

    def token_text(self, token: int) -> str:
        """A token's own text (for log-probabilities); decoded once per id."""
        text = self._token_texts.get(token)
        if text is None:
            text = self._token_texts[token] = self._tokenizer.decode([token])
        return text

    def running(self) -> int:
        return self._decoding + (self._reading is not None)

    def cache_stats(self) -> PromptCacheStats:
        cached = [s for s in list(self._slots) if s.job is None and s.tokens]
        tokens = sum(len(s.tokens) for s in cached)
        size = sum(len(s.tokens) * self._decoders[s.kernels].kv_bytes_per_token() for s in cached)
        return PromptCacheStats(
            len(cached), tokens, size, self._prompt_tokens_total, self._reused_tokens_total
        )

    # ---- the step loop's thread -----------------------------------------

    def _open(self) -> None:
        """One read and one step, so the first request does not pay ORT's first runs."""
        for decoder in self._decoders:
            decoder.prefill(0, [0], 0)
            decoder.decode(np.zeros(1, np.int64), np.ones(1, np.int64))

    def _holding(self) -> list[Job]:
        running = [s.job for s in self._slots if s.job is not None]
        return [*self._waiting, *running]

    def _runnable(self) -> bool:
        stepping = any(not self._slots[r].job.paused for r in range(self._decoding))  # type: ignore[union-attr]
        return stepping or self._reading is not None or bool(self._waiting and self._slot_free())

    def _slot_free(self) -> bool:
        return self._reading is None and self.running() < self.shape.slots

    def _resume(self, job: Job) -> None:
        job.paused = job.resume_sent = False

    def _seat(self, job: Job) -> None:
        """Put `job` at row D, on the free slot whose cache its prompt continues."""
        prompt, adapter = job.prepared.prompt_ids, job.prepared.sampling.adapter
        kernels = self._kernels_for(job)
        free = self._slots[self._decoding :]
        holder, shared = cache_holder(free, prompt, (adapter, kernels), self._reuse)
        lone = kernels == 0 and len(self._decoders) > 1 and not adapter
        if lone and shared <= SLOT_SIMILARITY * len(prompt):  # OpenVINO's read it faster
            kernels, job.hand_off = 1, True
            holder, shared = cache_holder(free, prompt, (adapter, kernels), self._reuse)
        if self._exact(job):  # only what a prompt read (the module's docstring)
            shared = min(shared, holder.exact)
        decoding = self._slots[: self._decoding] if self._reuse else []
        source, live = live_prefix(decoding, prompt, (adapter, kernels))
        if live > shared:  # a running request holds more of it: copied, not read again
            holder, shared = min(free, key=lambda s: s.last_used), live
            holder.tokens[:] = prompt[:live]
            holder.exact = live
        # The last two prompt tokens are read: a one-token read rounds as a step does.
        reused = max(0, min(shared, len(prompt) - 2))
        del holder.tokens[reused:]
        holder.exact = len(prompt) if reused <= holder.exact else holder.exact
        holder.adapter, holder.kernels = adapter, kernels
        self._place(holder, self._decoding)
        if source is not None and live == shared:
            self._decoders[kernels].kv.move(source.row, holder.row, reused)
        self._report(holder)
        self._prompt_tokens_total += len(prompt)
        self._reused_tokens_total += reused
        self._uses += 1
        holder.job, holder.last_used = job, self._uses
        job.slot, job.pending = holder, prompt[reused:]
        self._reading = job

    def _kernels_for(self, job: Job) -> int:
        """Which decoder steps `job` (the module's docstring, "Two kernels"); `_seat` may
        have a lone one read on OpenVINO's first."""
        if len(self._decoders) == 1 or job.prepared.sampling.adapter:
            return 0
        if self._exact(job):
            return 1
        return 0 if self._decoding == 0 and not self._waiting else 1

    def _place(self, slot: Slot, row: int) -> None:
        """Move `slot` to `row`, and what was there to `slot`'s row."""
        other = self._slots[row]
        if other is slot:
            return
        for kernels, decoder in enumerate(self._decoders):  # each row's KV is in one
            length = len(slot.tokens) if slot.kernels == kernels else 0
            other_length = len(other.tokens) if other.kernels == kernels else 0
            decoder.kv.swap(slot.row, row, length, other_length)
        self._slots[slot.row], self._slots[row] = other, slot
        other.row, slot.row = slot.row, row

    def _step(self) -> None:
        if self._reading is not None:
            self._read()
            self._handover.flush(force=False)  # a first token goes before the step it joins
        if self._decoding:
            self._decode()

    def _read(self) -> None:
        job = self._reading
        assert job is not None and job.slot is not None
        slot, count = job.slot, self.shape.prefill_tokens
        if len(job.pending) - count == 1:  # never leave one token: see _seat
            count -= 1
        chunk, job.pending = job.pending[:count], job.pending[count:]
        try:
            decoder = self._decoders[slot.kernels]
            logits = decoder.prefill(slot.row, chunk, len(slot.tokens), slot.adapter)
        except Exception as exc:
            del slot.tokens[:]  # its KV no longer matches its tokens
            self._finish(job, exc)
            return
        slot.tokens.extend(chunk)
        self._report(slot)  # the prompt's KV so far is cached
        if job.pending:
            return
        self._reading = None
        if job.hand_off and not (self._decoding or self._waiting):
            self._hand_off(slot)
        self._decoding += 1  # its row is the first after the decoding ones
        self._chose(job, *self._choose(job, logits))

    def _decode(self) -> None:
        if len(self._decoders) > 1:
            self._gather()
            if not self._decoding:
                return
        jobs: list[Job] = [self._slots[r].job for r in range(self._decoding)]  # type: ignore[misc]
        tokens = np.fromiter((job.next_token for job in jobs), np.int64, len(jobs))
        lengths = np.fromiter((len(self._slots[r].tokens) for r in range(len(jobs))), np.int64)
        rows = self._logits(tokens, lengths, jobs)
        if rows is None:
            return
        # Every row's new position is in its slot before any slot moves (a job that ends
        # below moves another slot, which carries only the positions it counts).
        for job in jobs:
            assert job.slot is not None
            if not job.paused:
                job.slot.tokens.append(job.next_token)
        greedy = greedy_tokens(rows)
        for index, job in enumerate(jobs):
            if job.paused:
                continue
            if self._plain(job):
                self._chose(job, int(greedy[index]), None)
            else:
                self._chose(job, *self._choose(job, rows[index]))

    def _hand_off(self, slot: Slot) -> None:
        """A lone request read on OpenVINO's kernels steps on ONNX Runtime's (the module's
        docstring): its row's KV is copied there."""
        paged, decoder = self._decoders[1], self._decoders[0]
        assert isinstance(paged, PagedDecoder) and isinstance(decoder, Decoder)
        decoder.kv.write(slot.row, paged.kv.positions(slot.row, len(slot.tokens)))
        slot.kernels, slot.exact = 0, 0  # not what ONNX Runtime's kernels would read

    def _gather(self) -> None:
        """Move the base model's rows on ONNX Runtime's kernels to OpenVINO's once rows run
        on both (the module's docstring): each re-reads its tokens so far there."""
        decoding = self._slots[: self._decoding]
        if all(slot.kernels == 0 for slot in decoding) or all(s.kernels == 1 for s in decoding):
            return
        chunk = self.shape.prefill_tokens
        for slot in decoding:
            if slot.kernels == 1 or slot.adapter:
                continue
            slot.kernels = 1  # its ONNX Runtime positions are left as they are, unread
            try:
                for start in range(0, len(slot.tokens), chunk):
                    tokens = slot.tokens[start : start + chunk]
                    self._decoders[1].prefill(slot.row, tokens, start)
            except Exception as exc:
                log.exception("moving a row to the batch kernels failed")
                del slot.tokens[:]  # its KV no longer matches its tokens
                assert slot.job is not None
                self._finish(slot.job, exc)
                return  # the rows were repacked; the next step looks again

    @staticmethod
    def _plain(job: Job) -> bool:
        """Whether the argmax of the raw logits is the job's choice."""
        sampler = job.sampler
        return sampler.plain and not sampler.masks_eos() and job.prepared.sampling.matcher is None

    def _logits(
        self, tokens: np.ndarray[Any, Any], lengths: np.ndarray[Any, Any], jobs: list[Job]
    ) -> np.ndarray[Any, Any] | None:
        """The step's logits, one run per stretch of rows on the same kernels and adapter."""
        stretches = row_stretches(self._slots[: len(jobs)])
        try:
            if len(stretches) == 1 and not self._shadowed(jobs, 0, len(jobs)):
                _, _, adapter, kernels = stretches[0]
                return self._decoders[kernels].decode(tokens, lengths, adapter)
            out = np.empty((len(jobs), self._decoders[0].layout.vocab_size), np.float32)
            for start, stop, adapter, kernels in stretches:
                decoder = self._decoders[kernels]
                if not self._shadowed(jobs, start, stop):
                    out[start:stop] = decoder.decode(
                        tokens[start:stop], lengths[start:stop], adapter, first=start
                    )
                    continue
                pair_tokens = np.array([tokens[start], 0], np.int64)
                pair_lengths = np.array([lengths[start], self._shadow_length(stop)], np.int64)
                pair = decoder.decode(pair_tokens, pair_lengths, adapter, first=start)
                out[start] = pair[0]
            return out
        except Exception as exc:
            log.exception("decode step failed")
            for job in jobs:
                assert job.slot is not None
                del job.slot.tokens[:]  # its KV no longer matches its tokens
                self._finish(job, exc)
            return None

    def _shadowed(self, jobs: list[Job], start: int, stop: int) -> bool:
        """Whether rows start..stop-1 are one row that must get a batch's kernels."""
        slot = jobs[start].slot
        assert slot is not None
        rows = self._decoders[slot.kernels].min_exact_rows
        return stop - start < rows and self._exact(jobs[start])

    def _exact(self, job: Job) -> bool:
        """Whether `job`'s tokens must not depend on other traffic (the docstring's)."""
        return self.shape.batch_invariant or job.prepared.params.seed is not None

    def _shadow_length(self, row: int) -> int:
        """Where a shadow row may write a position nobody reads: after its slot's tokens
        (a later stretch's row or a prompt's next chunk rewrites it; a full free slot gives
        up its last token). After the last slot: the decoder's spare row."""
        if row >= len(self._slots):
            return 0
        slot = self._slots[row]
        last = self.shape.slot_tokens - 1
        if len(slot.tokens) > last:
            del slot.tokens[last:]
            slot.exact = min(slot.exact, last)
        return len(slot.tokens)

    def _choose(self, job: Job, logits: np.ndarray[Any, Any]) -> tuple[int, TokenLogprob | None]:
        sampler, matcher = job.sampler, job.prepared.sampling.matcher
        if self._plain(job):
            return int(np.argmax(logits)), None
        constrain = None
        if matcher is not None:
            assert self._grammars is not None
            mask = self._grammars.bitmask(1)
            allowed(matcher, mask, 0)

            def constrain(scores: np.ndarray[Any, Any]) -> None:
                apply_mask(scores, mask, 0)

        return sampler.choose(sampler.scores(logits, constrain))

    def _chose(self, job: Job, token: int, logprob: TokenLogprob | None) -> None:
        """`token` is `job`'s next: emit its text, or end the job."""
        prepared, slot = job.prepared, job.slot
        assert slot is not None
        generated = job.tally.count(after_cancel=False)
        job.sampler.taken(token)
        if logprob is not None:
            job.held.append(logprob)
        matcher = prepared.sampling.matcher
        if token in self._eos:
            self._finish(job, job.tally.end(FinishReason.STOP))
            return
        if matcher is not None and not matcher.consume_token(token):
            why = f"the model's tokens cannot spell text that satisfies it: {matcher.get_error()}"
            field_name = prepared.sampling.constraint_field
            self._finish(job, InvalidArgumentError([FieldViolation(field_name, why)]))
            return
        text = job.detokenizer.step(self._tokenizer, token)
        if text:
            self._emit(job, TextDelta(text, generated, tuple(job.held)))
            job.held = []
        if matcher is not None and matcher.is_stopped():
            self._finish(job, job.tally.end(FinishReason.STOP))
            return
        full = len(slot.tokens) >= self.shape.slot_tokens
        self._went_out(job, token, generated >= prepared.max_tokens or full)

    def _read_next(self, job: Job, token: int) -> None:
        job.next_token = token

    def _finish(self, job: Job, item: StreamEvent | None) -> None:
        """End `job` with `item` (None: its consumer left); its slot keeps its tokens."""
        slot = job.slot
        if slot is not None:
            job.slot, slot.job = None, None
            self._report(slot)  # its tokens stay as a free slot's cache
            if job is self._reading:
                self._reading = None  # its row, D, is the first free one already
            else:
                self._unpack(slot)
        if not job.closed and item is not None:
            if job.held and not isinstance(item, BaseException):
                self._emit(job, TextDelta("", job.tally.generated, tuple(job.held)))
            self._emit(job, item)
        self._release(job)

    def _report(self, slot: Slot) -> None:
        if self._blocks is not None:  # an adapter's blocks under its model's name
            self._blocks.held(slot, slot.tokens, slot.adapter, slot.adapter.split("#")[0])

    def _unpack(self, slot: Slot) -> None:
        """A decoding slot just freed: the last decoding row takes its place, and the
        request being read, if any, moves down beside them."""
        last = self._decoding - 1
        self._place(slot, last)
        self._decoding = last
        if self._reading is not None and self._reading.slot is not None:
            self._place(self._reading.slot, last)

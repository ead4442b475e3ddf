"""Continuous batching on one llama.cpp context, driven by one thread.

Each step is one `llama_decode` of every running request's next token together with
chunks of the prompts still being read (up to `batch_tokens` in all), as llama-server's
slots do: a request joins the running batch at the next step and leaves it when it ends,
so 32 streams read the weights once per step, not 32 times.

Slots and their cache. The context has one KV stream per slot (`kv_unified` off). A slot
keeps what its last request left in its stream after that request ends. A new request
takes the cache of the free slot whose cached tokens hold more than a tenth of its prompt
(the most, if several do), or else of the least recently used free slot, drops the rest of
that cache and reads only the part of its prompt past the shared prefix: the next turn of a
conversation, whose prompt is the whole history, reads only the new messages, and a new
chat reads the system prompt from a slot that has it. This is llama-server's
`cache_prompt` and its slot choice (`--slot-prompt-similarity`, 0.1 in the llama.cpp that
`bench peers` builds). A slot about to lose most of its cache saves it to host memory
first, and a prompt that a saved conversation continues gets it back (saved_prompts.py).

Packed slots. llama.cpp puts sequences in one micro-batch only if their ids are
consecutive (0, 1, 2; not 0, 4, 8), so a request always runs on the lowest free slot and
the cache it takes moves there (what that slot held moves the other way): 8 requests on
slots 0-7 step in 112 ms on SmolLM2, on slots 0, 4, ... 28 in 182 ms.

Flow control (threaded/shared_thread.py): a request whose consumer has `BUFFERED_DELTAS`
undelivered deltas sits out the steps until its consumer reads down to `RESUME_AT`; its KV
stays, so it costs nothing but its slot. Cancellation reaches the thread before its next step.
"""

from __future__ import annotations

import codecs
import ctypes
import logging
from dataclasses import dataclass, field

import llama_cpp as llama

from inferwire.backends.llama_cpp.model import ContextShape, GgufModel
from inferwire.backends.llama_cpp.sampling import SlotRequest, TokenPicker
from inferwire.backends.llama_cpp.saved_prompts import SavedPrompts, read_sequence, write_sequence
from inferwire.backends.llama_cpp.step_plan import Runner, plan_step
from inferwire.backends.threaded.consumer import StreamEvent
from inferwire.backends.threaded.shared_thread import (
    Handover,
    SharedThreadRequest,
)
from inferwire.backends.threaded.step_loop import SlotStepLoop
from inferwire.core.backend import GenerationEvents, GenerationProgress
from inferwire.core.facts import PromptCacheStats
from inferwire.core.kv_blocks import BlockLedger
from inferwire.core.prefix import shared_prefix
from inferwire.core.results import FinishReason, TextDelta

log = logging.getLogger(__name__)

# A free slot is chosen for its cache when that holds more than this share of the prompt
# (llama-server's --slot-prompt-similarity, whose default went from 0.5 to 0.1: at 0.5 a
# new chat whose shared system prompt is a fifth of its prompt took an empty slot and read
# it again, 13% more time to first token at concurrency 1 than llama-server).
SLOT_SIMILARITY = 0.1
# A slot's cache is saved before a request keeps less than this share of it. llama-server
# saves below a half; short chats that share a long system prompt keep more than that of
# each other's cache, and would lose their own part.
SAVE_BELOW_KEPT_SHARE = 0.75


@dataclass(eq=False)
class _Slot:
    seq_id: int
    tokens: list[int] = field(default_factory=list)  # what its KV stream holds, in order
    job: _Job | None = None
    last_used: int = 0


@dataclass(eq=False, kw_only=True)
class _Job(SharedThreadRequest):
    """One request on the context."""

    prepared: SlotRequest
    slot: _Slot | None = None
    pending: list[int] = field(default_factory=list)  # prompt tokens still to read
    next_token: int | None = None  # sampled, not yet in the KV stream
    picker: TokenPicker | None = None
    decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )


class LlamaStepLoop(SlotStepLoop[_Job]):
    """Drives one llama.cpp context from one thread; `stream` runs a request on it."""

    what = "llama.cpp step loop"

    def __init__(
        self,
        model: GgufModel,
        shape: ContextShape,
        name: str,
        stream_interval_s: float,
        reuse_prompts: bool = True,
        saved_prompt_bytes: int = 0,
        blocks: BlockLedger | None = None,
    ) -> None:
        """`blocks`: where the slots' and saved conversations' caches are reported."""
        super().__init__(f"llama-cpp-{name}", f"llama-{name}", Handover(stream_interval_s))
        self._model = model
        self._reuse_prompts = reuse_prompts
        self.shape = shape
        self._slots = [_Slot(seq_id) for seq_id in range(shape.slots)]
        self._uses = 0
        self._prompt_tokens_total = 0
        self._reused_tokens_total = 0
        self._context = model.new_context(shape)
        self._memory = llama.llama_get_memory(self._context)
        self._batch = llama.llama_batch_init(shape.batch_tokens, 0, 1)
        self._blocks = blocks if reuse_prompts else None  # KV events
        self._saved = (
            SavedPrompts(self._context, saved_prompt_bytes, self._blocks)
            if reuse_prompts and saved_prompt_bytes > 0
            else None
        )
        self._warm_up()
        self.start()

    def _closed(self) -> None:
        llama.llama_batch_free(self._batch)
        llama.llama_free(self._context)

    def cache_stats(self) -> PromptCacheStats:
        cached = [s.tokens for s in list(self._slots) if s.job is None and s.tokens]
        tokens = sum(len(t) for t in cached)
        size = tokens * self._model.kv_bytes_per_token
        conversations = len(cached)
        if (saved := self._saved) is not None:  # read unlocked: figures, not decisions
            conversations, tokens, size = (
                conversations + len(saved),
                tokens + saved.tokens,
                size + saved.bytes,
            )
        return PromptCacheStats(
            conversations, tokens, size, self._prompt_tokens_total, self._reused_tokens_total
        )

    def running(self) -> int:
        return sum(1 for slot in self._slots if slot.job is not None)

    def stream(self, request: SlotRequest, progress: GenerationProgress) -> GenerationEvents:
        job = _Job(**self._handed_over(request, progress))
        return self._consume(job, request.coalesce)

    # ---- the step loop's thread -----------------------------------------

    def _holding(self) -> list[_Job]:
        return [*self._waiting, *(s.job for s in self._slots if s.job is not None)]

    def _runnable(self) -> bool:
        return any(s.job is not None and not s.job.paused for s in self._slots) or bool(
            self._waiting and self._slot_free()
        )

    def _slot_free(self) -> bool:
        return any(slot.job is None for slot in self._slots)

    def _resume(self, job: _Job) -> None:
        job.paused = job.resume_sent = False  # its KV stayed in its slot

    def _seat(self, job: _Job) -> None:
        """Put `job` on the free slot whose cache shares the longest prefix with its prompt."""
        prepared, model = job.prepared, self._model
        # Made first: a request refused here leaves no slot or counter changed.
        picker = TokenPicker(
            prepared.sampling,
            prepared.min_tokens,
            prepared.max_tokens,
            model.eog_tokens,
            model.vocab_size,
        )
        prompt = prepared.prompt_ids
        picker.accept_prompt(prompt)
        free = [slot for slot in self._slots if slot.job is None]
        slot, shared = self._slot_for(prompt, free)
        # At least the prompt's last token is computed: its logits give the first token.
        reused = min(shared, len(prompt) - 1)
        llama.llama_memory_seq_rm(self._memory, slot.seq_id, reused, -1)
        del slot.tokens[reused:]
        self._report(slot)
        self._prompt_tokens_total += len(prompt)
        self._reused_tokens_total += reused
        self._uses += 1
        slot.job, slot.last_used = job, self._uses
        job.slot, job.pending, job.picker = slot, prompt[reused:], picker

    def _slot_for(self, prompt: list[int], free: list[_Slot]) -> tuple[_Slot, int]:
        """The slot for `prompt` (the lowest free one) and how many of its first tokens
        that slot then holds."""
        holder, shared = self._cache_holder(prompt, free)
        saved = self._saved
        if saved is not None and shared < SAVE_BELOW_KEPT_SHARE * len(holder.tokens):
            saved.save(holder.seq_id, holder.tokens)
        entry = saved.best(prompt, better_than=shared) if saved is not None else None
        slot = free[0]
        if holder is not slot:  # the holder's cache is not worth moving if a saved one wins
            self._move_caches(holder, slot, keep_holders=shared > 0 and entry is None)
        if saved is not None and entry is not None:
            restored = saved.restore(entry, slot.seq_id)
            slot.tokens = entry.tokens if restored else []
            self._report(slot)  # before the entry lets its blocks go: no churn
            saved.forget(entry)
            shared = shared_prefix(slot.tokens, prompt)
        return slot, shared

    def _cache_holder(self, prompt: list[int], free: list[_Slot]) -> tuple[_Slot, int]:
        """The free slot whose cache the request takes, as llama-server chooses a slot:
        the most similar cache, else the least recently used; and the prefix it shares."""
        if not self._reuse_prompts:
            return min(free, key=lambda s: s.last_used), 0
        similar = [(shared_prefix(s.tokens, prompt), s) for s in free]
        shared, slot = max(similar, key=lambda pair: (pair[0], -pair[1].last_used))
        if shared <= SLOT_SIMILARITY * len(prompt):
            slot = min(free, key=lambda s: s.last_used)
            shared = shared_prefix(slot.tokens, prompt)  # a system prompt, say
        return slot, shared

    def _move_caches(self, holder: _Slot, packed: _Slot, keep_holders: bool) -> None:
        """Give `packed` the cache of `holder` (if `keep_holders`) and `holder` the cache
        `packed` had: both are free, so only where each cache lives changes."""
        context = self._context
        keep = keep_holders and holder.tokens
        to_packed = read_sequence(context, holder.seq_id) if keep else None
        to_holder = read_sequence(context, packed.seq_id) if packed.tokens else None
        holders = (holder.tokens, holder.last_used)
        self._put(holder, to_holder, packed.tokens, packed.last_used)
        self._put(packed, to_packed, *holders)
        if self._blocks is not None:  # what moved is still held; what was dropped is not
            self._blocks.swap(holder, packed)
            self._report(holder)
            self._report(packed)

    def _put(
        self, slot: _Slot, state: ctypes.Array[ctypes.c_uint8] | None, tokens: list[int], used: int
    ) -> None:
        slot.last_used = used
        if state is not None and write_sequence(self._context, slot.seq_id, state):
            slot.tokens = tokens
        else:  # nothing to move, or llama.cpp refused it: the slot starts empty
            llama.llama_memory_seq_rm(self._memory, slot.seq_id, -1, -1)
            slot.tokens = []

    def _step(self) -> None:
        batch = self._batch
        jobs = {s.seq_id: s.job for s in self._slots if s.job is not None and not s.job.paused}
        # A slot's last_used is when its job took it: prompts are read in that order.
        slots = self._slots  # indexed by seq_id
        runners = (Runner(seq, slots[seq].last_used, len(job.pending)) for seq, job in jobs.items())
        plan = plan_step(runners, self.shape.batch_tokens, self.shape.prefill_tokens)
        rows = 0
        outputs: list[tuple[_Job, int]] = []
        read: list[_Slot] = []  # the slots whose prompts this step reads
        for seq_id, count in plan:
            job = jobs[seq_id]
            assert job.slot is not None
            if job.pending:
                read.append(job.slot)
                chunk, job.pending = job.pending[:count], job.pending[count:]
            else:
                assert job.next_token is not None
                chunk, job.next_token = [job.next_token], None
            position = len(job.slot.tokens)
            for offset, token in enumerate(chunk):
                batch.token[rows] = token
                batch.pos[rows] = position + offset
                batch.n_seq_id[rows] = 1
                batch.seq_id[rows][0] = seq_id
                batch.logits[rows] = False
                rows += 1
            batch.logits[rows - 1] = not job.pending
            job.slot.tokens.extend(chunk)
            if not job.pending:
                outputs.append((job, rows - 1))
        batch.n_tokens = rows
        result = llama.llama_decode(self._context, batch)
        if result != 0:
            error = RuntimeError(f"llama_decode failed ({result}) for a batch of {rows} tokens")
            for job in jobs.values():
                assert job.slot is not None  # its stream no longer matches its tokens: drop it
                llama.llama_memory_seq_rm(self._memory, job.slot.seq_id, 0, -1)
                job.slot.tokens.clear()
                self._finish(job, error)
            return
        for slot in read:  # the prompt's KV so far is cached
            self._report(slot)
        for job, row in outputs:
            self._on_logits(job, row)

    def _on_logits(self, job: _Job, row: int) -> None:
        prepared = job.prepared
        assert job.picker is not None
        token = job.picker.pick(self._context, row, job.tally.generated < prepared.min_tokens)
        generated = job.tally.count(after_cancel=False)
        if token in self._model.eog_tokens:
            self._finish(job, job.tally.end(FinishReason.STOP))
            return
        if text := job.decoder.decode(self._model.piece(token)):
            self._emit(job, TextDelta(text, generated))
        assert job.slot is not None
        full = len(job.slot.tokens) >= self.shape.slot_tokens
        self._went_out(job, token, generated >= prepared.max_tokens or full)

    def _read_next(self, job: _Job, token: int) -> None:
        job.next_token = token

    def _finish(self, job: _Job, item: StreamEvent | None) -> None:
        """End `job` with `item` (None: its consumer left); its slot keeps its cache."""
        if job.slot is not None:
            job.slot.job = None
            self._report(job.slot)  # its tokens stay as a free slot's cache
            job.slot = None
        if job.picker is not None:
            job.picker.free()
            job.picker = None
        if not job.closed and item is not None:
            if not isinstance(item, BaseException) and (tail := job.decoder.decode(b"", True)):
                self._emit(job, TextDelta(tail, job.tally.generated))
            self._emit(job, item)
        self._release(job)

    def _report(self, slot: _Slot) -> None:
        if self._blocks is not None:
            self._blocks.held(slot, slot.tokens)

    def _warm_up(self) -> None:
        """One decode, so the first request does not pay the context's first graph."""
        token = self._model.bos_token if self._model.bos_token >= 0 else 0
        batch = self._batch
        batch.token[0], batch.pos[0], batch.n_seq_id[0] = token, 0, 1
        batch.seq_id[0][0], batch.logits[0], batch.n_tokens = 0, True, 1
        llama.llama_decode(self._context, batch)
        llama.llama_memory_clear(self._memory, True)

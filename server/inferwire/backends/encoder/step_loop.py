"""The encoder's step loop: one thread runs every request's inputs in padded batches.

The frame is threaded/step_loop.py's (`StepLoop`: the inbox, start / cancel, the failure
that ends every request it holds); what is the encoder's own is what a step is. A request
arrives with its inputs as token ids; they join the pending inputs, oldest first. Each step
takes one batch: the oldest pending input, and with it the pending inputs nearest its length
(shorter ones first), so that a batch is padded little (bucketed by length, within
PAD_SLACK) and the oldest input always goes, up to `max_inputs` inputs and `max_tokens`
padded tokens. The inputs of
one request may run in several batches, and one batch holds inputs of many requests:
concurrent requests are batched together. When a request's last input is done, it is
released with its vectors (normalized if it asked). A request whose consumer left (a
cancel, a deadline) has its pending inputs taken out before the next batch.
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from inferwire.backends.encoder.model import EncoderModel
from inferwire.backends.threaded.consumer import Channel, TokenTally
from inferwire.backends.threaded.shared_thread import Handover, SharedThreadRequest
from inferwire.backends.threaded.step_loop import StepLoop
from inferwire.core.embeddings import EncodingProgress, Vector

# A batch is padded to its longest input, and on a CPU the padding costs as much as the
# tokens (the attention more), while batching gains little: an input joins a batch only
# while the batch's padded tokens stay within PAD_SLACK x its real ones plus PAD_TOKENS.
# (On one core: 300 texts of 1 to 256 tokens in batches of 32 as they came took 4.8x the
# time of the same texts sorted by length, and sorted batches of 1, 8 and 32 took about
# the same. 400 texts from 32 single-text clients took the step loop 12.5 s of CPU at
# 1.25x + 32, 11.3 s at 1.1x + 16, 10.5 s at 1.0x + 8 and 9.8 s at 1.0x + 0.)
PAD_SLACK, PAD_TOKENS = 1.0, 8


@dataclass(eq=False, kw_only=True)
class EncodeRequest(SharedThreadRequest):
    """One job's inputs on the step loop, and what the loop made of them."""

    inputs: list[list[int]]
    normalize: bool
    vectors: list[Vector | None] = field(default_factory=list)
    pending: int = 0  # inputs not yet run (the thread's)
    largest_batch: int = 0  # the most inputs one of its batches held

    def __post_init__(self) -> None:
        self.vectors = [None] * len(self.inputs)
        self.pending = len(self.inputs)

    @property
    def done(self) -> bool:
        return self.pending == 0


@dataclass(eq=False, slots=True)
class _Input:
    request: EncodeRequest
    index: int
    length: int


class EncoderStepLoop(StepLoop[EncodeRequest]):
    """The thread that runs one encoder model's batches."""

    what = "encoder step loop"

    def __init__(self, model: EncoderModel, name: str, max_inputs: int, max_tokens: int) -> None:
        super().__init__(f"encoder-{name}", "iw-encoder", Handover(0.0))
        self._model = model
        self._max_inputs, self._max_tokens = max_inputs, max_tokens
        self._pending: list[_Input] = []  # oldest first
        self.batches = 0  # run since start (read by tests and benchmarks)

    # ---- the event-loop side -----------------------------------------------

    async def run(
        self, inputs: list[list[int]], normalize: bool, progress: EncodingProgress
    ) -> list[Vector]:
        """Every input's embedding, in order, once its batches ran; a cancel takes the
        request's pending inputs out, and returns once the thread holds none of them."""
        loop = asyncio.get_running_loop()
        tokens = sum(len(ids) for ids in inputs)
        request = EncodeRequest(
            send=self.send,
            tally=TokenTally(progress, tokens),  # type: ignore[arg-type]
            channel=Channel(loop),
            released=loop.create_future(),
            inputs=inputs,
            normalize=normalize,
        )
        released = request.start()
        try:
            await asyncio.shield(released)
        except asyncio.CancelledError:
            request.stop()
            await asyncio.shield(released)
            raise
        if request.largest_batch:
            progress.batched(request.largest_batch)
        if not request.done:  # failed: the error went out before the release
            error = await request.channel.get()
            raise error if isinstance(error, BaseException) else RuntimeError(error)
        return request.vectors  # type: ignore[return-value]

    # ---- the thread ------------------------------------------------------------

    def _runnable(self) -> bool:
        return bool(self._pending or self._waiting)

    def _admit(self) -> None:
        while self._waiting:
            request = self._waiting.popleft()
            self._pending.extend(
                _Input(request, index, len(ids)) for index, ids in enumerate(request.inputs)
            )

    def _step(self) -> None:
        if not self._pending:
            return
        batch = self._batch()
        chosen = {id(item) for item in batch}
        self._pending = [item for item in self._pending if id(item) not in chosen]
        try:
            pooled = self._model.encode([item.request.inputs[item.index] for item in batch])
        except Exception as exc:  # the engine refused this batch: its requests fail, not others
            for request in dict.fromkeys(item.request for item in batch):
                self._pending = [item for item in self._pending if item.request is not request]
                self._emit(request, exc)
                self._release(request)
            return
        self.batches += 1
        finished: list[EncodeRequest] = []
        for item, row in zip(batch, pooled, strict=True):
            request = item.request
            request.largest_batch = max(request.largest_batch, len(batch))
            if request.normalize:
                row = row / max(float(np.linalg.norm(row)), 1e-12)
            request.vectors[item.index] = array("f", row.astype(np.float32).tobytes())
            request.pending -= 1
            if request.done:
                finished.append(request)
        for request in finished:
            self._release(request)

    def _batch(self) -> list[_Input]:
        """The oldest pending input and the pending inputs nearest its length, within the
        bounds (see the module's docstring)."""
        oldest = self._pending[0]
        by_length = sorted(self._pending, key=lambda item: item.length)
        at = next(i for i, item in enumerate(by_length) if item is oldest)
        low, high, longest, real = at, at + 1, oldest.length, oldest.length

        def fits(longest: int, count: int, real: int) -> bool:
            padded = longest * count
            return padded <= self._max_tokens and padded <= PAD_SLACK * real + PAD_TOKENS

        while high - low < self._max_inputs:
            count = high - low + 1
            shorter = by_length[low - 1].length if low > 0 else 0
            if shorter and fits(longest, count, real + shorter):
                low -= 1  # a shorter input: the batch's longest stays
                real += shorter
            elif high < len(by_length) and fits(
                by_length[high].length, count, real + by_length[high].length
            ):
                longest = by_length[high].length
                real += longest
                high += 1
            else:
                break
        return by_length[low:high]

    def _resume(self, request: EncodeRequest) -> None:
        """Nothing is set aside: a request's vectors go out once, at its end."""

    def _cancel(self, request: EncodeRequest) -> None:
        self._pending = [item for item in self._pending if item.request is not request]
        self._release(request)

    def _holding(self) -> Iterable[EncodeRequest]:
        return dict.fromkeys([*self._waiting, *(item.request for item in self._pending)])

"""The encoder's step loop (backends/encoder/step_loop.py) over a stand-in model whose
`encode` records each batch and can be held: batches bucketed by length within the bounds,
concurrent requests in one batch, vectors back in order and normalized when asked, a
cancelled request's inputs out of the next batch, and a batch the engine refuses failing
only its own requests. The real model's equality is the real-model tier's
(tests/realmodel/test_embeddings.py)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from inferwire.backends.encoder.step_loop import EncoderStepLoop
from inferwire.core.tracing import NO_TRACER


class StandInModel:
    """`encode` gives each row [length, first id] and records the batch's rows; while
    `hold` is clear, a batch waits for it (so that requests pile up behind it)."""

    def __init__(self) -> None:
        self.batches: list[list[list[int]]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()
        self.refuse_first_id: int | None = None

    def encode(self, batch: list[list[int]]) -> np.ndarray:
        self.batches.append([list(ids) for ids in batch])
        self.entered.set()
        self.hold.wait(timeout=30)
        if any(ids[0] == self.refuse_first_id for ids in batch):
            raise RuntimeError("the engine refused this batch")
        return np.array([[float(len(ids)), float(ids[0])] for ids in batch], dtype=np.float32)


@dataclass
class Progress:
    tracer: Any = NO_TRACER
    batch_sizes: list[int] = field(default_factory=list)

    def counted(self, prompt_tokens: int | None = None, completion_tokens: int | None = None):
        pass

    def batched(self, inputs: int) -> None:
        self.batch_sizes.append(inputs)

    # TokenTally's side (never called for an encoder).
    def first_token(self) -> None:
        pass

    def generated_after_cancel(self) -> None:
        pass


@pytest.fixture
async def model_and_loop():
    model = StandInModel()
    loop = EncoderStepLoop(model, "stand-in", max_inputs=4, max_tokens=64)  # type: ignore[arg-type]
    loop.start()
    try:
        yield model, loop
    finally:
        model.hold.set()
        await asyncio.to_thread(loop.close)


async def _entered(model: StandInModel) -> None:
    assert await asyncio.to_thread(model.entered.wait, 30), "no batch started"


async def _inbox_holds(loop: EncoderStepLoop, commands: int) -> None:
    """Wait (bounded) until the thread's inbox holds `commands` commands it has not read."""
    for _ in range(1000):
        if len(loop._inbox) >= commands:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the inbox never held {commands} commands")


async def test_concurrent_requests_share_batches_bounded_and_bucketed(model_and_loop):
    model, loop = model_and_loop
    model.hold.clear()
    blocker = asyncio.create_task(loop.run([[1, 1]], False, Progress()))
    await _entered(model)
    # While the first batch runs, three requests arrive: short and long inputs mixed.
    progresses = [Progress() for _ in range(3)]
    inputs = [
        [[2] * 3, [3] * 30, [4] * 4],
        [[5] * 31, [6] * 2],
        [[7] * 5],
    ]
    tasks = [
        asyncio.create_task(loop.run(ids, False, p))
        for ids, p in zip(inputs, progresses, strict=True)
    ]
    await asyncio.sleep(0)  # each reached the inbox before the first batch ends
    await _inbox_holds(loop, 3)  # each arrived while the first batch runs
    model.hold.set()
    await blocker
    results = await asyncio.gather(*tasks)
    # In order, each its own row.
    for ids, vectors in zip(inputs, results, strict=True):
        assert [list(v) for v in vectors] == [[float(len(i)), float(i[0])] for i in ids]
    later = model.batches[1:]
    assert sum(len(b) for b in later) == 6
    for batch in later:
        longest = max(len(ids) for ids in batch)
        assert len(batch) <= 4 and len(batch) * longest <= 64
    # Bucketed by length: the four short inputs of three requests ran together, the two
    # long ones (of two requests) together.
    assert sorted(sorted(ids[0] for ids in b) for b in later) == [[2, 4, 6, 7], [3, 5]]
    assert any(size > 1 for p in progresses for size in p.batch_sizes)


async def test_inputs_far_apart_in_length_do_not_share_a_batch():
    model = StandInModel()
    loop = EncoderStepLoop(model, "stand-in", max_inputs=32, max_tokens=4096)  # type: ignore[arg-type]
    loop.start()
    try:
        model.hold.clear()
        blocker = asyncio.create_task(loop.run([[1]], False, Progress()))
        await _entered(model)
        # 2 and 100 tokens: padded together, 200 tokens for 102 (over PAD_SLACK x 102 +
        # PAD_TOKENS), though within the bounds; 2 and 5 go together (10 for 7).
        inputs = ([2] * 2, [3] * 100, [4] * 5)
        tasks = [asyncio.create_task(loop.run([ids], False, Progress())) for ids in inputs]
        await _inbox_holds(loop, 3)
        model.hold.set()
        await asyncio.gather(blocker, *tasks)
        assert sorted(sorted(ids[0] for ids in b) for b in model.batches[1:]) == [[2, 4], [3]]
    finally:
        model.hold.set()
        await asyncio.to_thread(loop.close)


async def test_vectors_are_normalized_when_asked(model_and_loop):
    _, loop = model_and_loop
    (vector,) = await loop.run([[4, 3]], True, Progress())  # [2, 4] before
    assert np.allclose(np.array(vector), np.array([2.0, 4.0]) / np.sqrt(20.0))


async def test_a_cancelled_requests_inputs_leave_the_next_batch(model_and_loop):
    model, loop = model_and_loop
    model.hold.clear()
    blocker = asyncio.create_task(loop.run([[1]], False, Progress()))
    await _entered(model)
    cancelled = asyncio.create_task(loop.run([[8, 8], [8, 8, 8]], False, Progress()))
    kept = asyncio.create_task(loop.run([[9, 9]], False, Progress()))
    await _inbox_holds(loop, 2)
    cancelled.cancel()
    await _inbox_holds(loop, 3)  # the cancel, sent before the first batch ends
    model.hold.set()
    with pytest.raises(asyncio.CancelledError):
        await cancelled  # returns once the thread holds none of its inputs
    await blocker
    assert [list(v) for v in await kept] == [[2.0, 9.0]]
    assert all(ids[0] != 8 for batch in model.batches for ids in batch)


async def test_a_refused_batch_fails_only_its_requests(model_and_loop):
    model, loop = model_and_loop
    model.refuse_first_id = 66
    with pytest.raises(RuntimeError, match="refused"):
        await loop.run([[66, 1]], False, Progress())
    assert [list(v) for v in await loop.run([[5, 1, 1]], False, Progress())] == [[3.0, 5.0]]
    assert loop.alive

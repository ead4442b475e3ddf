"""What one decode step computes: every running request's next token, then prompt chunks
in the room left, read first come first served, and the rows in slot order.

- A running request (its prompt read) puts its next token in every step it is not
  paused, so output never waits for prompts.
- Prompts share at most `prefill_tokens` rows a step, the earliest seated first. When a
  wave of prompts arrives at once (a closed loop's requests end together), the first
  gets its first token after its own prompt instead of after the whole wave's: on
  SmolLM2 at 8 concurrent chats, time to first token p50 went from 11.4 s (the whole
  wave in one step) to 4.5-6.3 s at 256 rows, tokens/s within the noise (docs/llama_cpp.md).
- Rows go in slot order. With a KV stream per slot, llama.cpp puts only sequences of
  consecutive ids in one micro-batch (`split_equal`, sequential); rows ordered 3, 1, 2
  would be computed as two passes over the weights instead of one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple


class Runner(NamedTuple):
    """A request on a slot, as the plan sees it."""

    seq_id: int  # its slot's KV stream
    seated: int  # when it took the slot (smaller: earlier)
    pending: int  # prompt tokens still to read; 0: it decodes its next token


def plan_step(
    runners: Iterable[Runner], batch_tokens: int, prefill_tokens: int
) -> list[tuple[int, int]]:
    """`(seq_id, tokens)` of each runner in the step, in slot order; `batch_tokens` must
    be at least the number of runners decoding."""
    everyone = list(runners)
    counts = {r.seq_id: 1 for r in everyone if r.pending == 0}
    room = min(batch_tokens - len(counts), prefill_tokens)
    for runner in sorted((r for r in everyone if r.pending), key=lambda r: r.seated):
        if room <= 0:
            break
        counts[runner.seq_id] = taken = min(runner.pending, room)
        room -= taken
    return sorted(counts.items())

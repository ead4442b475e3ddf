"""What continuous/loop.py keeps for each request and each KV row (its module docstring
says how they move), and how it picks the slot a new request is read into."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import groupby

import llguidance
from tokenizers.decoders import DecodeStream

from inferwire.backends.ort_genai.continuous.sampler import RowSampler
from inferwire.backends.threaded.shared_thread import SharedThreadRequest
from inferwire.core.prefix import shared_prefix
from inferwire.core.prepared import PreparedRequest
from inferwire.core.results import TokenLogprob

SLOT_SIMILARITY = 0.1  # as the llama-cpp backend's (llama-server's --slot-prompt-similarity)
SlotKey = tuple[str, int]  # a slot's adapter and kernels: whose requests its cache serves


@dataclass(frozen=True)
class RowSetup:
    """What a request brings besides its prompt: its constraint's matcher, compiled before
    it is sent (a grammar that does not compile is refused first), and its adapter."""

    matcher: llguidance.LLMatcher | None = None
    adapter: str = ""  # "" for the base model
    constraint_field: str = ""


ContinuousRequest = PreparedRequest[RowSetup]


@dataclass(eq=False)
class Slot:
    """A row of the KV buffers and the tokens it holds: a request's, or a free slot's cache."""

    row: int  # its row in the KV buffers (changes as slots are packed)
    tokens: list[int] = field(default_factory=list)  # what its KV holds, in order
    # How many first tokens were read as a prompt is (in chunks of two or more from the
    # start): their KV is bit for bit what a request reading them afresh computes.
    exact: int = 0
    adapter: str = ""  # under which adapter those tokens were read
    kernels: int = 0  # the decoder holding its KV (an index of loop.py's `_decoders`)
    job: Job | None = None
    last_used: int = 0


@dataclass(eq=False, kw_only=True)
class Job(SharedThreadRequest):
    """A request in the loop: its sampler, its text so far and its slot once seated."""

    prepared: ContinuousRequest
    sampler: RowSampler
    detokenizer: DecodeStream
    slot: Slot | None = None
    pending: list[int] = field(default_factory=list)  # prompt tokens still to read
    next_token: int = -1  # chosen, not yet in the KV
    hand_off: bool = False  # read on OpenVINO's kernels, to step on ONNX Runtime's if alone
    held: list[TokenLogprob] = field(default_factory=list)  # logprobs awaiting their text


@dataclass(frozen=True)
class LoopShape:
    slots: int
    slot_tokens: int
    prefill_tokens: int  # the most prompt tokens one iteration reads
    name: str  # the model's, for the thread's name
    stream_interval_s: float
    batch_invariant: bool = False  # every request as a seeded one (loop.py's `_exact`)


def live_prefix(decoding: list[Slot], prompt: list[int], key: SlotKey) -> tuple[Slot | None, int]:
    """The decoding slot holding the longest prefix of `prompt` read as a prompt (under
    the same adapter, on the same kernels), and its length: the n choices of one request,
    or requests that share a long system prompt, read it once."""
    best: tuple[Slot | None, int] = (None, 0)
    for slot in decoding:
        if (slot.adapter, slot.kernels) == key and slot.exact > best[1]:
            shared = shared_prefix(slot.tokens[: slot.exact], prompt)
            if shared > best[1]:
                best = (slot, shared)
    return best


def cache_holder(
    free: list[Slot], prompt: list[int], key: SlotKey, reuse: bool
) -> tuple[Slot, int]:
    """The free slot whose cache `prompt` continues furthest (more than SLOT_SIMILARITY of
    it, else the least recently used: llama-server's choice), and how far."""
    least_used = min(free, key=lambda s: s.last_used)
    if not reuse:
        return least_used, 0

    def shared_with(slot: Slot) -> int:  # only a slot of the same adapter and kernels
        return shared_prefix(slot.tokens, prompt) if (slot.adapter, slot.kernels) == key else 0

    shared, slot = max(((shared_with(s), s) for s in free), key=lambda p: (p[0], -p[1].last_used))
    if shared <= SLOT_SIMILARITY * len(prompt):
        slot = least_used
        shared = shared_with(slot)
    return slot, shared


def row_stretches(slots: list[Slot]) -> list[tuple[int, int, str, int]]:
    """The runs of consecutive rows under the same adapter on the same kernels, as
    (start, stop, adapter, kernels): a decode step runs each on its own."""
    stretches, start = [], 0
    for (adapter, kernels), run in groupby(slots, key=lambda slot: (slot.adapter, slot.kernels)):
        stop = start + len(list(run))
        stretches.append((start, stop, adapter, kernels))
        start = stop
    return stretches

"""Conversations saved from the slots to host memory, so that more conversations than
there are slots keep their KV cache (llama-server's `--cache-ram`, 8 GiB by default there).

A slot about to be given to a request that would drop most of what it holds saves it first
(its KV stream's state, `llama_state_seq_get_data`). A request whose prompt a saved
conversation continues further than the chosen slot's own cache does gets that
conversation restored into the slot (`llama_state_seq_set_data`) and reads only the rest.
The store is bounded in bytes and evicts the oldest first; a restored entry leaves it (it
is in a slot again, and is saved again when that slot is given away).

Without it, 32 slots and a closed loop over 48 conversations evict each other in a ring:
every conversation's next turn finds its cache overwritten and reads its whole history.
"""

from __future__ import annotations

import collections
import ctypes
from dataclasses import dataclass

import llama_cpp as llama

from inferwire.core.kv_blocks import BlockLedger
from inferwire.core.prefix import shared_prefix

# A saved conversation is restored only when the prompt keeps at least this share of it:
# restoring trims the rest, and a long conversation is not given up for a short match.
MIN_KEPT_SHARE = 0.25


@dataclass(eq=False)
class SavedPrompt:
    tokens: list[int]
    state: ctypes.Array[ctypes.c_uint8]

    @property
    def size(self) -> int:
        return len(self.state)


class SavedPrompts:
    """Saved conversations, oldest first, at most `limit_bytes` of KV state in all."""

    def __init__(
        self, context: llama.llama_context_p, limit_bytes: int, blocks: BlockLedger | None = None
    ) -> None:
        """`blocks`: where saved conversations are reported (KV events); a restored one is
        the slot's to report, then forgotten here (`forget`)."""
        self._context = context
        self.blocks = blocks
        self.limit_bytes = limit_bytes
        self._entries: collections.OrderedDict[int, SavedPrompt] = collections.OrderedDict()
        self.bytes = 0
        self.saved_total = 0
        self.restored_total = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        return sum(len(entry.tokens) for entry in self._entries.values())

    def save(self, seq_id: int, tokens: list[int]) -> bool:
        """Copy sequence `seq_id`'s state, which holds `tokens`; False if it cannot fit."""
        size = llama.llama_state_seq_get_size(self._context, seq_id)
        if not tokens or size > self.limit_bytes:
            return False
        while self.bytes + size > self.limit_bytes:
            _, oldest = self._entries.popitem(last=False)
            self.bytes -= oldest.size
            self.forget(oldest)
        state = read_sequence(self._context, seq_id, size)
        if state is None:
            return False
        entry = SavedPrompt(list(tokens), state)
        self._entries[id(entry)] = entry
        self.bytes += size
        self.saved_total += 1
        if self.blocks is not None:
            self.blocks.held(entry, entry.tokens)
        return True

    def forget(self, entry: SavedPrompt) -> None:
        """`entry`'s blocks are no longer held here (evicted, or restored into a slot)."""
        if self.blocks is not None:
            self.blocks.held(entry, [])

    def best(self, prompt: list[int], better_than: int) -> SavedPrompt | None:
        """The entry sharing the longest prefix with `prompt`, if longer than `better_than`
        tokens and at least MIN_KEPT_SHARE of the entry."""
        found, found_shared = None, better_than
        for entry in self._entries.values():
            shared = shared_prefix(entry.tokens, prompt)
            if shared > found_shared and shared >= MIN_KEPT_SHARE * len(entry.tokens):
                found, found_shared = entry, shared
        return found

    def restore(self, entry: SavedPrompt, seq_id: int) -> bool:
        """Put `entry` into sequence `seq_id` (cleared first) and drop it from the store;
        False (the sequence left empty) if llama.cpp refused the state."""
        del self._entries[id(entry)]
        self.bytes -= entry.size
        if not write_sequence(self._context, seq_id, entry.state):
            return False
        self.restored_total += 1
        return True


def read_sequence(
    context: llama.llama_context_p, seq_id: int, size: int | None = None
) -> ctypes.Array[ctypes.c_uint8] | None:
    """A copy of sequence `seq_id`'s KV state (None if llama.cpp gave less than it said)."""
    if size is None:
        size = llama.llama_state_seq_get_size(context, seq_id)
    state = (ctypes.c_uint8 * size)()
    if llama.llama_state_seq_get_data(context, state, size, seq_id) != size:
        return None
    return state


def write_sequence(
    context: llama.llama_context_p, seq_id: int, state: ctypes.Array[ctypes.c_uint8]
) -> bool:
    """Replace sequence `seq_id`'s KV with `state`; False (the sequence left empty) if
    llama.cpp refused it."""
    memory = llama.llama_get_memory(context)
    llama.llama_memory_seq_rm(memory, seq_id, -1, -1)
    if llama.llama_state_seq_set_data(context, state, len(state), seq_id) != len(state):
        llama.llama_memory_seq_rm(memory, seq_id, -1, -1)
        return False
    return True

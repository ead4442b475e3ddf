"""A model's prefix cache as fixed-size token blocks, for KV events (`server.kv_events`).

A backend whose engine keeps prompts' KV (the continuous path's free slots) tells its
ledger what each holder of KV now holds (`held`: a slot and its tokens), and that it
holds nothing any more (`clear`, on unload). The ledger cuts each holder's tokens into
blocks of `block_size` (the last partial block is not a block), names each block by a
hash chained on its parent's, counts holders per block, and reports blocks whose first
holder came (stored) or whose last holder went (removed), in vLLM's event vocabulary:
`BlockStored` (a run of new blocks, its parent's hash and their tokens), `BlockRemoved`
and `AllBlocksCleared`. The sink publishes them (kv_events/publisher.py); a block is
reported once however many slots hold it, so a subscriber's index is the union of the
slots' caches.

A hash is 64 bits of BLAKE2b over the parent's hash, the adapter's name and the block's
token ids: the same tokens after the same prefix under the same weights, the same block.
llm-d's indexer keys its own blocks on the token ids it is sent (its block size may
differ) and keeps these hashes only to match removals and parents.
"""

from __future__ import annotations

import hashlib
import re
import string
import threading
from array import array
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

BLOCK_SIZE = 16  # vLLM's default, and llm-d's canonical block size


@dataclass(frozen=True)
class BlockStored:
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_name: str | None = None  # the adapter the blocks were computed under


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


BlockEvent = BlockStored | BlockRemoved | AllBlocksCleared
BlockSink = Callable[[list[BlockEvent]], None]  # one batch of a model's events, in order


def block_hashes(tokens: Sequence[int], adapter: str, block_size: int) -> list[int]:
    """The chained hashes of the full blocks of `tokens` (never 0: llm-d reads a parent
    of 0 as none)."""
    hashes: list[int] = []
    parent = b"\0" * 8
    salt = adapter.encode()
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = array("I", tokens[start : start + block_size]).tobytes()
        digest = hashlib.blake2b(parent + salt + block, digest_size=8).digest()
        hashes.append(int.from_bytes(digest, "big") or 1)
        parent = digest
    return hashes


class BlockLedger:
    """One model's blocks and who holds them; reports changes to `sink`. Thread-safe (a
    step loop's thread reports, unload clears)."""

    def __init__(self, sink: BlockSink, block_size: int = BLOCK_SIZE) -> None:
        self._sink, self.block_size = sink, block_size
        self._lock = threading.Lock()
        self._holders: dict[Hashable, list[int]] = {}  # holder -> its blocks' hashes
        self._counts: dict[int, int] = {}  # hash -> holders
        self._adapters: dict[Hashable, str] = {}  # holder -> the adapter its blocks are of

    def held(
        self,
        holder: Hashable,
        tokens: Sequence[int],
        adapter: str = "",
        adapter_model: str | None = None,
    ) -> None:
        """`holder`'s KV now holds exactly `tokens`, computed under `adapter` (its key in
        the engine; "" for the base weights), the model named `adapter_model`."""
        size = self.block_size
        new = block_hashes(tokens, adapter, size) if len(tokens) >= size else []
        with self._lock:
            old = self._holders.get(holder, [])
            kept = 0
            for mine, theirs in zip(old, new, strict=False):
                if mine != theirs:
                    break
                kept += 1
            if kept == len(old) == len(new):
                return
            gone = [h for h in old[kept:] if self._release(h)]
            first_new = next(
                (i for i in range(kept, len(new)) if self._counts.get(new[i], 0) == 0), None
            )
            for h in new[kept:]:
                self._counts[h] = self._counts.get(h, 0) + 1
            if new:
                self._holders[holder], self._adapters[holder] = new, adapter
            else:
                self._holders.pop(holder, None)
                self._adapters.pop(holder, None)
            events: list[BlockEvent] = []
            if gone:
                events.append(BlockRemoved(tuple(gone)))
            if first_new is not None:
                events.append(
                    BlockStored(
                        tuple(new[first_new:]),
                        new[first_new - 1] if first_new else None,
                        tuple(tokens[first_new * size : len(new) * size]),
                        size,
                        adapter_model or None,
                    )
                )
            if events:
                self._sink(events)

    def swap(self, one: Hashable, other: Hashable) -> None:
        """`one` and `other` traded what they hold (a cache moved between slots): nothing
        is stored or removed; a `held` after says what a failed move lost."""
        with self._lock:
            mine, theirs = self._holders.pop(one, None), self._holders.pop(other, None)
            adapters = self._adapters.pop(one, ""), self._adapters.pop(other, "")
            if theirs:
                self._holders[one], self._adapters[one] = theirs, adapters[1]
            if mine:
                self._holders[other], self._adapters[other] = mine, adapters[0]

    def drop(self, adapter: str) -> None:
        """The blocks computed under `adapter` are gone (the adapter unloaded: a cache of
        its weights is never used again)."""
        with self._lock:
            holders = [h for h, of in self._adapters.items() if of == adapter]
            gone = []
            for holder in holders:
                del self._adapters[holder]
                gone += [b for b in self._holders.pop(holder) if self._release(b)]
            if gone:
                self._sink([BlockRemoved(tuple(gone))])

    def clear(self) -> None:
        """Every block is gone (the model unloaded): reported once, however many."""
        with self._lock:
            had = bool(self._counts)
            self._holders.clear()
            self._counts.clear()
            self._adapters.clear()
            if had:
                self._sink([AllBlocksCleared()])

    def _release(self, block: int) -> bool:
        """One holder fewer; whether it was the last."""
        left = self._counts[block] - 1
        if left:
            self._counts[block] = left
            return False
        del self._counts[block]
        return True


_ADDRESS = re.compile(r"tcp://\S+:(\d+|\*)|ipc://\S+|inproc://\S+")
TOPIC_FIELDS = ("host", "model")


class KvEventsSettings(BaseModel):
    """Where models' KV cache blocks are published (vLLM's `KVEventBatch` over ZeroMQ),
    for llm-d's precise prefix-cache scorer; off unless `endpoint` is set."""

    model_config = ConfigDict(extra="forbid")

    endpoint: str | None = None
    """ZeroMQ address the PUB socket binds (`tcp://*:5557`, `ipc:///run/kv.sock`); unset
    (the default): no events are published and nothing is bound."""
    replay_endpoint: str | None = None
    """ZeroMQ address a ROUTER socket binds to answer a subscriber's catch-up (a sequence
    number, answered with the buffered batches from it on, then an end marker); unset:
    none."""
    topic: str = "kv@{host}@{model}"
    """Each model's topic: `{host}` is this machine's host name, `{model}` the model's
    name. llm-d reads `kv@<pod>@<model>`, where <pod> is how it names the replica."""
    buffer_batches: int = Field(default=10000, ge=1)
    """How many recent batches the replay socket keeps."""

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _zmq_address(cls, address: str | None) -> str | None:
        if address is not None and not _ADDRESS.fullmatch(address):
            raise ValueError(
                f"{address!r} is not a ZeroMQ address (tcp://host:port, ipc://path, inproc://name)"
            )
        return address

    @field_validator("topic")
    @classmethod
    def _topic_fields(cls, topic: str) -> str:
        try:
            names = {name for _, name, _, _ in string.Formatter().parse(topic) if name}
        except ValueError as exc:
            raise ValueError(f"{topic!r}: {exc}") from None
        if unknown := names - set(TOPIC_FIELDS):
            raise ValueError(f"unknown field {{{min(unknown)}}}; it takes {{host}} and {{model}}")
        return topic

    @model_validator(mode="after")
    def _replay_beside_events(self) -> KvEventsSettings:
        if self.replay_endpoint is not None:
            if self.endpoint is None:
                raise ValueError("replay_endpoint: set without endpoint, which turns events on")
            if self.replay_endpoint == self.endpoint and not self.endpoint.endswith(":*"):
                raise ValueError("replay_endpoint: the same address as endpoint")
        return self

    def topic_of(self, host: str, model: str) -> str:
        return self.topic.format(host=host, model=model)

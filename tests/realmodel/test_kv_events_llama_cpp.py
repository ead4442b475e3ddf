"""KV events from the llama-cpp backend on SmolLM2's Q4_1 GGUF, read by a real ZeroMQ SUB
(tests/engine/test_kv_events.py's reader): one slot, so a second conversation takes it
and the first is saved to host memory (its blocks stay published, none removed); the
first conversation's next turn gets it back and stores only blocks continuing it, and
the index then covers that turn's whole prompt; unloading clears all."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import zmq

from inferwire.server import InferwireServer
from tests.engine.test_kv_events import (
    BLOCK,
    MESSAGES,
    Subscriber,
    chains,
    kv_server,
    post,
    subscribed,
)
from tests.realmodel.test_llama_cpp_backend import Q4_1, require_llama_cpp_and_q4_1

OTHER = [{"role": "user", "content": "List three fruits and say which one grows on trees."}]


@pytest.fixture(scope="module")
async def served() -> AsyncIterator[InferwireServer]:
    require_llama_cpp_and_q4_1()
    options = {"path": Q4_1, "slot_tokens": 512}
    model = {"name": "smollm2-llama", "backend": "llama-cpp", "load_on_startup": True}
    server = kv_server([{**model, "max_concurrency": 1, "options": options}])
    await server.start()
    yield server
    await server.stop(grace_s=1)


async def test_a_saved_conversation_keeps_its_blocks_and_its_next_turn_continues_them(served):
    model = "smollm2-llama"
    assert served.kv_events is not None
    context: zmq.Context[Any] = zmq.Context()
    subscriber = Subscriber(context, served.kv_events.endpoint)
    try:
        await subscribed(served, model, subscriber)
        body = {"model": model, "messages": MESSAGES, "max_tokens": 8}
        prompt = (await post(served, "/v1/chat/completions/render", body))["token_ids"]
        full = prompt[: len(prompt) // BLOCK * BLOCK]
        answer = await post(served, "/v1/chat/completions", body)
        assert answer["usage"]["prompt_tokens"] == len(prompt)
        events = await asyncio.to_thread(
            subscriber.events_until,
            lambda seen: full in chains([e for e in seen if e[0] == "BlockStored"]),
        )
        stored = [e for e in events if e[0] == "BlockStored"]
        first = {h for e in stored for h in e[1]}

        # Another conversation takes the only slot: the first is saved, its blocks kept.
        await post(served, "/v1/chat/completions", {**body, "messages": OTHER})
        events += await asyncio.to_thread(
            subscriber.events_until, lambda seen: any(e[0] == "BlockStored" for e in seen)
        )
        removed = {h for e in events if e[0] == "BlockRemoved" for h in e[1]}
        assert removed.isdisjoint(first)

        turn = [*MESSAGES, answer["choices"][0]["message"], {"role": "user", "content": "And?"}]
        later = await post(served, "/v1/chat/completions/render", {**body, "messages": turn})
        nxt = later["token_ids"][: len(later["token_ids"]) // BLOCK * BLOCK]
        await post(served, "/v1/chat/completions", {**body, "messages": turn})
        stored = [e for e in events if e[0] == "BlockStored"]
        more = await asyncio.to_thread(
            subscriber.events_until,
            lambda seen: nxt in chains(stored + [e for e in seen if e[0] == "BlockStored"]),
        )
        again = [e for e in more if e[0] == "BlockStored"]
        # Restored from host memory: no block of its history is stored again, no new root.
        assert all(e[2] is not None and set(e[1]).isdisjoint(first) for e in again)

        await served.manager.unload(model)
        cleared = await asyncio.to_thread(
            subscriber.events_until, lambda seen: any(e[0] == "AllBlocksCleared" for e in seen)
        )
        assert cleared[-1] == ["AllBlocksCleared"]
    finally:
        subscriber.socket.close()
        context.term()

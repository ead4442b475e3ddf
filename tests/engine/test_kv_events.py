"""KV events on a real server of the bundled model (the continuous path, the CPU default),
read by real ZeroMQ sockets as llm-d's subscriber reads them: a SUB on
`server.kv_events.endpoint` and a DEALER on `replay_endpoint`.

- a chat's prompt yields `BlockStored` batches whose token ids, run after run, are the
  full 16-token blocks of the prompt `/v1/chat/completions/render` gives, each run's
  parent the previous run's last block;
- the conversation's next turn stores only what follows the blocks it shares;
- the replay socket answers sequence 0 with every batch sent so far, the same bytes, then
  the end marker;
- unloading the model yields `AllBlocksCleared`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgpack
import pytest
import zmq

from inferwire.config import load_settings
from inferwire.model_config import default_models
from inferwire.server import InferwireServer

BLOCK = 16
END = 2**64 - 1
MESSAGES = [
    {"role": "system", "content": "You are a player in a company of travelling actors."},
    {"role": "user", "content": "Good morrow! What news from the court of the king today?"},
]
WARM_UP = "Once upon a time there was a king who had three daughters and one small kingdom"


def kv_server(models: list[dict[str, Any]], **kv_events: str) -> InferwireServer:
    """A server of `models` on loopback ports of its own, publishing KV events."""
    server = {"address": "127.0.0.1:0", "http_address": "127.0.0.1:0", "metrics_address": ""}
    kv = {"endpoint": "tcp://127.0.0.1:*", **kv_events}
    return InferwireServer(
        load_settings(server={**server, "grace_period_s": 1, "kv_events": kv}, models=models)
    )


@pytest.fixture(scope="module")
async def served() -> AsyncIterator[InferwireServer]:
    model = {"name": "demo", "load_on_startup": True, "max_concurrency": 2}
    adapter = {"name": "demo-sonnets", "adapter_of": "demo", "load_on_startup": True}
    adapter["options"] = {"adapter_file": default_models()[1].options["adapter_file"]}
    server = kv_server([model, adapter], replay_endpoint="tcp://127.0.0.1:*")
    await server.start()
    yield server
    await server.stop(grace_s=1)


class Subscriber:
    """A SUB socket on the server's events, decoding each batch as llm-d does."""

    def __init__(self, context: zmq.Context[Any], endpoint: str) -> None:
        self.socket = context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(endpoint)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"kv@")
        self.received: list[tuple[bytes, int, bytes]] = []

    def next(self, timeout_s: float = 30) -> tuple[bytes, int, list[list[Any]]] | None:
        if not self.socket.poll(int(timeout_s * 1000)):
            return None
        topic, sequence, payload = self.socket.recv_multipart()
        self.received.append((topic, int.from_bytes(sequence, "big"), payload))
        ts, events, rank = msgpack.unpackb(payload)
        assert rank is None  # data_parallel_rank: none
        assert isinstance(ts, float) and len(sequence) == 8
        return topic, int.from_bytes(sequence, "big"), events

    def events_until(self, done: Any, timeout_s: float = 60) -> list[list[Any]]:
        """Events, in order, until `done(events so far)` (each wait bounded)."""
        seen: list[list[Any]] = []
        while not done(seen):
            batch = self.next(timeout_s)
            assert batch is not None, f"no event batch within {timeout_s} s; had {seen}"
            seen += batch[2]
        return seen


def chains(stored: list[list[Any]]) -> list[list[int]]:
    """The token ids from the root through each stored block, as llm-d's index links them."""
    paths: dict[int, list[int]] = {}
    for _, hashes, parent, tokens, *_ in stored:
        path = paths[parent] if parent is not None else []
        for index, block in enumerate(hashes):
            path = path + tokens[index * BLOCK : (index + 1) * BLOCK]
            paths[block] = path
    return list(paths.values())


def stored_tokens(events: list[list[Any]]) -> list[int]:
    return [t for e in events if e[0] == "BlockStored" for t in e[3]]


async def post(server: InferwireServer, path: str, body: dict[str, Any]) -> Any:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as client:
        reply = await client.post(path, json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


async def subscribed(server: InferwireServer, model: str, subscriber: Subscriber) -> None:
    """Once the SUB receives: it sees nothing sent before its subscription reached the PUB
    (ZeroMQ's slow joiner), so prompts of two blocks go until one batch arrives."""
    for attempt in range(20):
        prompt = f"{WARM_UP} {attempt}"
        await post(server, "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 1})
        if await asyncio.to_thread(subscriber.next, 2) is not None:
            break
    else:
        pytest.fail("the SUB socket never received a batch")
    while await asyncio.to_thread(subscriber.next, 1) is not None:
        pass  # the warm-ups' remaining batches


async def test_an_adapter_s_blocks_are_its_own_named_by_its_model(served):
    assert served.kv_events is not None
    context: zmq.Context[Any] = zmq.Context()
    subscriber = Subscriber(context, served.kv_events.endpoint)
    try:
        await subscribed(served, "demo", subscriber)
        prompt = "The sonnets of the youngest daughter were sung in every hall of the land"
        for model in ("demo", "demo-sonnets"):
            body = {"model": model, "prompt": prompt, "max_tokens": 1}
            await post(served, "/v1/completions", body)
        [rendered] = await post(served, "/v1/completions/render", body)
        full = rendered["token_ids"][: len(rendered["token_ids"]) // BLOCK * BLOCK]

        def adapted(seen: list[list[Any]]) -> list[list[Any]]:
            return [e for e in seen if e[0] == "BlockStored" and e[7:8] == ["demo-sonnets"]]

        events = await asyncio.to_thread(
            subscriber.events_until, lambda seen: full in chains(adapted(seen))
        )
        base = {h for e in events if e[0] == "BlockStored" and len(e) <= 5 for h in e[1]}
        own = {h for e in adapted(events) for h in e[1]}
        assert base and base.isdisjoint(own)

        # Unloaded, the adapter's blocks are removed (its caches are never read again).
        await served.manager.unload("demo-sonnets")
        removed = await asyncio.to_thread(
            subscriber.events_until,
            lambda seen: own <= {h for e in seen if e[0] == "BlockRemoved" for h in e[1]},
        )
        assert base.isdisjoint(h for e in removed if e[0] == "BlockRemoved" for h in e[1])
        await served.manager.load("demo-sonnets")
    finally:
        subscriber.socket.close()
        context.term()


async def test_blocks_stored_replayed_and_cleared(served):
    publisher = served.kv_events
    assert publisher is not None and publisher.replay_endpoint is not None
    context: zmq.Context[Any] = zmq.Context()
    subscriber = Subscriber(context, publisher.endpoint)
    try:
        await subscribed(served, "demo", subscriber)

        body = {"model": "demo", "messages": MESSAGES}
        prompt = (await post(served, "/v1/chat/completions/render", body))["token_ids"]
        full = len(prompt) // BLOCK * BLOCK
        assert full >= 2 * BLOCK
        answer = await post(
            served, "/v1/chat/completions", {**body, "max_tokens": 8, "temperature": 0}
        )
        assert answer["usage"]["prompt_tokens"] == len(prompt)
        events = await asyncio.to_thread(
            subscriber.events_until, lambda seen: len(stored_tokens(seen)) >= full
        )
        stored = [e for e in events if e[0] == "BlockStored"]
        assert stored_tokens(stored)[:full] == prompt[:full]
        assert stored[0][2] is None  # the conversation's first block has no parent
        for before, after in itertools.pairwise(stored):
            assert after[2] == before[1][-1]  # each run continues the one before
        for event in stored:
            assert event[4] == BLOCK and len(event[3]) == BLOCK * len(event[1])
        first_turn = {h for e in stored for h in e[1]}

        # The next turn: the blocks it shares are held already; what it stores continues
        # them, and the index then holds every full block of its prompt from the root.
        turn = [*MESSAGES, answer["choices"][0]["message"], {"role": "user", "content": "And?"}]
        later = await post(served, "/v1/chat/completions/render", {**body, "messages": turn})
        nxt = later["token_ids"][: len(later["token_ids"]) // BLOCK * BLOCK]
        await post(served, "/v1/chat/completions", {**body, "messages": turn, "max_tokens": 4})
        more = await asyncio.to_thread(
            subscriber.events_until,
            lambda seen: nxt in chains(stored + [e for e in seen if e[0] == "BlockStored"]),
        )
        again = [e for e in more if e[0] == "BlockStored"]
        held = set(first_turn)
        for event in again:  # each run continues a block held already: none is a new root
            assert event[2] in held
            held |= set(event[1])

        # The replay socket: every batch from sequence 0, the same bytes, then the end.
        replayed = await asyncio.to_thread(replay, context, publisher.replay_endpoint, 0)
        sent = {sequence: (topic, payload) for topic, sequence, payload in subscriber.received}
        assert [s for s, _, _ in replayed] == list(range(len(replayed)))
        assert sent and max(sent) < len(replayed)
        for sequence, topic, payload in replayed:
            if sequence in sent:
                assert sent[sequence] == (topic, payload)
        assert all(
            topic.startswith(b"kv@") and topic.endswith(b"@demo") for _, topic, _ in replayed
        )
        tail = await asyncio.to_thread(replay, context, publisher.replay_endpoint, max(sent))
        assert [s for s, _, _ in tail] == list(range(max(sent), len(replayed)))

        await served.manager.unload("demo-sonnets")  # an adapter goes before its base
        await served.manager.unload("demo")
        cleared = await asyncio.to_thread(
            subscriber.events_until, lambda seen: any(e[0] == "AllBlocksCleared" for e in seen)
        )
        assert cleared[-1] == ["AllBlocksCleared"]
    finally:
        subscriber.socket.close()
        context.term()


async def test_a_server_that_stops_says_its_blocks_are_cleared():
    server = kv_server([{"name": "demo", "load_on_startup": True}])
    await server.start()
    assert server.kv_events is not None
    context: zmq.Context[Any] = zmq.Context()
    subscriber = Subscriber(context, server.kv_events.endpoint)
    try:
        try:
            await subscribed(server, "demo", subscriber)  # blocks are held now
        finally:
            await server.stop(grace_s=1)
        cleared = await asyncio.to_thread(
            subscriber.events_until, lambda seen: any(e[0] == "AllBlocksCleared" for e in seen)
        )
        assert cleared[-1] == ["AllBlocksCleared"]
    finally:
        subscriber.socket.close()
        context.term()


def replay(context: zmq.Context[Any], endpoint: str, start: int) -> list[tuple[int, bytes, bytes]]:
    """What the replay socket answers a DEALER asking from `start` (llm-d's request)."""
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    try:
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        answered: list[tuple[int, bytes, bytes]] = []
        while True:
            assert dealer.poll(30_000), "the replay socket went quiet before its end marker"
            empty, topic, sequence, payload = dealer.recv_multipart()
            assert empty == b""
            if int.from_bytes(sequence, "big") == END:
                assert topic == payload == b""
                return answered
            answered.append((int.from_bytes(sequence, "big"), topic, payload))
    finally:
        dealer.close()

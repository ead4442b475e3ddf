"""Conversations across replicas (issue 60), with llm-d's real picker scoring three
replicas of the bundled model by the KV blocks they publish (tests/support/kv_routing.py):
several conversations at once, each resending its history, go on where their prefix is;
a replica stopped mid-conversation (SIGTERM to its PID, and the pod gone from the picker's
endpoints file as from an InferencePool) costs only its cache; a restarted picker rebuilds
its index from the replicas' replay sockets (v0.10's `zmqSubscriber.runSubscriber` asks
each publisher's ROUTER for everything from sequence 0 when it connects, "Requesting
proactive replay on connect", pkg/kvevents/zmq_subscriber.go), with no new events.

Which replica served a request is read from the replicas' own access lines (each request
carries an `x-request-id`), not only from the picker's answer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import envoy as envoy_support
from tests.support.kv_routing import (
    ADDRESSES,
    Cluster,
    kv_lines,
    requests_served,
    scored_first,
)
from tests.support.waiting import wait_until

CONVERSATIONS = [
    "the sea", "a castle", "the harvest", "a long winter", "the king's horse", "a feast",
    "a lighthouse", "the river",
]  # fmt: skip
TURNS = 3
FOLLOW_UPS = ["More.", "And then?", "How does it end?"]
CHAT = "/v1/chat/completions"
# Each replica keeps as many prompts' KV as it has slots, and a new conversation takes the
# free slot sharing the longest prefix with it when that is over a tenth of its prompt
# (continuous/loop.py): conversations opening on the same system prompt would take each
# other's slot. Here each opens on its own topic, and a replica has a slot for each.
SLOTS = len(CONVERSATIONS)


def conversation(topic: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": f"{topic.capitalize()}: every story you tell is about it."},
        {"role": "user", "content": f"Tell me a short story about {topic}, in three lines."},
    ]


@pytest.fixture
def cluster(tmp_path: Path, picker_binary: Path) -> Iterator[Cluster]:
    started = Cluster(tmp_path, picker_binary, SLOTS)
    try:
        started.start_replicas()
        started.start_picker()
        yield started
    finally:
        started.close()


async def indexed(
    gateway: envoy_support.Envoy, cluster: Cluster, body: dict[str, Any], holder: str
) -> bool:
    """Whether the picker, asked about `body`, scores every live replica and `holder`
    alone highest (a picker just started may not have scraped them all yet)."""
    live = sum(s.process.poll() is None for s in cluster.servers.values())
    scores = (await gateway.decide(CHAT, body)).scores
    return len(scores) == live and await scored_first(gateway, body, holder)


async def wait_indexed(
    gateway: envoy_support.Envoy, cluster: Cluster, body: dict[str, Any], holder: str
) -> None:
    """Bounded wait until the picker scores `holder` alone highest for `body` (asked, not
    sent): the holder's events for the turn before reached the picker."""
    try:
        await wait_until(
            lambda: indexed(gateway, cluster, body, holder), timeout_s=60, interval_s=0.1
        )
    except AssertionError:
        assert cluster.picker is not None
        scores = (await gateway.decide(CHAT, body)).scores
        raise AssertionError(
            f"never scored {holder} first: {scores}\n{kv_lines(cluster.picker)}"
        ) from None


async def turn(
    gateway: envoy_support.Envoy, cluster: Cluster, body: dict[str, Any], request_id: str
) -> tuple[str, dict[str, Any]]:
    """Send one turn through the gateway; the replica that served it (by its access
    line, which must agree with the picker's choice) and the assistant's message."""
    routed = await gateway.send(CHAT, body, headers={"x-request-id": request_id})
    assert routed.status == 200, routed.body
    answer = json.loads(routed.body)["choices"][0]["message"]
    assert answer["content"], routed.body

    async def logged() -> bool:  # the access line follows the response
        return bool(cluster.served(request_id))

    await wait_until(logged, timeout_s=30, interval_s=0.05)
    (served,) = cluster.served(request_id)
    assert served == routed.endpoint, (served, routed.endpoint)
    print(f"  {request_id}: {served} of {routed.decision.scores}")
    return served, answer


def request(messages: list[dict[str, str]]) -> dict[str, Any]:
    return {"model": "demo", "messages": messages, "max_tokens": 8, "temperature": 0}


async def test_concurrent_conversations_go_on_where_their_prefix_is(cluster: Cluster):
    """Eight conversations begun one by one, then carried on all at once, three turns each,
    every turn resending the history: turns 2 and 3 go to the replica that served the
    turn before (it holds the prefix), by the replicas' own access lines, 90 % at least."""
    later: list[tuple[str, str]] = []  # (holder, served) of each later turn

    async def talk(index: int, first: tuple[str, list[dict[str, str]]]) -> None:
        holder, messages = first
        for number in range(2, TURNS + 1):
            more = {"role": "user", "content": FOLLOW_UPS[number - 2]}
            body = request([*messages, more])
            served, answer = await turn(gateway, cluster, body, f"conv{index}-t{number}")
            later.append((holder, served))
            holder, messages = served, [*body["messages"], answer]

    async with cluster.gateway() as gateway:
        # The first turns one by one, as conversations begin: the load scorers spread them.
        firsts = []
        for index, topic in enumerate(CONVERSATIONS):
            messages = conversation(topic)
            holder, answer = await turn(gateway, cluster, request(messages), f"conv{index}-t1")
            firsts.append((holder, [*messages, answer]))
        assert len({holder for holder, _ in firsts}) > 1, firsts
        # Then every conversation at once, each turn resending the history and sent as
        # soon as the turn before was answered, as a client would (no wait for the
        # picker: the holder's earlier blocks are indexed by then, the last turn's may not).
        await asyncio.gather(*(talk(i, first) for i, first in enumerate(firsts)))
    same = sum(holder == served for holder, served in later)
    print(
        f"\nconcurrent conversations: {same} of {len(later)} later turns on the holder; "
        f"turns per replica: {per_replica(cluster)}"
    )
    assert len(later) == len(CONVERSATIONS) * (TURNS - 1)
    assert same >= 0.9 * len(later), later


def per_replica(cluster: Cluster) -> dict[str, int]:
    """How many conversation turns each replica's access lines name."""
    return {
        endpoint: sum(i.startswith("conv") for i in requests_served(server))
        for endpoint, server in cluster.servers.items()
    }


async def test_a_replica_stopped_mid_conversation_loses_only_its_cache(cluster: Cluster):
    """Conversations on every replica; the holder of one (not the replica the picker
    renders on) is stopped (SIGTERM to its PID, exit 0) and leaves the endpoints file, as
    a deleted pod leaves the InferencePool; that conversation's next turn is served by
    another replica, and the conversations held elsewhere still go where their prefix is."""
    async with cluster.gateway() as gateway:
        holders: dict[str, str] = {}
        bodies: dict[str, dict[str, Any]] = {}
        for index, topic in enumerate(CONVERSATIONS[:6]):
            messages = conversation(topic)
            holder, answer = await turn(gateway, cluster, request(messages), f"stop{index}-t1")
            more = {"role": "user", "content": FOLLOW_UPS[0]}
            holders[topic], bodies[topic] = holder, request([*messages, answer, more])
            await wait_indexed(gateway, cluster, bodies[topic], holder)
        # Not the replica the token-producer renders on (`vllm.url`, one URL): without
        # it the picker tokenizes nothing and scores no prefix on any replica.
        render = f"{ADDRESSES[0]}:{cluster.ports['http']}"
        moved = next((t for t, h in holders.items() if h != render), None)
        assert moved is not None, holders  # the picker spread the first turns: see the print
        victim = holders[moved]
        survivors = [t for t, h in holders.items() if h != victim]

        assert cluster.stop_replica(victim) == 0, cluster.servers[victim].exit_report()
        cluster.write_endpoints([e for e in cluster.servers if e != victim])

        async def forgotten() -> bool:
            return victim not in (await gateway.decide(CHAT, bodies[moved])).scores

        await wait_until(forgotten, timeout_s=60, interval_s=0.1)
        index = CONVERSATIONS.index(moved)
        served, answer = await turn(gateway, cluster, bodies[moved], f"stop{index}-t2")
        assert served != victim and served in cluster.servers
        moved_to, kept = served, 0
        for topic in survivors:
            index = CONVERSATIONS.index(topic)
            served, _ = await turn(gateway, cluster, bodies[topic], f"stop{index}-t2")
            kept += served == holders[topic]
    print(
        f"\nreplica stopped: its conversation's next turn on {moved_to}; "
        f"{kept} of {len(survivors)} conversations held elsewhere kept their replica"
    )
    assert kept == len(survivors), (holders, victim)


async def test_a_restarted_picker_catches_up_from_the_replay_sockets(cluster: Cluster):
    """First turns indexed by one picker; the picker is stopped and started again with no
    request sent meanwhile (no new KV events): on connecting to each replica it asks the
    replay socket for everything from sequence 0, and the second turns of the
    conversations whose blocks the replicas still hold go where those blocks are.

    A replica of the demo model keeps a prompt's KV in the slot that served it until
    another request takes the slot, so of conversations sent one after another each
    replica still holds the last; the old picker's scores just before the restart say
    which those are, and the new one must find the same, from the replay alone."""
    holders: dict[str, str] = {}
    bodies: dict[str, dict[str, Any]] = {}
    async with cluster.gateway() as gateway:
        for index, topic in enumerate(CONVERSATIONS[:6]):
            messages = conversation(topic)
            holder, answer = await turn(gateway, cluster, request(messages), f"replay{index}-t1")
            more = {"role": "user", "content": FOLLOW_UPS[0]}
            holders[topic], bodies[topic] = holder, request([*messages, answer, more])
            await wait_indexed(gateway, cluster, bodies[topic], holder)
        held = [t for t in bodies if await scored_first(gateway, bodies[t], holders[t])]
    assert held, holders
    served_before = {e: len(requests_served(s)) for e, s in cluster.servers.items()}

    cluster.stop_picker()
    picker = cluster.start_picker()

    async def replayed() -> bool:  # logged by each subscriber after its last batch
        return sum('"Replay complete"' in line for line in picker.log_lines) >= len(ADDRESSES)

    await wait_until(replayed, timeout_s=60, interval_s=0.1)
    asked = [line for line in picker.log_lines if "Requesting proactive replay on connect" in line]
    assert len(asked) == len(ADDRESSES), kv_lines(picker)
    landed = 0
    async with cluster.gateway() as gateway:
        for topic in held:
            await wait_indexed(gateway, cluster, bodies[topic], holders[topic])
        # Nothing was served meanwhile: what the new picker knows came from the replay.
        assert {e: len(requests_served(s)) for e, s in cluster.servers.items()} == served_before
        for topic in held:
            index = CONVERSATIONS.index(topic)
            served, _ = await turn(gateway, cluster, bodies[topic], f"replay{index}-t2")
            landed += served == holders[topic]
    print(
        f"\npicker restarted: {len(held)} of {len(bodies)} conversations still held before "
        f"the restart; after it, {landed} of {len(held)} second turns on the holder"
    )
    assert landed == len(held)

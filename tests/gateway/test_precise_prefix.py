"""llm-d's precise prefix-cache scoring on inferwire replicas, with the real picker: its
`token-producer` tokenizes each request through a replica's render route, its
`precise-prefix-cache-producer` subscribes to every replica's KV events (found through the
endpoints, `server.kv_events` on the same ports on each, the replay socket included) and
its `prefix-cache-scorer` scores the replicas by the blocks they hold. Three replicas of
the bundled model on the continuous path; conversations whose second turn resends the
first: once the first turn's blocks reached the picker, the second turn goes to the
replica that holds them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.conftest import ADDRESSES
from tests.support import epp
from tests.support.kv_routing import (
    conversation,
    kv_lines,
    precise_config,
    scored_first,
    start,
)
from tests.support.process import ServerProcess, stop_server_process
from tests.support.waiting import wait_until

TOPICS = ["the sea", "a castle", "the harvest", "a long winter", "the king's horse", "a feast"]


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory, picker_binary: Path
) -> Iterator[tuple[list[ServerProcess], dict[str, int]]]:
    started: list[ServerProcess] = []
    ports: dict[str, int] = {}
    try:
        for index, address in enumerate(ADDRESSES):
            server, ports = start(tmp_path_factory.mktemp(f"pod-{index}"), address, ports)
            started.append(server)
        yield started, ports
    finally:
        for server in started:
            stop_server_process(server)


@pytest.fixture(scope="module")
def picker(
    tmp_path_factory: pytest.TempPathFactory,
    picker_binary: Path,
    replicas: tuple[list[ServerProcess], dict[str, int]],
) -> Iterator[epp.PickerProcess]:
    _, ports = replicas
    pods = {f"pod-{i}": (address, ports["http"]) for i, address in enumerate(ADDRESSES)}
    with epp.running_picker(
        picker_binary,
        tmp_path_factory.mktemp("picker"),
        pods,
        lambda endpoints: precise_config(endpoints, ports),
    ) as process:
        yield process  # conftest's `gateway` asks this picker


async def test_a_second_turn_goes_where_its_first_turn_s_blocks_are(gateway, picker):
    landed: list[tuple[str, str]] = []
    for topic in TOPICS:
        messages = conversation(topic)
        body = {"model": "demo", "messages": messages, "max_tokens": 8, "temperature": 0}
        first = await gateway.send("/v1/chat/completions", body)
        assert first.status == 200, first.body
        answer = json.loads(first.body)["choices"][0]["message"]
        later = {**body, "messages": [*messages, answer, {"role": "user", "content": "More."}]}

        try:
            await wait_until(
                lambda later=later, holder=first.endpoint: scored_first(gateway, later, holder),
                timeout_s=30,
                interval_s=0.1,
            )
        except AssertionError:
            raise AssertionError(
                f"never scored {first.endpoint} first:\n{kv_lines(picker)}"
            ) from None
        second = await gateway.send("/v1/chat/completions", later)
        assert second.status == 200, second.body
        landed.append((first.endpoint, second.endpoint))
    same = sum(first == second for first, second in landed)
    print(f"precise prefix scoring: {same} of {len(landed)} second turns on the first's replica")
    assert same == len(landed), landed
    assert "Failed to parse message" not in kv_lines(picker)

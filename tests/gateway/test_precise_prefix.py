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
from typing import Any

import pytest

from tests.gateway.conftest import ADDRESSES
from tests.support import envoy as envoy_support
from tests.support import epp
from tests.support.process import ServerProcess, start_serving_server, stop_server_process
from tests.support.waiting import wait_until

CONFIG = """\
server:
  address: 127.0.0.1:0
  grace_period_s: 1
models:
  - {name: demo, load_on_startup: true, max_concurrency: 4}
"""
TOPICS = ["the sea", "a castle", "the harvest", "a long winter", "the king's horse", "a feast"]


def start(directory: Path, address: str, ports: dict[str, int]) -> tuple[ServerProcess, dict]:
    config = directory / "inferwire.yaml"
    config.write_text(CONFIG)
    kv = {name: ports.get(name, "*") for name in ("events", "replay")}
    server = start_serving_server(
        "--config",
        str(config),
        env={
            "INFERWIRE_SERVER__HTTP_ADDRESS": f"{address}:{ports.get('http', 0)}",
            "INFERWIRE_SERVER__METRICS_ADDRESS": f"{address}:{ports.get('metrics', 0)}",
            "INFERWIRE_SERVER__KV_EVENTS__ENDPOINT": f"tcp://{address}:{kv['events']}",
            "INFERWIRE_SERVER__KV_EVENTS__REPLAY_ENDPOINT": f"tcp://{address}:{kv['replay']}",
        },
    )
    logged = [json.loads(line) for line in server.log_lines if line.startswith("{")]
    (published,) = [e for e in logged if e.get("msg") == "kv events publishing"]
    (metrics,) = [e["port"] for e in logged if e.get("msg") == "metrics listening"]
    assert server.http_port is not None
    return server, {
        "http": server.http_port,
        "metrics": metrics,
        "events": int(published["endpoint"].rsplit(":", 1)[1]),
        "replay": int(published["replay_endpoint"].rsplit(":", 1)[1]),
    }


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


def precise_config(endpoints: Path, ports: dict[str, int]) -> dict[str, Any]:
    """The shipped configuration with its prefix scorer fed by the precise producer, as
    deploy/gateway/epp-config.yaml's comments show it."""
    config = epp.picker_config(endpoints, ports["metrics"])
    plugins = config["plugins"]
    (scorer,) = [p for p in plugins if p["type"] == "prefix-cache-scorer"]
    scorer["parameters"] = {"prefixMatchInfoProducerName": "precise-prefix-cache-producer"}
    at = plugins.index(scorer)
    plugins[at:at] = [
        {
            "type": "token-producer",
            "parameters": {
                "modelName": "demo",
                "vllm": {"url": f"http://{ADDRESSES[0]}:{ports['http']}"},
            },
        },
        {"type": "endpoint-notification-source"},
        {
            "type": "precise-prefix-cache-producer",
            "parameters": {
                "tokenProcessorConfig": {"blockSize": 16},
                "kvEventsConfig": {
                    "topicFilter": "kv@",
                    "discoverPods": True,
                    "podDiscoveryConfig": {
                        "socketPort": ports["events"],
                        "replaySocketPort": ports["replay"],
                    },
                },
            },
        },
    ]
    config["dataLayer"]["sources"].append(
        {
            "pluginRef": "endpoint-notification-source",
            "extractors": [{"pluginRef": "precise-prefix-cache-producer"}],
        }
    )
    return config


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


def conversation(topic: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": f"You are a storyteller. Every story is about {topic}."},
        {"role": "user", "content": f"Tell me a short story about {topic}, in three lines."},
    ]


async def scored_first(gateway: envoy_support.Envoy, body: dict[str, Any], holder: str) -> bool:
    """Whether the picker scores `holder` alone highest for `body`, without sending it: the
    prefix score lifts the replica holding the first turn once its events arrived."""
    scores = (await gateway.decide("/v1/chat/completions", body)).scores
    best = max(scores.values())
    return scores[holder] == best and list(scores.values()).count(best) == 1


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


def kv_lines(picker: epp.PickerProcess) -> str:
    """What the picker logged of its KV events and tokenizer."""
    words = ("zmq", "replay", "kv", "token", "render", "parse", "error")
    lines = [line for line in picker.log_lines if any(w in line.lower() for w in words)]
    return "".join(line[:400] for line in lines if "EPP received request" not in line)

"""A routing simulation of the Kubernetes inference gateway, without a cluster: three real
`inferwire serve` pods and a small endpoint picker that scrapes each pod's /metrics the way
the picker's `vllm` engine config does (one series per family, the first listed), then
sends each OpenAI request to the lowest-scoring pod: fewest waiting requests, then least
KV-cache usage, then the pod that has the request's adapter running. The spread follows
the gauges: a pod made slow (2 slots) receives fewer streams, and the bundled adapter's
requests go to the one pod where it is resident (on demand on the others)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferwire.config import default_models
from tests.support import figures
from tests.support.process import ServerProcess, start_serving_server, stop_server_process

ADAPTER = default_models()[1].options["adapter_file"]
POD = """\
server: {{grace_period_s: 1}}
models:
  - name: chat
    backend: simulator
    load_on_startup: true
    max_concurrency: {slots}
    max_queue: 256
    options: {{time_to_first_token_ms: 20, inter_token_ms: 15, output_tokens: 40}}
  - {{name: demo, load_on_startup: {resident}, on_demand: true, options: {{path: builtin}}}}
  - name: demo-sonnets
    adapter_of: demo
    load_on_startup: {resident}
    on_demand: true
    options: {{adapter_file: {adapter}}}
"""
SCRAPE_INTERVAL_S = 0.05  # the picker's default refresh interval


@dataclass
class Pod:
    name: str
    server: ServerProcess
    gauges: dict[str, float] = field(default_factory=dict)
    running_adapters: tuple[str, ...] = ()

    def score(self, adapter: str | None) -> tuple[float, float, int]:
        affinity = 0 if adapter is None or adapter in self.running_adapters else 1
        return (
            self.gauges.get("vllm:num_requests_waiting", 0.0),
            self.gauges.get("vllm:kv_cache_usage_perc", 0.0),
            affinity,
        )


def read_gauges(text: str) -> tuple[dict[str, float], tuple[str, ...]]:
    """What the picker's vLLM config reads: the first series of each family."""
    gauges: dict[str, float] = {}
    adapters: tuple[str, ...] = ()
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("vllm:") or not family.samples:
            continue
        sample = family.samples[0]
        gauges[family.name] = sample.value
        if family.name == "vllm:lora_requests_info":
            running = sample.labels.get("running_lora_adapters", "")
            adapters = tuple(a for a in running.split(",") if a)
    return gauges, adapters


class Picker:
    """Scrapes every pod each SCRAPE_INTERVAL_S; picks the lowest score."""

    def __init__(self, pods: list[Pod], client: httpx.AsyncClient) -> None:
        self.pods, self._client = pods, client
        self.sent: Counter[str] = Counter()

    async def scrape(self) -> None:
        texts = await asyncio.gather(
            *(self._client.get(pod.server.http_url + "/metrics") for pod in self.pods)
        )
        for pod, reply in zip(self.pods, texts, strict=True):
            pod.gauges, pod.running_adapters = read_gauges(reply.text)

    async def scraping(self) -> None:
        while True:
            await self.scrape()
            await asyncio.sleep(SCRAPE_INTERVAL_S)

    def pick(self, adapter: str | None = None) -> Pod:
        pod = min(self.pods, key=lambda p: p.score(adapter))
        self.sent[pod.name] += 1
        return pod


@pytest.fixture(scope="module")
def pods(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Pod]]:
    started: list[Pod] = []
    try:
        for name, slots, resident in (("a", 16, "true"), ("b", 16, "false"), ("slow", 2, "false")):
            config = tmp_path_factory.mktemp(f"pod-{name}") / "inferwire.yaml"
            config.write_text(POD.format(slots=slots, resident=resident, adapter=ADAPTER))
            started.append(Pod(name, start_serving_server("--config", str(config))))
        yield started
    finally:
        for pod in started:
            stop_server_process(pod.server)


async def stream(client: httpx.AsyncClient, pod: Pod, model: str, max_tokens: int) -> int:
    body = {"model": model, "prompt": "one two three", "max_tokens": max_tokens, "stream": True}
    chunks = 0
    async with client.stream("POST", pod.server.http_url + "/v1/completions", json=body) as reply:
        assert reply.status_code == 200, await reply.aread()
        async for line in reply.aiter_lines():
            if line.startswith("data: {"):
                chunks += 1
                assert "error" not in json.loads(line[6:])
    return chunks


async def test_the_gauges_move_within_one_scrape_interval(pods):
    pod = pods[1]
    async with httpx.AsyncClient(timeout=60) as client:
        picker = Picker([pod], client)
        await picker.scrape()
        assert pod.gauges["vllm:num_requests_running"] == 0
        body = {"model": "chat", "prompt": "one", "max_tokens": 40, "stream": True}
        async with client.stream(
            "POST", pod.server.http_url + "/v1/completions", json=body
        ) as reply:
            async for line in reply.aiter_lines():
                if line.startswith("data: {"):
                    break  # generating now: the next scrape says so
            await picker.scrape()
            assert pod.gauges["vllm:num_requests_running"] == 1
            assert pod.gauges["vllm:kv_cache_usage_perc"] > 0
        await asyncio.sleep(SCRAPE_INTERVAL_S)  # the closed stream ends on the server
        await picker.scrape()
        assert pod.gauges["vllm:num_requests_running"] == 0


async def test_48_streams_spread_by_the_gauges_the_slow_pod_receiving_fewest(pods):
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=64)) as client:
        picker = Picker(pods, client)
        await picker.scrape()
        scraper = asyncio.create_task(picker.scraping())
        try:
            streams = []
            for _ in range(48):
                streams.append(asyncio.create_task(stream(client, picker.pick(), "chat", 40)))
                await asyncio.sleep(0.02)  # arrivals spread, as users' requests are
            chunks = await asyncio.gather(*streams)
        finally:
            scraper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await scraper
    figures.record("gateway routing: 48 streams", f"sent per pod {dict(picker.sent)}")
    assert all(c > 0 for c in chunks)
    assert sum(picker.sent.values()) == 48
    assert picker.sent["slow"] < picker.sent["a"] and picker.sent["slow"] < picker.sent["b"]


async def test_an_adapter_s_requests_go_to_the_pod_where_it_is_resident(pods):
    async with httpx.AsyncClient(timeout=120) as client:
        picker = Picker(pods, client)
        for _ in range(6):
            await picker.scrape()
            pod = picker.pick("demo-sonnets")
            assert await stream(client, pod, "demo-sonnets", 8) > 0
    figures.record("gateway routing: adapter", f"sent per pod {dict(picker.sent)}")
    assert picker.sent == Counter({"a": 6})

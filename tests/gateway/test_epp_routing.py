"""Routing by llm-d's real endpoint picker over three real inferwire replicas: each request
is decided by the picker (EPP v0.10.0, deploy/gateway's configuration) from what it scraped
of the replicas' vLLM gauges, then sent to the replica it chose (tests/support/envoy.py).
What each case sent where prints in pytest's summary."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.gateway.conftest import GATEWAY_AUTH, TOKENS, Replica, Streams, wait_for
from tests.support import epp, figures
from tests.support.envoy import Envoy, Routed

# The first test may build the picker (several minutes once; .ci/run starts it early).
pytestmark = pytest.mark.timeout(epp.BUILD_TIMEOUT_S + 300)
QUEUE = "llm_d_epp_per_endpoint_queue_size"  # the picker's view of each endpoint's queue
_prompts = itertools.count()


def fresh_prompt() -> str:
    """A prompt no earlier request had, so the prefix-cache scorer favours no replica."""
    return f"request {next(_prompts)} of the gateway tier, {time.monotonic_ns()}"


async def complete(gateway: Envoy, model: str = "chat", **headers: str) -> Routed:
    body = {"model": model, "prompt": fresh_prompt(), "max_tokens": 4}
    routed = await gateway.send("/v1/completions", body, {**GATEWAY_AUTH, **headers})
    assert routed.status == 200, routed.body
    return routed


def names(replicas: list[Replica]) -> dict[str, str]:
    return {r.endpoint: r.name for r in replicas}


def per_replica(routed: list[Routed], replicas: list[Replica]) -> Counter[str]:
    counts = Counter({r.name: 0 for r in replicas})
    counts.update(names(replicas)[r.endpoint] for r in routed)
    return counts


async def picker_queues(picker: epp.PickerProcess) -> dict[str, float]:
    return await asyncio.to_thread(picker.metric_samples, QUEUE)


@pytest.fixture(scope="module")
async def scraped(
    picker: epp.PickerProcess, replicas: list[Replica]
) -> AsyncIterator[dict[str, float]]:
    """Before anything is routed: a backlog of 1, 2 and 3 requests on the three replicas,
    until the picker reports exactly those (it has scraped each, and tells them apart);
    then none again. Yields what the picker reported."""
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=64)) as http:
        streams = Streams(http)
        expected = {r.name: float(i + 1) for i, r in enumerate(replicas)}
        try:
            for i, replica in enumerate(replicas):
                streams.open(replica, "gate", 2 + i)  # one runs, the rest wait
            seen: dict[str, float] = {}

            async def backlogs_seen() -> bool:
                seen.update(await picker_queues(picker))
                return seen == expected

            await wait_for(backlogs_seen, what=f"the picker's queues {expected}")
        finally:
            await streams.close()
    idle = {r.name: 0.0 for r in replicas}
    await wait_for(lambda: _equal(picker, idle), what="the picker's queues back to 0")
    yield seen


async def _equal(picker: epp.PickerProcess, expected: dict[str, float]) -> bool:
    return await picker_queues(picker) == expected


async def test_the_picker_has_scraped_every_replica_before_anything_is_routed(scraped, replicas):
    assert scraped == {"pod-0": 1.0, "pod-1": 2.0, "pod-2": 3.0}
    weights = epp.scorer_weights(epp.manifest_config())
    figures.record(
        "gateway (real picker): scraped", f"queues the picker read {scraped}; weights {weights}"
    )


async def test_a_replica_with_a_backlog_is_avoided_then_chosen_again_once_it_drains(
    scraped, picker, replicas, gateway, streams
):
    busy = replicas[1]
    streams.open(busy, "gate", 3)  # one generating, two waiting
    await wait_for(
        lambda: _equal(picker, {"pod-0": 0.0, "pod-1": 2.0, "pod-2": 0.0}),
        what="the picker sees pod-1's backlog",
    )
    while_busy = [await complete(gateway) for _ in range(12)]
    await streams.close()
    await wait_for(lambda: _equal(picker, {r.name: 0.0 for r in replicas}), what="pod-1 drained")
    after = []
    while not after or after[-1].endpoint != busy.endpoint:  # ties are broken at random
        after.append(await complete(gateway))
        assert len(after) <= 60, per_replica(after, replicas)
    counts = per_replica(while_busy, replicas)
    figures.record(
        "gateway (real picker): backlog",
        f"pod-1 with 2 waiting: {dict(counts)}; drained: pod-1 chosen again after "
        f"{len(after)} request(s) ({dict(per_replica(after, replicas))})",
    )
    assert counts[busy.name] == 0
    for routed in while_busy:
        scores = routed.decision.scores
        assert scores[busy.endpoint] < min(v for k, v in scores.items() if k != busy.endpoint)


async def test_a_replica_with_more_kv_cache_in_use_scores_lower_other_things_equal(
    scraped, replicas, gateway, streams
):
    idle, loaded = replicas[1], replicas[2]  # neither holds the adapter: alike but for KV
    streams.open(loaded, "long", 2, prompt=" ".join(["word"] * 200))  # running, none waiting

    async def held() -> bool:  # both prompts admitted: the replica's own gauge says so
        return await replica_gauge(loaded, "vllm:kv_cache_usage_perc") > 0.15

    await wait_for(held, what="pod-2's KV use")

    async def kv_seen() -> bool:
        routed = await complete(gateway)
        return routed.decision.scores[loaded.endpoint] < routed.decision.scores[idle.endpoint]

    await wait_for(kv_seen, what="pod-2's KV use in the picker's scores")
    decided = [await complete(gateway) for _ in range(8)]
    usage = await replica_gauge(loaded, "vllm:kv_cache_usage_perc")
    counts = per_replica(decided, replicas)
    gaps = [r.decision.scores[idle.endpoint] - r.decision.scores[loaded.endpoint] for r in decided]
    figures.record(
        "gateway (real picker): KV cache",
        f"pod-2 at kv_cache_usage_perc {usage:.2f} (2 streams, 0 waiting): {dict(counts)}; "
        f"score gap pod-1 - pod-2 {min(gaps):.3f}..{max(gaps):.3f}",
    )
    assert all(gap > 0 for gap in gaps)
    assert counts[loaded.name] == 0


async def test_an_adapter_s_requests_go_to_the_replica_where_it_is_resident(
    scraped, replicas, gateway
):
    resident = replicas[0]
    adapter = [await complete(gateway, "demo-sonnets") for _ in range(6)]
    counts = per_replica(adapter, replicas)
    figures.record("gateway (real picker): adapter", f"demo-sonnets: {dict(counts)}")
    assert counts == Counter({resident.name: 6, "pod-1": 0, "pod-2": 0})


async def test_an_anthropic_message_is_routed_as_a_chat_completion(scraped, replicas, gateway):
    """POST /v1/messages (Anthropic's Messages API) through the picker: it reads the model
    from the body as it does a chat completion's, so an adapter's messages go to the
    replica where the adapter is resident, and the replica answers in Anthropic's shape."""
    resident = replicas[0]
    routed = []
    for _ in range(4):
        body = {
            "model": "demo-sonnets",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": fresh_prompt()}],
        }
        sent = await gateway.send("/v1/messages", body, GATEWAY_AUTH)
        assert sent.status == 200, sent.body
        answer = json.loads(sent.body)
        assert answer["type"] == "message" and answer["usage"]["output_tokens"] == 4
        routed.append(sent)
    counts = per_replica(routed, replicas)
    figures.record("gateway (real picker): Anthropic messages", f"demo-sonnets: {dict(counts)}")
    assert counts == Counter({resident.name: 4, "pod-1": 0, "pod-2": 0})


async def test_the_objective_reaches_inferwire_as_its_priority_from_the_gateway_only(
    scraped, replicas, gateway
):
    sent = {}
    for objective in ("critical", "default", "sheddable"):
        headers = {
            "x-gateway-inference-fairness-id": "team-a",
            "x-gateway-inference-objective": objective,
        }
        for who, token in TOKENS.items():
            request_id = f"objective-{objective}-{who}-{time.monotonic_ns()}"
            routed = await complete(
                gateway, **headers, authorization=f"Bearer {token}", **{"x-request-id": request_id}
            )
            assert routed.decision.headers["x-gateway-inference-objective"] == objective
            sent[request_id] = (objective, who, names(replicas)[routed.endpoint])
    by_name = {r.name: r for r in replicas}

    def served(request_id: str) -> tuple[str, str] | None:
        _, _, replica = sent[request_id]
        for line in by_name[replica].server.log_lines:
            if request_id in line and '"request finished"' in line:
                entry = json.loads(line)
                return entry["tenant"], entry["priority"]
        return None

    await wait_for(lambda: all(served(i) for i in sent), what="every access line")
    seen = {(objective, who): served(i) for i, (objective, who, _) in sent.items()}
    assert seen == {
        ("critical", "inference-gateway"): ("team-a", "interactive"),
        ("default", "inference-gateway"): ("team-a", "standard"),
        ("sheddable", "inference-gateway"): ("team-a", "batch"),
        # A client's own token: the headers reach inferwire and are ignored.
        ("critical", "client"): ("client", "standard"),
        ("default", "client"): ("client", "standard"),
        ("sheddable", "client"): ("client", "standard"),
    }


async def replica_gauge(replica: Replica, family: str) -> float:
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"http://{replica.address}:{replica.metrics_port}/metrics")).text
    (line,) = [line for line in text.splitlines() if line.startswith(family + " ")]
    return float(line.rsplit(" ", 1)[1])


# Last: it stops a replica for good.
async def test_a_stopped_replica_stops_being_chosen_and_nothing_routed_after_fails(
    scraped, replicas, gateway
):
    stopping = replicas[2]
    routed: list[tuple[float, Routed]] = []
    stopped_at: list[float] = []

    async def traffic() -> None:
        while not stopped_at or len([t for t, _ in routed if t > stopped_at[0]]) < 30:
            routed.append((time.monotonic(), await complete(gateway)))

    sender = asyncio.create_task(traffic())
    await wait_for(lambda: len(routed) >= 10, what="traffic before the stop")
    signalled = time.monotonic()
    stopping.server.process.send_signal(signal.SIGTERM)
    await wait_for(lambda: stopping.server.process.poll() is not None, timeout_s=60, what="exit")
    stopped_at.append(time.monotonic())  # its ports are closed
    await sender
    chosen = [t for t, r in routed if r.endpoint == stopping.endpoint and t > signalled]
    last = max(chosen, default=signalled)
    after_exit = [r for t, r in routed if t > stopped_at[0]]
    figures.record(
        "gateway (real picker): stopped replica",
        f"SIGTERM to exit {stopped_at[0] - signalled:.1f} s; pod-2 last chosen "
        f"{last - signalled:.2f} s after SIGTERM ({len(chosen)} requests meanwhile); "
        f"after: {dict(per_replica([r for t, r in routed if t > last], replicas))}",
    )
    assert stopping.server.process.returncode == 0, stopping.server.exit_report()
    assert all(r.endpoint != stopping.endpoint for r in after_exit)

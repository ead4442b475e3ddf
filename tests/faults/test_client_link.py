"""Faults on the link between a client and inferwire, injected by Toxiproxy: a slow link
during a long stream, and a connection cut after some bytes; then every fault at once,
removed again."""

from __future__ import annotations

import asyncio
import statistics
import time

import grpc

from inferwire.v1 import inference_pb2 as pb
from tests.faults.rig import BOUND_S, SERVING, TRITON_MODELS, Footprint, Rig, report
from tests.support.waiting import read_rest
from tests.triton_models.echo_engine import echo_text
from tests.unit.api.test_metrics import SERVICE, delta, rpc_labels

RATE_KB_S = 10
# 100 tokens of about 300 bytes: ~30 KB, three seconds at 10 KB/s, a third of one without.
WORDS = [f"{i:03d}" + "x" * 297 for i in range(100)]
CUT_AFTER_BYTES = 2000
DEMO_MAX_TOKENS = 1000


async def other_clients_ttft_ms(rig: Rig, count: int) -> list[float]:
    """TTFT of `count` requests by other clients, on their own direct connection."""
    times = []
    for i in range(count):
        reply = await rig.infer("pair", prompt=f"o{i} t{i}", tokens=2, timeout=10)
        times.append(reply.timing.time_to_first_token_ms)
    return times


async def test_a_slow_client_link_delivers_a_long_stream_whole_and_others_are_unaffected(
    rig: Rig, client_link
):
    baseline = Footprint.now()
    prompt = " ".join(WORDS)
    before_ms = await other_clients_ttft_ms(rig, 10)
    rig.proxies["client"].add("bandwidth", rate=RATE_KB_S)
    started = time.monotonic()
    call = client_link.InferStream(
        pb.InferStreamRequest(
            model="only_b", prompt=prompt, parameters=pb.GenerationParameters(max_tokens=100)
        ),
        timeout=60,
    )
    stream = asyncio.create_task(read_rest(call))
    during_ms = await other_clients_ttft_ms(rig, 10)
    others_done = time.monotonic()
    assert not stream.done()  # the others finished while the slow stream still ran
    messages = await stream
    took_s = time.monotonic() - started
    text = "".join(m.text for m in messages)
    # In order, nothing lost or repeated: exactly the model's text, token by token.
    assert text == echo_text(prompt, 100)
    assert messages[-1].usage.completion_tokens == 100
    assert messages[-1].finish_reason == pb.FINISH_REASON_LENGTH
    assert took_s >= len(text.encode()) / (RATE_KB_S * 1024)  # the link's own limit
    assert await rig.status("only_b") == SERVING

    footprint = await rig.recovered(baseline)
    report(
        "bandwidth 10 KB/s on the client link during a long stream",
        f"{len(messages)} messages, {len(text.encode())} bytes of text, in order and whole in "
        f"{took_s:.2f} s; other clients' TTFT median {statistics.median(before_ms):.1f} ms "
        f"before, {statistics.median(during_ms):.1f} ms during (max {max(during_ms):.1f}); "
        f"their 10 requests done {others_done - started:.2f} s into the stream",
    )
    assert footprint.within(baseline), (footprint, baseline)


async def test_a_client_link_cut_mid_stream_cancels_the_request_and_stops_the_engine(
    rig: Rig, client_link, request_log
):
    baseline = Footprint.now()
    before = await rig.metrics()
    call = client_link.InferStream(
        pb.InferStreamRequest(
            model="demo",
            prompt="Hello",
            request_id="cut-1",
            parameters=pb.GenerationParameters(max_tokens=DEMO_MAX_TOKENS, temperature=0),
        ),
        timeout=60,
    )
    assert (await call.read()).text is not None
    cut_at = time.monotonic()
    rig.proxies["client"].add("limit_data", bytes=CUT_AFTER_BYTES)
    try:
        await read_rest(call)
        code = grpc.StatusCode.OK
    except grpc.aio.AioRpcError as exc:
        code = exc.code()
    client_s = time.monotonic() - cut_at
    assert code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)

    while (line := request_log.for_request("cut-1")) is None:
        assert time.monotonic() - cut_at < 30, "the request never ended on the server"
        await asyncio.sleep(0.02)
    logged_s = time.monotonic() - cut_at
    assert line.outcome == "cancelled"
    assert line.code == "CANCELLED"
    assert line.tokens_after_cancel <= 1
    assert line.completion_tokens < DEMO_MAX_TOKENS
    after = await rig.metrics()
    assert delta(before, after, "inferwire_requests_total", model="demo", outcome="cancelled") == 1
    streamed = rpc_labels("server_stream", SERVICE, "InferStream")
    assert delta(before, after, "grpc_server_handled_total", **streamed, grpc_code="Canceled") == 1
    health = await rig.stub.Health(pb.HealthRequest(model="demo"), timeout=5)
    assert health.models[0].inflight == 0

    footprint = await rig.recovered(baseline)
    report(
        "limit_data (cut after 2000 bytes) on the client link mid-stream",
        f"the client saw {code.name} {client_s:.2f} s after the toxic; the server logged "
        f"outcome cancelled after {line.completion_tokens} of {DEMO_MAX_TOKENS} tokens, "
        f"{line.tokens_after_cancel} generated after the cancel, {logged_s:.2f} s after",
    )
    assert footprint.within(baseline), (footprint, baseline)


async def test_every_fault_at_once_then_removed_leaves_every_endpoint_serving(rig: Rig):
    baseline = Footprint.now()
    rig.link_a.add("reset_peer", timeout=0)
    rig.link_b.add("latency", latency=200, jitter=50)
    rig.proxies["client"].add("bandwidth", rate=RATE_KB_S)
    # The pair still answers: b is slow, but it is the only usable endpoint left.
    reply = await rig.infer("pair", timeout=10)
    assert reply.timing.time_to_first_token_ms >= 150

    removed_at = time.monotonic()
    footprint = await rig.recovered(baseline)
    recovered_s = time.monotonic() - removed_at
    # Both endpoints back in the rotation: rounds of 10 until each has served one. On a
    # loaded machine one health check's round trip can mark an endpoint slow for a check or
    # two (SLOW_MARGIN_S), so the first round alone may all go to one of them.
    before = rig.served()
    rounds = 0
    while True:
        rounds += 1
        await asyncio.gather(
            *(rig.infer("pair", prompt=f"r{i} s{i}", timeout=10) for i in range(10))
        )
        after = rig.served()
        split = (after["a"] - before["a"], after["b"] - before["b"])
        if min(split) > 0:
            break
        assert time.monotonic() - removed_at < BOUND_S, split
    for model in (*TRITON_MODELS, "demo"):
        assert await rig.status(model) == SERVING
    report(
        "every toxic at once, then removed",
        f"all models SERVING and every endpoint out of the detail's problems "
        f"{recovered_s:.2f} s after removal, no gateway restart; {10 * rounds} pair requests "
        f"split {split[0]}/{split[1]}",
    )
    assert footprint.within(baseline), (footprint, baseline)

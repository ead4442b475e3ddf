"""Faults on the links between inferwire and its tritonservers, injected by Toxiproxy:
latency, a reset peer, a black hole; and everything removed again. Each test reads the
outcome from the client, the health service, the metrics and the request log, and ends
with every toxic removed, every model SERVING and the footprint back to its baseline."""

from __future__ import annotations

import asyncio
import statistics
import time

import grpc

from tests.faults.rig import (
    BOUNDED_TIMEOUT_S,
    HEALTH_INTERVAL_S,
    HEALTH_TIMEOUT_S,
    KEEPALIVE_TIME_S,
    KEEPALIVE_TIMEOUT_S,
    NOT_SERVING,
    SERVING,
    SLOW_KEEPALIVE_TIMEOUT_S,
    Footprint,
    Rig,
    ending,
    long_stream,
    report,
)
from tests.unit.api.test_metrics import SERVICE, delta, rpc_labels

LATENCY_MS, JITTER_MS = 200, 50
SPLIT_REQUESTS = 40


async def test_latency_on_a_triton_link_shows_in_timing_and_the_picker_prefers_the_fast_one(
    rig: Rig,
):
    baseline = Footprint.now()
    toxic_at = time.monotonic()
    rig.link_b.add("latency", latency=LATENCY_MS, jitter=JITTER_MS)
    noticed_s = await rig.until_detail("pair", f"{rig.link_b.listen}: slow", toxic_at)

    # Requests through the slow link succeed, and their Timing carries the latency.
    slow = [await rig.infer("only_b", timeout=10) for _ in range(3)]
    ttft_ms = [reply.timing.time_to_first_token_ms for reply in slow]
    assert min(ttft_ms) >= LATENCY_MS - JITTER_MS, ttft_ms  # the toxic's own minimum

    # With both endpoints healthy, the fast one gets the pair's requests.
    before = rig.served()
    limit = asyncio.Semaphore(8)

    async def one(i: int) -> None:
        async with limit:
            await rig.infer("pair", prompt=f"p{i} q{i}", tokens=2, timeout=10)

    await asyncio.gather(*(one(i) for i in range(SPLIT_REQUESTS)))
    after = rig.served()
    fast, slow_served = after["a"] - before["a"], after["b"] - before["b"]
    assert fast + slow_served == SPLIT_REQUESTS
    assert slow_served <= SPLIT_REQUESTS // 10, (fast, slow_served)
    for model in ("pair", "only_b"):
        assert await rig.status(model) == SERVING
    detail = await rig.detail("pair")
    assert "ready on 2 of 2 endpoints" in detail

    footprint = await rig.recovered(baseline)
    report(
        "latency 200 ms ± 50 ms on Triton link b",
        f"the pair's detail named b slow {noticed_s:.2f} s after the toxic ({detail!r}); "
        f"only_b TTFT {', '.join(f'{t:.0f}' for t in ttft_ms)} ms; pair split "
        f"{fast}/{slow_served} (fast/slow) of {SPLIT_REQUESTS}; health SERVING throughout",
    )
    assert footprint.within(baseline), (footprint, baseline)


async def test_a_reset_peer_mid_stream_fails_the_streams_there_and_the_next_requests_fail_over(
    rig: Rig, request_log
):
    baseline = Footprint.now()
    before = await rig.metrics()
    # Four streams in a row alternate over the pair: two on each endpoint.
    calls = [long_stream(rig.stub, "pair", timeout=60) for _ in range(4)]
    for call in calls:
        assert (await call.read()).text
    reset_at = time.monotonic()
    rig.link_a.add("reset_peer", timeout=0)
    marked = asyncio.create_task(
        rig.until_detail("pair", f"{rig.link_a.listen}: UNAVAILABLE", reset_at)
    )
    # The two streams on b are cancelled by us once the two on a have ended.
    endings = []
    for task in asyncio.as_completed([ending(call) for call in calls]):
        endings.append(await task)
        if sum(code is grpc.StatusCode.UNAVAILABLE for code, _, _ in endings) == 2:
            break
    failed = [(code, details, at) for code, details, at in endings]
    assert [code for code, _, _ in failed] == [grpc.StatusCode.UNAVAILABLE] * 2, failed
    assert all(f"Triton at {rig.link_a.listen} is unavailable" in d for _, d, _ in failed)
    failed_s = max(at for _, _, at in failed) - reset_at

    # The next requests fail over to b, while a still resets every connection.
    started = time.monotonic()
    replies = [await rig.infer("pair", prompt=f"n{i} m{i}", timeout=10) for i in range(6)]
    failover_s = time.monotonic() - started
    assert len(replies) == 6
    for call in calls:
        call.cancel()
    assert await rig.status("pair") == SERVING
    down_s = await marked
    after = await rig.metrics()
    streamed = rpc_labels("server_stream", SERVICE, "InferStream")
    assert delta(before, after, "grpc_server_handled_total", **streamed, grpc_code="Unavailable")
    assert delta(before, after, "inferwire_requests_total", model="pair", outcome="error") == 2
    errors = [r for r in request_log.caplog.records if getattr(r, "code", "") == "UNAVAILABLE"]
    assert len(errors) == 2 and all(r.model == "pair" for r in errors)

    footprint = await rig.recovered(baseline)
    report(
        "reset_peer on Triton link a mid-stream",
        f"2 of 4 streams (those on a) ended UNAVAILABLE naming {rig.link_a.listen} within "
        f"{failed_s:.3f} s of the toxic; the next 6 requests all succeeded on b in "
        f"{failover_s:.2f} s; a marked unavailable in the detail {down_s:.2f} s after; "
        "model/pair SERVING throughout",
    )
    assert footprint.within(baseline), (footprint, baseline)


async def test_a_black_hole_ends_requests_at_their_deadline_and_keepalive_finds_it(
    rig: Rig, request_log
):
    baseline = Footprint.now()
    started = time.monotonic()
    deadline_s = 1.0
    with_deadline = long_stream(rig.stub, "only_a", timeout=deadline_s, request_id="bh-deadline")
    unbounded = long_stream(rig.stub, "bounded", request_id="bh-bounded")
    open_ended = long_stream(rig.stub, "only_a", request_id="bh-open")
    for call in (with_deadline, unbounded, open_ended):
        assert (await call.read()).text
    hole_at = time.monotonic()
    rig.link_a.add("timeout", timeout=0)
    rig.link_a.add("timeout", stream="upstream", timeout=0)
    down = asyncio.create_task(rig.until_status("only_a", NOT_SERVING, hole_at))

    # Traffic for the pair moves to b: requests sent into the hole fail over once
    # keepalive finds the connection dead, not at the TCP timeout.
    async def timed_infer(i: int) -> float:
        sent = time.monotonic()
        await rig.infer("pair", prompt=f"h{i} k{i}", tokens=2)
        return time.monotonic() - sent

    endings = asyncio.gather(*(ending(c) for c in (with_deadline, unbounded, open_ended)))
    pair_times = await asyncio.gather(*(timed_infer(i) for i in range(6)))
    outcomes = await endings
    (deadline_code, _, deadline_at), (bounded_code, _, bounded_at), open_end = outcomes
    assert deadline_code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert bounded_code is grpc.StatusCode.DEADLINE_EXCEEDED
    open_code, open_details, open_at = open_end
    assert open_code is grpc.StatusCode.UNAVAILABLE, open_details
    assert f"Triton at {rig.link_a.listen}" in open_details
    down_s = await down
    assert await rig.status("pair") == SERVING
    detail = await rig.detail("pair")
    assert f"{rig.link_a.listen}: " in detail and "ready on 1 of 2" in detail
    records = {r.request_id: r for r in request_log.caplog.records if r.name == "inferwire.access"}
    assert records["bh-deadline"].outcome == "deadline_exceeded"
    assert records["bh-bounded"].code == "DEADLINE_EXCEEDED"
    assert records["bh-open"].code == "UNAVAILABLE"

    footprint = await rig.recovered(baseline)
    report(
        "black hole (timeout toxic, both ways) on Triton link a",
        f"a stream with a {deadline_s:.1f} s deadline ended DEADLINE_EXCEEDED "
        f"{deadline_at - started - deadline_s:+.3f} s from its deadline; one without a deadline "
        f"on request_timeout_s {BOUNDED_TIMEOUT_S} s ended DEADLINE_EXCEEDED "
        f"{bounded_at - started - BOUNDED_TIMEOUT_S:+.3f} s from it; one on the default "
        f"ended UNAVAILABLE {open_at - hole_at:.2f} s after the hole opened (keepalive "
        f"{KEEPALIVE_TIME_S:g} s + {SLOW_KEEPALIVE_TIMEOUT_S:g} s); model/only_a NOT_SERVING "
        f"{down_s:.2f} s after ({down_s / HEALTH_INTERVAL_S:.1f} health intervals of "
        f"{HEALTH_INTERVAL_S} s, timeout {HEALTH_TIMEOUT_S} s); 6 pair requests (keepalive "
        f"{KEEPALIVE_TIME_S:g} s + {KEEPALIVE_TIMEOUT_S:g} s) all OK, median "
        f"{statistics.median(pair_times):.2f} s, max {max(pair_times):.2f} s",
    )
    assert footprint.within(baseline), (footprint, baseline)

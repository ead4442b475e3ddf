"""Soak: many mixed requests against a real `inferwire serve`, and what the process kept.

    python -m tests.reliability.soak --requests 2000 --concurrency 32

It serves the bundled model in a real process (tests/support/process.py) and sends N
requests of five kinds, in a fixed mix:

  unary       Infer, expected OK
  stream      InferStream read to the end, expected OK
  cancelled   InferStream cancelled after its first message, expected CANCELLED
  invalid     InferStream with top_p 2, expected INVALID_ARGUMENT
  not_found   Infer on a model that is not configured, expected NOT_FOUND

It reports the count of every (kind, code), latency percentiles per kind, and the
server's RSS, open descriptors (/proc/PID/fd) and threads (/proc/PID/status) after the
warm-up (`start`), once 10% of the requests have finished (`mark`) and at the end
(`end`, after waiting up to SETTLE_S for descriptors and threads to come back down). The
JSON goes to tests/reliability/results/soak-<N>.json.

The pass rule (exit status 1 when it fails): no unexpected code, at the client or in the
server's log, which has one `request finished` record per request sent (warm-up
included); RSS at the end less than 10% above the mark; descriptors at the end equal to
the start; threads at the end equal to the start. The server runs through
tests/reliability/full_pools.py, which starts every worker of its thread pools when the
pool is made (the bundled model's generation executor, asyncio's default executor, where
the tokenizer runs): pools that grew lazily would otherwise hold more threads at the end
than at the start without any leak. The samples name the threads
(/proc/PID/task/*/comm) to show which grew.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.process import ServerProcess, start_serving_server, stop_server_process

SAMPLES = ("start", "mark", "end")
RESULTS = Path(__file__).resolve().parent / "results"
KINDS = ("unary", "stream", "cancelled", "invalid", "not_found")
# Ten slots: four unary, three streamed, one each of the others.
MIX = ("unary", "stream", "unary", "cancelled", "stream", "unary", "invalid", "stream")
MIX += ("unary", "not_found")
EXPECTED = {
    "unary": "OK",
    "stream": "OK",
    "cancelled": "CANCELLED",
    "invalid": "INVALID_ARGUMENT",
    "not_found": "NOT_FOUND",
}
MAX_RSS_GROWTH = 0.10
# The server's CLI, with every thread pool started full (see full_pools.py).
FULL_POOLS = (sys.executable, "-m", "tests.reliability.full_pools")
REPOSITORY = Path(__file__).resolve().parents[2]
SETTLE_S = 10.0
WARM_UP_PER_SLOT = 2
REQUEST_TIMEOUT_S = 60.0
PROMPTS = ("Name a colour.", "Count to three.", "Say hello.", "What is gRPC?")


@dataclass
class Sample:
    """The server process at one moment."""

    at_request: int
    rss_kib: int
    fds: int
    threads: int
    thread_names: dict[str, int]  # from /proc/PID/task/*/comm: which pools grew


def sample(pid: int, done: int) -> Sample:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in status if ":" in line)
    return Sample(
        at_request=done,
        rss_kib=int(fields["VmRSS"].split()[0]),
        fds=len(list(Path(f"/proc/{pid}/fd").iterdir())),
        threads=int(fields["Threads"]),
        thread_names=dict(sorted(Counter(_thread_names(pid)).items())),
    )


def _thread_names(pid: int) -> list[str]:
    names = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that just ended
            names.append((task / "comm").read_text().strip())
    return names


@dataclass
class Run:
    """What the requests did: a latency list per kind, a count per (kind, code)."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    codes: Counter[tuple[str, str]] = field(default_factory=Counter)
    done: int = 0


def _params(max_tokens: int, **extra: float) -> pb.GenerationParameters:
    return pb.GenerationParameters(max_tokens=max_tokens, temperature=0, **extra)


async def one_request(
    stub: inference_pb2_grpc.InferenceServiceStub, kind: str, i: int, max_tokens: int
) -> str:
    """Send request `i` of `kind`; return its status code's name."""
    prompt = PROMPTS[i % len(PROMPTS)]
    timeout = REQUEST_TIMEOUT_S
    try:
        if kind in ("unary", "not_found"):
            model = "demo" if kind == "unary" else "no-such-model"
            request = pb.InferRequest(model=model, prompt=prompt, parameters=_params(max_tokens))
            await stub.Infer(request, timeout=timeout)
            return "OK"
        params = _params(max_tokens, top_p=2.0) if kind == "invalid" else _params(max_tokens)
        call = stub.InferStream(
            pb.InferStreamRequest(model="demo", prompt=prompt, parameters=params),
            timeout=timeout,
        )
        if kind == "cancelled":
            if await call.read() is grpc.aio.EOF:
                return "OK"  # ended before it could be cancelled: unexpected here
            call.cancel()
        while await call.read() is not grpc.aio.EOF:
            pass
        return (await call.code()).name
    except grpc.aio.AioRpcError as exc:
        return exc.code().name
    except asyncio.CancelledError:
        # A cancelled call's read raises CancelledError in this task's await.
        if kind == "cancelled":
            return "CANCELLED"
        raise


async def drive(
    target: str,
    pid: int,
    requests: int,
    concurrency: int,
    max_tokens: int,
    on_mark: list[Sample],
) -> Run:
    run = Run()
    mark_at = max(1, requests // 10)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)

    async with grpc.aio.insecure_channel(target) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)

        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                kind = MIX[i % len(MIX)]
                started = time.perf_counter()
                code = await one_request(stub, kind, i, max_tokens)
                run.latencies[kind].append(time.perf_counter() - started)
                run.codes[(kind, code)] += 1
                run.done += 1
                if run.done == mark_at:
                    on_mark.append(sample(pid, run.done))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return run


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1)

    return {"p50_ms": at(0.50), "p90_ms": at(0.90), "p99_ms": at(0.99), "max_ms": at(1.0)}


def settle(pid: int, start: Sample, done: int) -> Sample:
    """The end sample, once descriptors and threads are back to the start (or SETTLE_S)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        end = sample(pid, done)
        back = end.fds <= start.fds and end.threads <= start.threads
        if back or time.monotonic() > deadline:
            return end
        time.sleep(0.2)


def server_codes(log_lines: list[str]) -> Counter[str]:
    """The code of every `request finished` record in the server's log."""
    codes: Counter[str] = Counter()
    for line in log_lines:
        if '"request finished"' in line:
            codes[json.loads(line)["code"]] += 1
    return codes


def verdict(
    run: Run, samples: tuple[Sample, Sample, Sample], logged: Counter[str], sent: int, alive: bool
) -> dict[str, object]:
    start, mark, end = samples
    unexpected = {
        f"{kind} {code}": n for (kind, code), n in run.codes.items() if EXPECTED[kind] != code
    }
    # A stream cancelled just as it finished may be logged OK; any other code is a fault.
    unexpected.update(
        {f"server {code}": n for code, n in logged.items() if code not in set(EXPECTED.values())}
    )
    growth = (end.rss_kib - mark.rss_kib) / mark.rss_kib
    checks = {
        "server_alive_at_end": alive,
        "no_unexpected_codes": not unexpected,
        "one_log_record_per_request": logged.total() == sent,
        "rss_growth_under_10_percent": growth < MAX_RSS_GROWTH,
        "fds_back_to_start": end.fds <= start.fds,
        "threads_back_to_start": end.threads <= start.threads,
    }
    return {
        "passed": all(checks.values()),
        "checks": checks,
        "unexpected": unexpected,
        "rss_growth_mark_to_end": round(growth, 4),
    }


async def warm_up(target: str, concurrency: int, max_tokens: int) -> None:
    """Every kind, at full concurrency, so pools and caches exist before the start sample."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        kinds = [MIX[i % len(MIX)] for i in range(WARM_UP_PER_SLOT * concurrency)]
        await asyncio.gather(*(one_request(stub, k, i, max_tokens) for i, k in enumerate(kinds)))


def soak(requests: int, concurrency: int, max_tokens: int, output: Path) -> dict[str, object]:
    pythonpath = os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")]))
    server: ServerProcess = start_serving_server(env={"PYTHONPATH": pythonpath}, program=FULL_POOLS)
    try:
        pid = server.process.pid
        asyncio.run(warm_up(server.target, concurrency, max_tokens))
        time.sleep(1.0)
        start = sample(pid, 0)
        marks: list[Sample] = []
        began = time.monotonic()
        run = asyncio.run(
            drive(server.target, pid, requests, concurrency, max_tokens, on_mark=marks)
        )
        elapsed = time.monotonic() - began
        end = settle(pid, start, run.done)
        alive = server.process.poll() is None
    finally:
        stop_server_process(server, graceful=True)
    logged = server_codes(server.log_lines)
    sent = requests + WARM_UP_PER_SLOT * concurrency
    samples = (start, marks[0], end)
    result = {
        "requests": requests,
        "concurrency": concurrency,
        "max_tokens": max_tokens,
        "elapsed_s": round(elapsed, 1),
        "requests_per_s": round(requests / elapsed, 1),
        "codes": {f"{kind} {code}": n for (kind, code), n in sorted(run.codes.items())},
        "latency": {kind: percentiles(run.latencies[kind]) for kind in KINDS},
        "process": {name: vars(s) for name, s in zip(SAMPLES, samples, strict=True)},
        "rule": {
            "max_rss_growth_mark_to_end": MAX_RSS_GROWTH,
            "settle_s": SETTLE_S,
        },
        "server_logged_codes": dict(sorted(logged.items())),
        "verdict": verdict(run, samples, logged, sent, alive),
        "host": {"cpus": len(os.sched_getaffinity(0)), "python": platform.python_version()},
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--output", type=Path, help="default: results/soak-<N>.json")
    args = parser.parse_args(argv)
    output = args.output or RESULTS / f"soak-{args.requests}.json"
    result = soak(args.requests, args.concurrency, args.max_tokens, output)
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write(f"\nwritten to {output}\n")
    return 0 if result["verdict"]["passed"] else 1  # type: ignore[index]


if __name__ == "__main__":
    sys.exit(main())

"""Calls that end early, by the thousand, against a real `inferwire serve` (issue 31).

What a real server sees from clients that leave: grpc.health.v1 Watch calls cancelled
after one or two statuses while models load and unload (what gRPC's client-side health
checking does each time a subchannel closes), channels with `healthCheckConfig` opened and
closed, and InferStream, KServe ModelStreamInfer and reflection streams cancelled at every
point or cut by their deadline. `tests/reliability/test_call_lifetimes.py` runs each against
a plain server and one with mutual TLS and a tokens file; every run ends with the process
alive and `model/demo` SERVING, and a crash is reported with the faulthandler's stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import subprocess
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2_grpc

from inferwire.api.reflection import V1, V1ALPHA
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.oip import kserve_request
from tests.support.process import ServerProcess
from tests.support.reflection import reflection_stream

Code = grpc.StatusCode
# What a call that we cut short may end with: our cancel, its deadline, or done first.
# CLIENT_WRITE_FAILED is grpc.aio's client, not the server: a bidirectional call that ends
# (its deadline) while the client still writes its requests reads "Internal error from
# Core" (INTERNAL) from its own failed SendMessageOperation; the server's access line
# says DEADLINE_EXCEEDED (3 of 400 calls, measured).
CLIENT_WRITE_FAILED = "CLIENT_WRITE_FAILED"
CUT_SHORT = frozenset({"OK", "CANCELLED", "DEADLINE_EXCEEDED", CLIENT_WRITE_FAILED})
WATCHED_SERVICES = ("", "inferwire.v1.InferenceService", "model/demo", "model/spare")
STREAM_POINTS = ("before-first", "after-first", "at-last", "random-time", "deadline")
MAX_TOKENS = 12


@dataclass
class Caller:
    """How the tests reach one server: its address, TLS credentials and token (if any)."""

    server: ServerProcess
    credentials: grpc.ChannelCredentials | None = None
    metadata: tuple[tuple[str, str], ...] = ()
    # Also calls that the server refuses before any handler runs (no token).
    refused_metadata: tuple[tuple[str, str], ...] | None = None
    codes: Counter[str] = field(default_factory=Counter)
    answered: int = 0  # Watch calls that got a status: the server surely served them

    def channel(self, options: list[tuple[str, Any]] | None = None) -> grpc.aio.Channel:
        if self.credentials is None:
            return grpc.aio.insecure_channel(self.server.target, options=options)
        return grpc.aio.secure_channel(self.server.target, self.credentials, options=options)

    def pick_metadata(self, rng: random.Random) -> tuple[tuple[str, str], ...]:
        if self.refused_metadata is not None and rng.random() < 0.2:
            return self.refused_metadata
        return self.metadata

    def count(self, kind: str, code: str) -> None:
        self.codes[f"{kind} {code}"] += 1

    def unexpected(self) -> dict[str, int]:
        """The counts of codes other than CUT_SHORT's (and the refusal, when asked for)."""
        allowed = CUT_SHORT | ({"UNAUTHENTICATED"} if self.refused_metadata is not None else set())
        return {k: n for k, n in self.codes.items() if k.rsplit(" ", 1)[1] not in allowed}


async def _code_of(call: Awaitable[Any]) -> str:
    """The name of the code `call` ended with (see CLIENT_WRITE_FAILED)."""
    try:
        await call
        return "OK"
    except grpc.aio.AioRpcError as error:
        if error.code() is Code.INTERNAL and "SendMessageOperation" in (
            error.debug_error_string() or ""
        ):
            return CLIENT_WRITE_FAILED
        return error.code().name
    except asyncio.CancelledError:
        return "CANCELLED"


async def run_bounded(count: int, concurrency: int, one: Callable[[int], Awaitable[None]]) -> None:
    """`one(i)` for i in range(count), at most `concurrency` at once."""
    indexes = iter(range(count))

    async def worker() -> None:
        for i in indexes:
            await one(i)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


@contextlib.asynccontextmanager
async def model_churn(caller: Caller, model: str = "spare") -> AsyncIterator[Counter[str]]:
    """Load and unload `model` in a loop while the block runs; yields the counts of each."""
    done = Counter[str]()
    stop = asyncio.Event()

    async def churn() -> None:
        async with caller.channel() as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            while not stop.is_set():
                await stub.LoadModel(
                    pb.LoadModelRequest(model=model), metadata=caller.metadata, timeout=30
                )
                done["loaded"] += 1
                await stub.UnloadModel(
                    pb.UnloadModelRequest(model=model), metadata=caller.metadata, timeout=30
                )
                done["unloaded"] += 1

    task = asyncio.create_task(churn())
    try:
        try:
            yield done
        finally:
            stop.set()
            await task  # raises if a load or unload failed
    except BaseException as error:
        raise AssertionError(crash_report(caller.server)) from error


def crash_report(server: ServerProcess) -> str:
    """The server's exit report, once it has had a moment to end if it is ending."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.process.wait(timeout=2)
    return server.exit_report()


async def cancelled_watches(caller: Caller, count: int, seed: int = 1) -> None:
    """`count` Watch calls over every service name, each ended after one status, after two,
    or by a deadline that passes mid-call."""
    rng = random.Random(seed)
    async with caller.channel() as channel:
        health = health_pb2_grpc.HealthStub(channel)

        async def one(_: int) -> None:
            service = rng.choice(WATCHED_SERVICES)
            how = rng.choice(("one", "two", "deadline"))
            timeout = rng.uniform(0.005, 0.1) if how == "deadline" else 0.5
            call = health.Watch(health_pb2.HealthCheckRequest(service=service), timeout=timeout)

            async def read() -> None:
                await call.read()
                caller.answered += 1
                if how != "one":
                    await call.read()
                call.cancel()

            caller.count(f"Watch/{how}", await _code_of(read()))

        await run_bounded(count, 16, one)


async def health_checked_channels(caller: Caller, count: int, seed: int = 2) -> None:
    """`count` channels with client-side health checking (round_robin, `healthCheckConfig`)
    opened, used once and closed: each opens a Watch that its closing cancels."""
    rng = random.Random(seed)

    async def one(_: int) -> None:
        service = rng.choice(("model/demo", "model/spare", ""))
        config = {
            "loadBalancingConfig": [{"round_robin": {}}],
            "healthCheckConfig": {"serviceName": service},
        }
        # A subchannel pool of its own: each channel connects (and health-checks) anew.
        options = [
            ("grpc.service_config", json.dumps(config)),
            ("grpc.use_local_subchannel_pool", 1),
        ]
        async with caller.channel(options) as channel:
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            call = stub.ListModels(pb.ListModelsRequest(), metadata=caller.metadata, timeout=0.5)
            code = await _code_of(call)
            # model/spare is NOT_SERVING half the time: no subchannel to pick (UNAVAILABLE),
            # or none yet when the deadline passes.
            caller.count(f"health-checked/{service or 'server'}", code)
            await asyncio.sleep(rng.uniform(0, 0.02))

    await run_bounded(count, 8, one)


async def _cut_short(
    caller: Caller, kind: str, rng: random.Random, make_call: Callable[[float], Any]
) -> None:
    """One streaming call, cancelled at a random point of STREAM_POINTS."""
    point = rng.choice(STREAM_POINTS)
    timeout = rng.uniform(0.002, 0.05) if point == "deadline" else 30
    call = make_call(timeout)

    async def drive() -> None:
        if point == "before-first":
            await asyncio.sleep(rng.choice((0, 0, 0.001, 0.003)))
            call.cancel()
        elif point == "random-time":
            await asyncio.sleep(rng.uniform(0, 0.03))
            call.cancel()
        elif point == "after-first":
            await call.read()
            call.cancel()
        await _read_to_end(call, cancel_at_last=point == "at-last")

    caller.count(f"{kind}/{point}", await _code_of(drive()))


async def _read_to_end(call: Any, cancel_at_last: bool) -> None:
    while (message := await call.read()) is not grpc.aio.EOF:
        if cancel_at_last and _is_last(message):
            call.cancel()  # as the server sends its status


def _is_last(message: Any) -> bool:
    if isinstance(message, pb.InferStreamResponse):
        return message.finish_reason != pb.FINISH_REASON_UNSPECIFIED
    if hasattr(message, "infer_response"):
        final = message.infer_response.parameters.get("triton_final_response")
        return bool(final and final.bool_param)
    return True  # a reflection response: each one ends its request


async def cancelled_streams(caller: Caller, count: int, seed: int = 3) -> None:
    """`count` streaming calls, about 60% InferStream, 20% ModelStreamInfer and 20%
    reflection, each cut short at a point of STREAM_POINTS."""
    rng = random.Random(seed)
    async with caller.channel() as channel:
        inference = inference_pb2_grpc.InferenceServiceStub(channel)
        kserve = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        reflect, reflection_request = reflection_stream(channel, rng.choice((V1, V1ALPHA)))
        parameters = pb.GenerationParameters(max_tokens=MAX_TOKENS)

        def infer_stream(timeout: float) -> Any:
            request = pb.InferStreamRequest(model="demo", prompt="ROMEO:", parameters=parameters)
            return inference.InferStream(
                request, timeout=timeout, metadata=caller.pick_metadata(rng)
            )

        def model_stream_infer(timeout: float) -> Any:
            sampling = {"max_tokens": MAX_TOKENS}
            requests = [kserve_request("JULIET:", sampling, stream=True, id=f"s{i}") for i in "ab"]
            return kserve.ModelStreamInfer(
                iter(requests), timeout=timeout, metadata=caller.pick_metadata(rng)
            )

        def reflection(timeout: float) -> Any:
            requests = [reflection_request(list_services="") for _ in range(3)]
            return reflect(iter(requests), timeout=timeout)

        async def one(_: int) -> None:
            roll = rng.random()
            if roll < 0.6:
                await _cut_short(caller, "InferStream", rng, infer_stream)
            elif roll < 0.8:
                await _cut_short(caller, "ModelStreamInfer", rng, model_stream_infer)
            else:
                await _cut_short(caller, "Reflection", rng, reflection)

        await run_bounded(count, 16, one)


async def assert_alive_and_serving(caller: Caller) -> None:
    """The process is running and reports `model/demo` SERVING, or the failure says how
    it ended (exit status, faulthandler stack)."""
    assert caller.server.process.poll() is None, caller.server.exit_report()
    async with caller.channel() as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = await health.Check(health_pb2.HealthCheckRequest(service="model/demo"), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING, caller.server.exit_report()

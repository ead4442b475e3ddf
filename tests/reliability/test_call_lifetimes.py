"""Clients that leave early never crash the server (issue 31): thousands of cancelled Watch
calls during model churn, health-checked channels opened and closed, streams cancelled at
every point, on a plain server and on one with mutual TLS and a tokens file (see
lifetimes.py). Each test ends with the process alive and `model/demo` SERVING; a failure
prints the server's exit status and faulthandler stack. The codes seen are printed in
pytest's summary."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import grpc
import pytest

from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.reliability.lifetimes import (
    Caller,
    assert_alive_and_serving,
    cancelled_streams,
    cancelled_watches,
    health_checked_channels,
    model_churn,
)
from tests.support import figures
from tests.support.auth import bearer, tokens_yaml
from tests.support.certs import write_pki
from tests.support.process import start_serving_server, stop_server_process

MODELS = """\
models:
  - {name: demo, load_on_startup: true, options: {path: builtin}}
  - {name: spare, options: {path: builtin}}
  - {name: wide, load_on_startup: true, max_queue: 1100, options: {path: builtin}}
  - name: narrow
    load_on_startup: true
    max_concurrency: 2
    max_queue: 4
    options: {path: builtin}
"""
PLAIN = "server:\n  grace_period_s: 1\n" + MODELS
ADMIN_TOKEN, WRONG_TOKEN = "iwt_lifetimes_admin", "iwt_not_a_known_token"
# Calls with no token run as the client certificate's tenant (reading the call's
# auth_context); a wrong token is refused before any handler runs.
GUARDED = """\
server:
  grace_period_s: 1
  tenants: [{{name: certified}}]
  auth:
    tokens_file: {tokens}
    anonymous_scopes: [infer]
    certificate_tenants: {{test-client: certified}}
"""


@contextlib.contextmanager
def counted(caller: Caller, request: pytest.FixtureRequest) -> Iterator[Caller]:
    """The block's calls counted afresh, and printed in pytest's summary under the test."""
    caller.codes.clear()
    try:
        yield caller
    finally:
        figures.record_counts(f"call lifetimes: {request.node.name}", caller.codes)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Caller]:
    config = tmp_path_factory.mktemp("lifetimes") / "inferwire.yaml"
    config.write_text(PLAIN)
    caller = Caller(start_serving_server("--config", str(config)))
    try:
        yield caller
    finally:
        stop_server_process(caller.server)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Caller]:
    directory = tmp_path_factory.mktemp("lifetimes-guarded")
    pki = write_pki(directory)
    tokens = directory / "tokens.yaml"
    tokens.write_text(tokens_yaml({"operator": (ADMIN_TOKEN, ["admin"], None)}))
    config = directory / "inferwire.yaml"
    config.write_text(GUARDED.format(tokens=tokens) + MODELS)
    credentials = grpc.ssl_channel_credentials(
        pki.ca.read_bytes(), pki.client_key.read_bytes(), pki.client_cert.read_bytes()
    )
    server = start_serving_server(
        "--config", str(config), env=pki.server_env(mutual=True), credentials=credentials
    )
    caller = Caller(server, credentials, bearer(ADMIN_TOKEN), refused_metadata=bearer(WRONG_TOKEN))
    try:
        yield caller
    finally:
        stop_server_process(caller.server)


def _watch_calls(caller: Caller) -> int:
    return sum('"/grpc.health.v1.Health/Watch"' in line for line in caller.server.log_lines)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("name", "watches"), [("plain", 2000), ("guarded", 500)])
async def test_cancelled_watch_calls_during_load_and_unload_leave_the_server_serving(
    request, name, watches
):
    caller: Caller = request.getfixturevalue(name)
    before, answered_before = _watch_calls(caller), caller.answered
    with counted(caller, request):
        async with model_churn(caller) as churned:
            await cancelled_watches(caller, watches)
    await assert_alive_and_serving(caller)
    assert churned["unloaded"] >= 3, churned  # the statuses really changed meanwhile
    assert caller.unexpected() == {}
    await asyncio.sleep(0.5)  # the last access lines
    # Every call that got a status was served (some deadlines pass before the server sees
    # the call), and wrote its access line when it was cut short.
    assert _watch_calls(caller) - before >= caller.answered - answered_before > watches / 2


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("name", "channels"), [("plain", 200), ("guarded", 50)])
async def test_channels_with_client_side_health_checking_opened_and_closed(request, name, channels):
    caller: Caller = request.getfixturevalue(name)
    before = _watch_calls(caller)
    with counted(caller, request):
        async with model_churn(caller):
            await health_checked_channels(caller, channels)
    await assert_alive_and_serving(caller)
    # model/spare is NOT_SERVING while unloaded: then its channel has no subchannel to pick.
    spare = {k for k in caller.codes if k.startswith("health-checked/model/spare")}
    assert caller.unexpected() == {k: caller.codes[k] for k in spare if k.endswith("UNAVAILABLE")}
    assert caller.codes["health-checked/model/demo OK"] > 0, caller.codes
    await asyncio.sleep(0.5)
    # Each channel's health checking opened (at least) one Watch, and its close ended it.
    assert _watch_calls(caller) - before >= channels


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("name", "streams"), [("plain", 1000), ("guarded", 300)])
async def test_streams_cancelled_at_every_point_leave_the_server_serving(request, name, streams):
    caller: Caller = request.getfixturevalue(name)
    with counted(caller, request):
        async with model_churn(caller):
            await cancelled_streams(caller, streams)
    await assert_alive_and_serving(caller)
    assert caller.unexpected() == {}
    kinds = {key.split("/")[0] for key in caller.codes}
    assert {"InferStream", "ModelStreamInfer", "Reflection"} <= kinds


async def _burst(caller: Caller, model: str, streams: int) -> dict[str, int]:
    """`streams` InferStream calls opened at once on one new channel; their codes."""
    parameters = pb.GenerationParameters(max_tokens=16)
    async with caller.channel() as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)

        async def one() -> str:
            request = pb.InferStreamRequest(model=model, prompt="ROMEO:", parameters=parameters)
            try:
                async for _ in stub.InferStream(request, metadata=caller.metadata, timeout=300):
                    pass
                return "OK"
            except grpc.aio.AioRpcError as error:
                return error.code().name

        codes = await asyncio.gather(*(one() for _ in range(streams)))
    return {code: codes.count(code) for code in set(codes)}


@pytest.mark.timeout(600)
async def test_a_thousand_streams_on_one_channel_reach_admission(plain):
    # `wide` queues up to 1,100: every stream ends OK. `demo` has the default queue (64):
    # each ends OK or RESOURCE_EXHAUSTED, never UNAVAILABLE (an HTTP/2 refusal) or
    # CANCELLED (grpc giving up on a call the server had not picked up yet).
    wide = await _burst(plain, "wide", 1000)
    figures.record("a thousand streams on one channel", f"max_queue 1100: {wide}")
    assert wide == {"OK": 1000}, plain.server.exit_report()
    default = await _burst(plain, "demo", 1000)
    figures.record("a thousand streams on one channel", f"max_queue 64 (default): {default}")
    assert set(default) <= {"OK", "RESOURCE_EXHAUSTED"}, default  # how many of each: timing
    assert default.get("OK", 0) >= 64, default
    # `narrow` (2 slots, 4 queued) cannot take a burst: the refusals are admission's.
    narrow = await _burst(plain, "narrow", 1000)
    figures.record("a thousand streams on one channel", f"max_queue 4: {narrow}")
    assert set(narrow) == {"OK", "RESOURCE_EXHAUSTED"}, narrow
    await assert_alive_and_serving(plain)

"""Fixtures of the faults tier (see rig.py): a real Toxiproxy, two real tritonservers and
an in-process gateway, started once for the tier; the proxies' toxics are removed after
every test, whatever it did."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2_grpc

from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2_grpc
from tests.faults.rig import (
    FIGURES,
    SERVING,
    TOKEN_DELAY_S,
    TRITON_MODELS,
    Rig,
    gateway_settings,
    start_default_executor_workers,
)
from tests.support.engine import RequestLogRecords
from tests.support.toxiproxy import SKIP_REASON as NO_TOXIPROXY
from tests.support.toxiproxy import TOXIPROXY_SERVER, Toxiproxy
from tests.support.triton import SKIP_REASON as NO_TRITON
from tests.support.triton import TRITON_DIR, TritonServer, prepare_python_backend


@pytest.fixture(scope="package")
def toxiproxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Toxiproxy]:
    if TOXIPROXY_SERVER is None:
        pytest.skip(NO_TOXIPROXY)
    server = Toxiproxy.start(tmp_path_factory.mktemp("toxiproxy"))
    yield server
    server.stop()


@pytest.fixture(scope="package")
def tritons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, TritonServer]]:
    if TRITON_DIR is None:
        pytest.skip(NO_TRITON)
    prepare_python_backend(TRITON_DIR)
    record_dir = tmp_path_factory.mktemp("fault-records")
    delay = {"INFERWIRE_TRITON_TOKEN_DELAY_S": str(TOKEN_DELAY_S)}
    servers = {
        name: TritonServer(record_dir, load_models=("vllm_echo",), extra_env=delay)
        for name in ("a", "b")
    }
    with contextlib.ExitStack() as running:
        for server in servers.values():
            running.enter_context(server)
        yield servers


@pytest.fixture(scope="package")
async def rig(toxiproxy: Toxiproxy, tritons: dict[str, TritonServer]) -> AsyncIterator[Rig]:
    proxies = {name: toxiproxy.proxy(f"triton_{name}", t.url) for name, t in tritons.items()}
    gateway = InferwireServer(gateway_settings(proxies["a"], proxies["b"]))
    await gateway.start()
    try:
        proxies["client"] = toxiproxy.proxy("client", f"127.0.0.1:{gateway.port}")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel:
            rig = Rig(
                gateway,
                tritons,
                proxies,
                inference_pb2_grpc.InferenceServiceStub(channel),
                health_pb2_grpc.HealthStub(channel),
            )
            # Warm up whatever starts lazily, so that each test's footprint is comparable.
            await start_default_executor_workers()
            for model in TRITON_MODELS:
                assert await rig.status(model) == SERVING
                for _ in range(2):
                    await rig.infer(model)
            await rig.infer("demo")
            yield rig
    finally:
        await gateway.stop(grace_s=1)


@pytest.fixture(autouse=True)
def clean_links(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "rig" in request.fixturenames:
        for proxy in request.getfixturevalue("rig").proxies.values():
            proxy.clear()


@pytest.fixture
async def client_link(rig: Rig) -> AsyncIterator[inference_pb2_grpc.InferenceServiceStub]:
    """A client connected to the gateway through the `client` proxy."""
    async with grpc.aio.insecure_channel(rig.proxies["client"].listen) as channel:
        await channel.channel_ready()  # connected before the test takes its baseline
        yield inference_pb2_grpc.InferenceServiceStub(channel)


@pytest.fixture
def request_log(caplog: pytest.LogCaptureFixture) -> RequestLogRecords:
    caplog.set_level(logging.INFO, logger="inferwire.access")
    return RequestLogRecords(caplog)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print what the fault tests measured (rig.FIGURES)."""
    for title, line in FIGURES:
        terminalreporter.write_sep("-", f"fault: {title}")
        terminalreporter.write_line(line)

"""The gateway tier: three real `inferwire serve` replicas behind llm-d's real endpoint
picker (EPP v0.10.0, built from ../shared/vendor by scripts/build_epp.sh), with the
configuration of deploy/gateway, and the test in Envoy's place (tests/support/envoy.py).

The replicas listen on 127.0.0.11, .12 and .13 with the same HTTP and metrics ports, as
pods do (the ports of the first, bound on :0). Each runs deploy/gateway/inferwire.yaml with
what a pod gets from its Secrets and nothing a test cannot have (no TLS, a tokens file
here, loopback addresses), and these models: on the simulator backend `chat` (the routed
requests), `gate` (one stream at a time, so more make a backlog) and `long` (slow streams
that hold KV cache); the bundled `demo` and its adapter `demo-sonnets`, resident on the
first replica only (on demand elsewhere)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml

from inferwire.core.auth import hash_token
from inferwire.model_config import default_models
from tests.support import envoy as envoy_support
from tests.support import epp
from tests.support.process import ServerProcess, start_serving_server, stop_server_process

ADDRESSES = ("127.0.0.11", "127.0.0.12", "127.0.0.13")
TOKENS = {"inference-gateway": "iwt_gateway_token", "client": "iwt_client_token"}
GATEWAY_AUTH = {"authorization": f"Bearer {TOKENS['inference-gateway']}"}
ADAPTER = default_models()[1].options["adapter_file"]
MODELS = """\
- name: chat
  backend: simulator
  load_on_startup: true
  max_concurrency: 2
  max_queue: 64
  options: {{time_to_first_token_ms: 20, inter_token_ms: 15, context_length: 512}}
- name: gate
  backend: simulator
  load_on_startup: true
  max_concurrency: 1
  max_queue: 16
  options: {{time_to_first_token_ms: 20, inter_token_ms: 500, context_length: 64}}
- name: long
  backend: simulator
  load_on_startup: true
  max_concurrency: 2
  reserved_concurrency: {{}}  # both slots for its streams: running, none waiting
  options: {{time_to_first_token_ms: 20, inter_token_ms: 200, context_length: 512}}
- {{name: demo, load_on_startup: {resident}, on_demand: true, options: {{path: builtin}}}}
- name: demo-sonnets
  adapter_of: demo
  load_on_startup: {resident}
  on_demand: true
  options: {{adapter_file: {adapter}}}
"""


@dataclass
class Replica:
    name: str
    address: str
    server: ServerProcess
    http_port: int
    metrics_port: int

    @property
    def endpoint(self) -> str:
        """What the picker names it by: address and pool port."""
        return f"{self.address}:{self.http_port}"

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"


def replica_config(directory: Path, resident: bool) -> Path:
    """deploy/gateway/inferwire.yaml for a test pod: its objectives, drain timings and
    gateway rules as shipped; no TLS; the tokens file, tenants and models here."""
    config = yaml.safe_load((epp.GATEWAY / "inferwire.yaml").read_text())
    server = config["server"]
    for key in ("tls", "health_address"):
        server.pop(key)
    tokens = directory / "tokens.yaml"
    tokens.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "inference-gateway",
                    "sha256": hash_token(TOKENS["inference-gateway"]),
                    "scopes": ["infer", "gateway"],
                },
                {"name": "client", "sha256": hash_token(TOKENS["client"]), "scopes": ["infer"]},
            ]
        )
    )
    server["auth"]["tokens_file"] = str(tokens)
    server["tenants"] = [{"name": "team-a", "priority": "interactive"}]
    flag = "true" if resident else "false"
    config["models"] = yaml.safe_load(MODELS.format(resident=flag, adapter=ADAPTER))
    path = directory / "inferwire.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def start_replica(name: str, address: str, config: Path, ports: tuple[int, int]) -> Replica:
    http_port, metrics_port = ports
    server = start_serving_server(
        "--config",
        str(config),
        env={
            "INFERWIRE_SERVER__HTTP_ADDRESS": f"{address}:{http_port}",
            "INFERWIRE_SERVER__METRICS_ADDRESS": f"{address}:{metrics_port}",
        },
    )
    (metrics,) = [
        json.loads(line)["port"] for line in server.log_lines if '"metrics listening"' in line
    ]
    assert server.http_port is not None
    return Replica(name, address, server, server.http_port, metrics)


@pytest.fixture(scope="session")
def picker_binary() -> Path:
    return epp.picker_binary()


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory, picker_binary: Path
) -> Iterator[list[Replica]]:
    started: list[Replica] = []
    try:
        for index, address in enumerate(ADDRESSES):
            name = f"pod-{index}"
            config = replica_config(tmp_path_factory.mktemp(name), resident=index == 0)
            ports = (0, 0) if not started else (started[0].http_port, started[0].metrics_port)
            started.append(start_replica(name, address, config, ports))
        yield started
    finally:
        for replica in started:  # all drain at once (shutdown_delay_s each)
            if replica.server.process.poll() is None:
                replica.server.process.terminate()
        for replica in started:
            try:
                replica.server.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                stop_server_process(replica.server)  # SIGKILL: the assertion below says so
        for replica in started:  # a replica stopped by a test has already exited
            assert replica.server.process.returncode == 0, replica.server.exit_report()


@pytest.fixture(scope="module")
def picker(
    tmp_path_factory: pytest.TempPathFactory, picker_binary: Path, replicas: list[Replica]
) -> Iterator[epp.PickerProcess]:
    pods = {r.name: (r.address, r.http_port) for r in replicas}
    with epp.running_picker(
        picker_binary,
        tmp_path_factory.mktemp("picker"),
        pods,
        lambda endpoints: epp.picker_config(endpoints, replicas[0].metrics_port),
    ) as process:
        yield process


@pytest.fixture
async def gateway(picker: epp.PickerProcess) -> AsyncIterator[envoy_support.Envoy]:
    limits = httpx.Limits(max_connections=64)
    async with (
        grpc.aio.insecure_channel(picker.ext_proc_target) as channel,
        httpx.AsyncClient(timeout=60, limits=limits) as http,
    ):
        yield envoy_support.Envoy(channel, http)


class Streams:
    """Long streams sent straight to a replica (not through the gateway), to load it;
    closing them cancels them on the server."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http
        self._tasks: list[asyncio.Task[None]] = []

    def open(self, replica: Replica, model: str, count: int, prompt: str = "one two") -> None:
        """`count` streams of `model` on `replica`, as long as its context allows."""
        max_tokens = 60 if model == "gate" else 300
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True}
        for _ in range(count):
            self._tasks.append(asyncio.create_task(self._stream(replica.url, body)))

    async def _stream(self, url: str, body: dict[str, Any]) -> None:
        async with self._http.stream(
            "POST", url + "/v1/completions", json=body, headers=GATEWAY_AUTH
        ) as reply:
            assert reply.status_code == 200, await reply.aread()
            async for _ in reply.aiter_lines():
                pass

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()


@pytest.fixture
async def streams() -> AsyncIterator[Streams]:
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=64)) as http:
        opened = Streams(http)
        try:
            yield opened
        finally:
            await opened.close()


async def wait_for(predicate: Any, timeout_s: float = 30, what: str = "condition") -> None:
    """Poll a (sync or async) predicate, with a bound."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout_s} s")
        await asyncio.sleep(0.05)

"""The cluster bench/routing_prefix.py routes over: three SmolLM2 (or demo) replicas with KV
events on, as tests/support/kv_routing.py starts them, llm-d's real picker in a given
configuration, the test's Envoy streaming each reply, and the replicas' readings
(prompt-cache counters, CPU)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import httpx
import yaml
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from prometheus_client.parser import text_string_to_metric_families

from bench import cpu
from bench.peers_multiturn import read_event
from tests.support import envoy as envoy_support
from tests.support import epp, kv_routing
from tests.support.kv_routing import ADDRESSES, precise_config
from tests.support.process import (
    ServerProcess,
    stop_server_process,
)

REPO = Path(__file__).resolve().parents[1]
CHAT = "/v1/chat/completions"
MODEL_ENV = "INFERWIRE_ROUTING_MODEL"


def model_choice() -> tuple[str, dict[str, Any], int]:
    """(request name, the replicas' model entry less max_concurrency, USER_WORDS)."""
    if os.environ.get(MODEL_ENV, "smollm2") == "demo":
        return "demo", {"name": "demo", "load_on_startup": True}, 20
    path = REPO / ".cache" / "models" / "smollm2"
    if not (path / "genai_config.json").is_file():
        raise RuntimeError(f"{path}: missing; `make smollm2` imports it")
    entry = {
        "name": "smollm2",
        "load_on_startup": True,
        # A conversation's whole history (turn 5: under 1,000 tokens) plus the reply.
        "options": {"path": str(path), "threads": 1, "slot_tokens": 1536},
    }
    return "smollm2", entry, 80


# ---- the replicas and the picker --------------------------------------------------


def start_replica(
    directory: Path, address: str, ports: dict[str, int], entry: dict[str, Any]
) -> tuple[ServerProcess, dict[str, int]]:
    """A replica as tests/support/kv_routing.start makes one (KV events and their replay
    socket on, the first's ports for the others), serving `entry`."""
    return kv_routing.start(directory, address, ports, entry=entry)


@contextmanager
def replicas(
    directory: Path, entry: dict[str, Any]
) -> Iterator[tuple[dict[str, ServerProcess], dict[str, int]]]:
    """The three replicas, by endpoint (address:HTTP port), and their common ports."""
    servers: dict[str, ServerProcess] = {}
    ports: dict[str, int] = {}
    try:
        for index, address in enumerate(ADDRESSES):
            pod = directory / f"pod-{index}"
            pod.mkdir()
            server, ports = start_replica(pod, address, ports, entry)
            servers[f"{address}:{ports['http']}"] = server
        yield servers, ports
    finally:
        for server in servers.values():
            stop_server_process(server, graceful=True)


def picker_binary() -> Path:
    """scripts/build_epp.sh's cached binary (built on first use: Go, several minutes)."""
    built = subprocess.run(
        [str(REPO / "scripts" / "build_epp.sh")],
        capture_output=True,
        text=True,
        timeout=epp.BUILD_TIMEOUT_S,
    )
    if built.returncode != 0:
        raise RuntimeError(f"build_epp.sh failed:\n{built.stderr[-3000:]}")
    return Path(built.stdout.strip().splitlines()[-1])


def picker_config(kind: str, endpoints: Path, ports: dict[str, int], model: str) -> dict[str, Any]:
    """deploy/gateway/epp-config.yaml as the tests run it, less its prefix scorer
    (`blind`), as shipped (`approximate`) or with the precise producer (`precise`)."""
    if kind == "precise":
        config = precise_config(endpoints, ports)
        (producer,) = [p for p in config["plugins"] if p["type"] == "token-producer"]
        producer["parameters"]["modelName"] = model
        return config
    config = epp.picker_config(endpoints, ports["metrics"])
    if kind == "blind":
        config["plugins"] = [p for p in config["plugins"] if p["type"] != "prefix-cache-scorer"]
        (profile,) = config["schedulingProfiles"]
        profile["plugins"] = [
            p for p in profile["plugins"] if p["pluginRef"] != "prefix-cache-scorer"
        ]
    return config


def start_picker(
    binary: Path, directory: Path, kind: str, config: dict[str, Any]
) -> epp.PickerProcess:
    path = directory / f"epp-config-{kind}.yaml"
    path.write_text(yaml.safe_dump(config))
    return epp.start_picker(binary, path)


# ---- Envoy, streamed --------------------------------------------------------------


class StreamingEnvoy(envoy_support.Envoy):
    """tests/support/envoy.py's gateway, with the replica's answer streamed and timed."""

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """One streamed turn through the picker: the replica, TTFT (ms, from asking the
        picker), the picker's part of it, the reply's text and the prompt's tokens."""
        call = ext_proc_grpc.ExternalProcessorStub(self.channel).Process()
        started = time.perf_counter()
        try:
            decision = await self._decide(call, CHAT, json.dumps(body).encode(), {})
            decided = time.perf_counter()
            first, pieces, raw, prompt_tokens = 0.0, [], bytearray(), 0
            url = f"http://{decision.endpoint}{CHAT}"
            async with self.http.stream(
                "POST", url, content=decision.body, headers=decision.headers
            ) as response:
                if response.status_code != 200:
                    detail = (await response.aread()).decode(errors="replace")
                    raise RuntimeError(f"{decision.endpoint}: HTTP {response.status_code} {detail}")
                buffered = b""
                async for data in response.aiter_bytes():
                    raw += data
                    buffered += data
                    *lines, buffered = buffered.split(b"\n")
                    for line in lines:
                        counted, texts = read_event(line.decode())
                        prompt_tokens = counted if counted is not None else prompt_tokens
                        if texts:
                            first = first or time.perf_counter()
                            pieces += texts
                reply = SimpleNamespace(
                    status_code=response.status_code,
                    headers=response.headers,
                    content=bytes(raw),
                )
            await self._report(call, reply)
        finally:
            call.cancel()
        if not first:
            raise RuntimeError(f"{decision.endpoint}: a turn streamed no text")
        return {
            "endpoint": decision.endpoint,
            "ttft_ms": (first - started) * 1e3,
            "picker_ms": (decided - started) * 1e3,
            "reply": "".join(pieces),
            "prompt_tokens": prompt_tokens,
        }


async def wait_scoring_all(gateway: StreamingEnvoy, model: str, count: int) -> None:
    """Until the picker scores every replica (its first scrapes of their metrics)."""
    probe = {"model": model, "messages": [{"role": "user", "content": "probe"}], "max_tokens": 1}
    deadline = time.monotonic() + 60
    while True:
        try:
            if len((await gateway.decide(CHAT, probe)).scores) == count:
                return
        except envoy_support.PickerRefused:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the picker never scored every replica")
        await asyncio.sleep(0.1)


def wait_replayed(picker: epp.PickerProcess, count: int) -> None:
    """Until the precise producer subscribed to every replica (and caught up)."""
    deadline = time.monotonic() + 60
    while sum('"Replay complete"' in line for line in picker.log_lines) < count:
        if picker.process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the precise producer never caught up:\n" + picker.exit_report())
        time.sleep(0.1)


async def picker_ready(picker: epp.PickerProcess, model: str) -> None:
    """Until the picker scores every replica (its first scrapes of their metrics)."""
    async with (
        grpc.aio.insecure_channel(picker.ext_proc_target) as channel,
        httpx.AsyncClient() as http,
    ):
        await wait_scoring_all(StreamingEnvoy(channel, http), model, len(ADDRESSES))


# ---- readings -----------------------------------------------------------------------


def prompt_cache(servers: dict[str, ServerProcess], metrics_port: int) -> dict[str, list[float]]:
    """Each replica's (prompt tokens, reused tokens) counters."""
    found = {}
    for endpoint in servers:
        address = endpoint.split(":")[0]
        text = httpx.get(f"http://{address}:{metrics_port}/metrics", timeout=10).text
        values = {"prompt": 0.0, "reused": 0.0}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "inferwire_prompt_cache_prompt_tokens_total":
                    values["prompt"] += sample.value
                elif sample.name == "inferwire_prompt_cache_reused_tokens_total":
                    values["reused"] += sample.value
        found[endpoint] = [values["prompt"], values["reused"]]
    return found


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    return {name: cpu.snapshot(pid).total_ns / 1e9 for name, pid in pids.items()}

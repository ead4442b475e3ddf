"""Replicas of the bundled model that publish KV events, and llm-d's picker scoring them
with its precise prefix-cache producer: what tests/gateway/test_precise_prefix.py and
test_conversations.py share. `Cluster` holds the three replicas and a picker that a test
may restart, with its endpoints file watched as the picker's `file-discovery` plugin
does on `watchFile: true`, so that a pod can leave it as it leaves an InferencePool."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import httpx
import yaml

from tests.support import envoy as envoy_support
from tests.support import epp
from tests.support.process import ServerProcess, start_serving_server, stop_server_process

ADDRESSES = ("127.0.0.11", "127.0.0.12", "127.0.0.13")  # as tests/gateway/conftest.py
CONFIG = """\
server:
  address: 127.0.0.1:0
  grace_period_s: 1
models:
  - {{name: demo, load_on_startup: true, max_concurrency: {slots}}}
"""


def start(
    directory: Path,
    address: str,
    ports: dict[str, int],
    slots: int = 4,
    entry: dict[str, Any] | None = None,
) -> tuple[ServerProcess, dict]:
    """A replica on `address`, on `ports` (those of the first; 0 for the first) or 0, with
    `slots` requests at once (the continuous path's slots: its prompts' caches) of the demo
    model, or serving the model `entry` (bench/routing_cluster.py's)."""
    config = directory / "inferwire.yaml"
    if entry is None:
        config.write_text(CONFIG.format(slots=slots))
    else:  # JSON is YAML
        server = {"address": "127.0.0.1:0", "grace_period_s": 1}
        config.write_text(json.dumps({"server": server, "models": [entry]}))
    kv = {name: ports.get(name, "*") for name in ("events", "replay")}
    server = start_serving_server(
        "--config",
        str(config),
        env={
            "INFERWIRE_SERVER__HTTP_ADDRESS": f"{address}:{ports.get('http', 0)}",
            "INFERWIRE_SERVER__METRICS_ADDRESS": f"{address}:{ports.get('metrics', 0)}",
            "INFERWIRE_SERVER__KV_EVENTS__ENDPOINT": f"tcp://{address}:{kv['events']}",
            "INFERWIRE_SERVER__KV_EVENTS__REPLAY_ENDPOINT": f"tcp://{address}:{kv['replay']}",
        },
    )
    logged = [json.loads(line) for line in server.log_lines if line.startswith("{")]
    (published,) = [e for e in logged if e.get("msg") == "kv events publishing"]
    (metrics,) = [e["port"] for e in logged if e.get("msg") == "metrics listening"]
    assert server.http_port is not None
    return server, {
        "http": server.http_port,
        "metrics": metrics,
        "events": int(published["endpoint"].rsplit(":", 1)[1]),
        "replay": int(published["replay_endpoint"].rsplit(":", 1)[1]),
    }


def precise_config(endpoints: Path, ports: dict[str, int]) -> dict[str, Any]:
    """The shipped configuration with its prefix scorer fed by the precise producer, as
    deploy/gateway/epp-config.yaml's comments show it."""
    config = epp.picker_config(endpoints, ports["metrics"])
    plugins = config["plugins"]
    (scorer,) = [p for p in plugins if p["type"] == "prefix-cache-scorer"]
    scorer["parameters"] = {"prefixMatchInfoProducerName": "precise-prefix-cache-producer"}
    at = plugins.index(scorer)
    plugins[at:at] = [
        {
            "type": "token-producer",
            "parameters": {
                "modelName": "demo",
                "vllm": {"url": f"http://{ADDRESSES[0]}:{ports['http']}"},
            },
        },
        {"type": "endpoint-notification-source"},
        {
            "type": "precise-prefix-cache-producer",
            "parameters": {
                "tokenProcessorConfig": {"blockSize": 16},
                "kvEventsConfig": {
                    "topicFilter": "kv@",
                    "discoverPods": True,
                    "podDiscoveryConfig": {
                        "socketPort": ports["events"],
                        "replaySocketPort": ports["replay"],
                    },
                },
            },
        },
    ]
    config["dataLayer"]["sources"].append(
        {
            "pluginRef": "endpoint-notification-source",
            "extractors": [{"pluginRef": "precise-prefix-cache-producer"}],
        }
    )
    return config


def conversation(topic: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": f"You are a storyteller. Every story is about {topic}."},
        {"role": "user", "content": f"Tell me a short story about {topic}, in three lines."},
    ]


async def scored_first(gateway: envoy_support.Envoy, body: dict[str, Any], holder: str) -> bool:
    """Whether the picker scores `holder` alone highest for `body`, without sending it: the
    prefix score lifts the replica holding the first turn once its events arrived."""
    scores = (await gateway.decide("/v1/chat/completions", body)).scores
    best = max(scores.values())
    return scores.get(holder) == best and list(scores.values()).count(best) == 1


def kv_lines(picker: epp.PickerProcess) -> str:
    """What the picker logged of its KV events and tokenizer."""
    words = ("zmq", "replay", "kv", "token", "render", "parse", "error")
    lines = [line for line in picker.log_lines if any(w in line.lower() for w in words)]
    return "".join(line[:400] for line in lines if "EPP received request" not in line)


def requests_served(server: ServerProcess) -> list[str]:
    """The request ids of the HTTP requests a replica's access lines say it finished."""
    ids = []
    for line in list(server.log_lines):
        if '"request finished"' in line and line.startswith("{"):
            entry = json.loads(line)
            if entry.get("logger") == "inferwire.access" and entry.get("request_id"):
                ids.append(entry["request_id"])
    return ids


class Cluster:
    """Three replicas (pod-0..2 on ADDRESSES, the same ports) and the picker on them."""

    def __init__(self, directory: Path, binary: Path, slots: int = 4) -> None:
        self.directory = directory
        self.slots = slots
        self.binary = binary
        self.servers: dict[str, ServerProcess] = {}  # by endpoint, address:port
        self.ports: dict[str, int] = {}
        self.endpoints_file = directory / "endpoints.yaml"
        self.picker: epp.PickerProcess | None = None

    def start_replicas(self) -> None:
        for index, address in enumerate(ADDRESSES):
            pod = self.directory / f"pod-{index}"
            pod.mkdir()
            server, self.ports = start(pod, address, self.ports, self.slots)
            self.servers[f"{address}:{self.ports['http']}"] = server

    def write_endpoints(self, endpoints: list[str]) -> None:
        """The endpoints file, replaced at once (a rename: fsnotify's Create)."""
        pods = {
            f"pod-{ADDRESSES.index(e.split(':')[0])}": (e.split(":")[0], int(e.split(":")[1]))
            for e in endpoints
        }
        staged = self.directory / "endpoints.yaml.new"
        staged.write_text(epp.endpoints_yaml(pods, {epp.ENGINE_LABEL: "vllm"}))
        os.replace(staged, self.endpoints_file)

    def start_picker(self) -> epp.PickerProcess:
        assert self.picker is None
        if not self.endpoints_file.exists():
            self.write_endpoints(list(self.servers))
        config = precise_config(self.endpoints_file, self.ports)
        (discovery,) = [p for p in config["plugins"] if p["type"] == "file-discovery"]
        discovery["parameters"]["watchFile"] = True
        config_file = self.directory / "epp-config.yaml"
        config_file.write_text(yaml.safe_dump(config))
        self.picker = epp.start_picker(self.binary, config_file)
        return self.picker

    def stop_picker(self) -> None:
        """SIGTERM, as the kubelet stops it; it must exit 0."""
        picker, self.picker = self.picker, None
        assert picker is not None
        status = epp.stop_picker(picker.process)
        assert status == 0, picker.exit_report()

    def stop_replica(self, endpoint: str) -> int:
        """SIGTERM to the replica's PID, as the kubelet stops a pod; its exit status."""
        process = self.servers[endpoint].process
        os.kill(process.pid, signal.SIGTERM)
        try:
            return process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            stop_server_process(self.servers[endpoint])
            raise AssertionError("the replica did not exit on SIGTERM") from None

    def served(self, request_id: str) -> list[str]:
        """The endpoints whose replica logged a finished request named `request_id`."""
        return [e for e, s in self.servers.items() if request_id in requests_served(s)]

    @asynccontextmanager
    async def gateway(self) -> AsyncIterator[envoy_support.Envoy]:
        """The test in Envoy's place, on the picker now running."""
        assert self.picker is not None
        async with (
            grpc.aio.insecure_channel(self.picker.ext_proc_target) as channel,
            httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=64)) as http,
        ):
            yield envoy_support.Envoy(channel, http)

    def close(self) -> None:
        """Stop the picker (exit 0) and every replica still running, by PID."""
        try:
            if self.picker is not None:
                self.stop_picker()
        finally:
            for server in self.servers.values():
                stop_server_process(server, graceful=True)

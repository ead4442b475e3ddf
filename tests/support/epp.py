"""llm-d's endpoint picker (EPP) as a real process, built from ../shared/vendor by
scripts/build_epp.sh, and its configuration as deploy/gateway ships it, with the endpoints
read from a file instead of an InferencePool (its `file-discovery` plugin).

The picker binds its three ports on every interface; it is started on port 0 for each and
its log names the two gRPC ones (ext-proc, health); the metrics one is the remaining
listening socket of the process (/proc). INFERWIRE_REQUIRE_EPP=1 (CI) turns "no Go to
build it with" from a skip into a failure."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build_epp.sh"
GATEWAY = REPO / "deploy" / "gateway"
EPP_CONFIG = GATEWAY / "epp-config.yaml"
REQUIRE = "INFERWIRE_REQUIRE_EPP"
BUILD_TIMEOUT_S = 1800  # the first build on 2 cores, modules included
ENGINE_LABEL = "llm-d.ai/engine-type"
# The probes' service in deploy/gateway/epp.yaml.
HEALTH_SERVICE = "inference-extension"


def picker_binary() -> Path:
    """The built picker (cached by the script); skips when Go is missing, unless
    INFERWIRE_REQUIRE_EPP=1, then it fails; any other build failure fails."""
    result = subprocess.run(
        [str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
    )
    if result.returncode != 0:
        why = f"{BUILD_SCRIPT.name} failed:\n{result.stderr[-4000:]}"
        if shutil.which("go") is None and os.environ.get(REQUIRE) != "1":
            pytest.skip(f"the endpoint picker cannot be built without Go ({REQUIRE}=1 fails)")
        pytest.fail(why)
    return Path(result.stdout.strip().splitlines()[-1])


def manifest_config() -> dict[str, Any]:
    """deploy/gateway/epp-config.yaml, as the ConfigMap holds it."""
    return yaml.safe_load(EPP_CONFIG.read_text())


def scorer_weights(config: dict[str, Any]) -> dict[str, float]:
    """The default profile's scorers and their weights."""
    (profile,) = config["schedulingProfiles"]
    return {p["pluginRef"]: p["weight"] for p in profile["plugins"] if "weight" in p}


def picker_config(endpoints_file: Path, metrics_port: int) -> dict[str, Any]:
    """The manifests' configuration as the picker runs here: every plugin, scorer and
    weight as shipped; the endpoints from a file (what the InferencePool watch gives in a
    cluster); the replicas' metrics port, one for all of them as in the pods, in place of
    9464 (tests never bind fixed ports)."""
    config = manifest_config()
    (source,) = [p for p in config["plugins"] if p["type"] == "metrics-data-source"]
    source["parameters"]["port"] = metrics_port
    config["plugins"].append(
        {
            "name": "endpoints-file",
            "type": "file-discovery",
            "parameters": {"path": str(endpoints_file)},
        }
    )
    config["dataLayer"]["discovery"] = {"pluginRef": "endpoints-file"}
    return config


def endpoints_yaml(pods: dict[str, tuple[str, int]], labels: dict[str, str]) -> str:
    """The file-discovery file: each pod's name, address and pool port, and its labels."""
    entries = [
        {"name": name, "address": address, "port": str(port), "labels": labels}
        for name, (address, port) in pods.items()
    ]
    return yaml.safe_dump({"endpoints": entries})


@contextmanager
def running_picker(
    binary: Path,
    directory: Path,
    pods: dict[str, tuple[str, int]],
    config_of: Callable[[Path], dict[str, Any]],
) -> Iterator[PickerProcess]:
    """The picker on `config_of(its endpoints file)`, the endpoints `pods` (name: address
    and pool port, labelled as vLLM pods); stopped at the end, where it must exit 0."""
    endpoints = directory / "endpoints.yaml"
    endpoints.write_text(endpoints_yaml(pods, {ENGINE_LABEL: "vllm"}))
    config = directory / "epp-config.yaml"
    config.write_text(yaml.safe_dump(config_of(endpoints)))
    process = start_picker(binary, config)
    try:
        yield process
    finally:
        status = stop_picker(process.process)
        assert status == 0, process.exit_report()


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on (its sockets' inodes in /proc/net/tcp*)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


@dataclass
class PickerProcess:
    process: subprocess.Popen[str]
    ext_proc_port: int
    health_port: int
    metrics_port: int
    log_lines: list[str] = field(default_factory=list)

    @property
    def ext_proc_target(self) -> str:
        return f"127.0.0.1:{self.ext_proc_port}"

    def metric_samples(self, name: str) -> dict[str, float]:
        """`name`'s samples on the picker's own /metrics, by their endpoint label."""
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).text
        found = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name:
                    found[sample.labels.get("model_server_endpoint", "")] = sample.value
        return found

    def exit_report(self, lines: int = 30) -> str:
        status = self.process.poll()
        shown = [line for line in self.log_lines if '"EPP received request"' not in line]
        return f"picker exit status: {status}\n" + "".join(shown[-lines:])


def start_picker(binary: Path, config_file: Path) -> PickerProcess:
    """Start the picker as deploy/gateway/epp.yaml runs it, less what needs a cluster and
    with its scores emitted; wait until its health service says SERVING."""
    process = subprocess.Popen(
        [
            str(binary),
            "--pool-name=inferwire",
            "--pool-namespace=default",
            "--pool-group=inference.networking.k8s.io",
            f"--config-file={config_file}",
            "--grpc-port=0",
            "--grpc-health-port=0",
            "--metrics-port=0",
            "--zap-encoder=json",
            "--tracing=false",
            # Plaintext ext-proc: the manifests' self-signed TLS has no CA to check here.
            "--secure-serving=false",
            "--enable-pprof=false",
            "--emit-endpoint-scores",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    grpc_ports: dict[str, int] = {}

    def drain() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if '"gRPC server listening"' in line:
                entry = json.loads(line)
                grpc_ports[entry["name"]] = int(entry["port"])

    threading.Thread(target=drain, daemon=True).start()
    try:
        deadline = time.monotonic() + 60
        metrics: set[int] = set()
        while len(grpc_ports) < 2 or len(metrics) != 1:
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("the picker did not start:\n" + "".join(lines[-40:]))
            time.sleep(0.05)
            if len(grpc_ports) == 2:
                metrics = listening_ports(process.pid) - set(grpc_ports.values())
        picker = PickerProcess(
            process, grpc_ports["ext-proc"], grpc_ports["health"], metrics.pop(), lines
        )
        wait_picker_serving(picker, deadline)
    except BaseException:
        stop_picker(process)
        raise
    return picker


def wait_picker_serving(picker: PickerProcess, deadline: float) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{picker.health_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service=HEALTH_SERVICE)
        while health.Check(request, timeout=5).status != health_pb2.HealthCheckResponse.SERVING:
            if time.monotonic() > deadline:
                raise AssertionError("the picker never said SERVING")
            time.sleep(0.05)


def stop_picker(process: subprocess.Popen[str]) -> int:
    """SIGTERM, as the kubelet stops it, then wait; its exit status."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
    return process.returncode

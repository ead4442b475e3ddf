"""The image in the Kubernetes Triton overlay's shape, against a real tritonserver on the host.

One run of the image (image_check.locked_down_container) with a configuration like
deploy/kubernetes/overlays/triton/inferwire.yaml: one model with `backend: triton` and
`discovery: dns`, whose name a real DNS server on the host (tests/support/dns.py)
resolves to a real `tritonserver` on the host (tests/support/triton.py, serving the test
models of tests/triton_models). Tracing is on with the console exporter, so the `otel`
extra runs too, and the `otlp` exporter must be installed. What must hold: the container
loads the model on Triton at start-up, grpc_health_probe sees "" and model/<name>
SERVING, and one Infer through the container reaches the Triton model.

The container shares the host's network (`--network host`): tritonserver and the DNS
server listen on 127.0.0.1 only, which a bridge network cannot reach. inferwire's ports
are free ones on 127.0.0.1, picked here.

Needs the virtualenv (inferwire, dnslib) and `make triton`; image_check imports it lazily,
so `image_check --prepare` stays standard-library only.
"""

from __future__ import annotations

import json
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tests.image import image_check
from tests.image.image_check import log, step
from tests.support.dns import DnsServer
from tests.support.triton import (
    TRITON_DIR,
    TritonServer,
    prepare_python_backend,
    read_record,
)
from tests.triton_models.echo_engine import echo_text

MODEL = "echo"  # the name clients use
TRITON_MODEL = "vllm_echo"  # its name in Triton's repository (tests/triton_models)
TRITON_HOST = "triton.image-check.test"  # resolved by the DNS server started here
CONFIG_DIR = "/etc/inferwire/config"  # where the Kubernetes deployment mounts it
PROMPT = "through the container to Triton"


def free_port() -> int:
    """A port free on 127.0.0.1 now; inferwire in the container binds it next."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def configuration(triton_port: int, dns_address: str, port: int, metrics_port: int) -> dict:
    """The overlay's inferwire.yaml, less TLS and tokens, on this host's loopback."""
    return {
        "server": {
            "address": f"127.0.0.1:{port}",
            "metrics_address": f"127.0.0.1:{metrics_port}",
            "grace_period_s": 5,
            "log_format": "json",
            "tracing": True,
        },
        "models": [
            {
                "name": MODEL,
                "backend": "triton",
                "load_on_startup": True,
                "options": {
                    "discovery": "dns",
                    "urls": [f"{TRITON_HOST}:{triton_port}"],
                    "dns_server": dns_address,
                    "dns_refresh_s": 5,
                    "triton_model": TRITON_MODEL,
                },
            }
        ],
    }


@contextmanager
def triton_on_host(record_dir: Path) -> Iterator[tuple[TritonServer, DnsServer]]:
    """A tritonserver in explicit model-control mode (nothing loaded: inferwire loads the
    model) and a DNS server that resolves TRITON_HOST to it; both stopped on leaving."""
    if TRITON_DIR is None:
        raise AssertionError("tritonserver is not installed; run `make triton`")
    prepare_python_backend(TRITON_DIR)
    with ExitStack() as stack:
        triton = TritonServer(record_dir)
        stack.callback(triton.kill)
        triton.start()
        dns = DnsServer()
        dns.zone.set(TRITON_HOST, [triton.address])
        dns.start()
        stack.callback(dns.stop)
        yield triton, dns


def wait_for_record(record_dir: Path, request_id: str) -> dict:
    deadline = time.monotonic() + 30
    while (record := read_record(record_dir, TRITON_MODEL, request_id)) is None:
        assert time.monotonic() < deadline, f"{TRITON_MODEL} never recorded {request_id}"
        time.sleep(0.1)
    return record


def check_traced(container: str) -> None:
    """The console exporter printed the Infer's span (the `otel` extra at work)."""
    deadline = time.monotonic() + 30
    while True:
        logs = image_check.docker("logs", container)
        if '"name": "inferwire.v1.InferenceService/Infer"' in logs:
            log("the Infer's span reached the console exporter")
            return
        assert time.monotonic() < deadline, f"no Infer span in the container log:\n{logs[-3000:]}"
        time.sleep(0.5)


def check_otlp_exporter() -> None:
    """OTEL_TRACES_EXPORTER's default, `otlp`, names an exporter the image has."""
    found = image_check.docker(
        *("run", "--rm", "--network", "none", "--entrypoint", "python3", image_check.IMAGE),
        "-c",
        "from importlib.metadata import entry_points as e;"
        "print(len(e(group='opentelemetry_traces_exporter', name='otlp')))",
    ).strip()
    assert found == "1", f"the image has no `otlp` span exporter ({found})"


def run_and_probe(timings: dict[str, float]) -> None:
    with step("the otlp span exporter is installed", timings):
        check_otlp_exporter()
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="image-triton-")))
        record_dir, config_dir = scratch / "records", scratch / "config"
        record_dir.mkdir()
        config_dir.mkdir()
        with step(f"start tritonserver ({TRITON_MODEL}) and a DNS server on the host", timings):
            triton, dns = stack.enter_context(triton_on_host(record_dir))
        port, metrics_port = free_port(), free_port()
        config = configuration(triton.port, dns.address, port, metrics_port)
        (config_dir / "inferwire.yaml").write_text(json.dumps(config, indent=2))  # YAML
        # The container's user (10001) reads it through a bind mount.
        for path in (scratch, config_dir, config_dir / "inferwire.yaml"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        run_args = [
            *("--network", "host"),
            *("--volume", f"{config_dir}:{CONFIG_DIR}:ro"),
            *("--env", f"INFERWIRE_CONFIG={CONFIG_DIR}/inferwire.yaml"),
            *("--env", "OTEL_TRACES_EXPORTER=console"),
            *("--env", "OTEL_BSP_SCHEDULE_DELAY=200"),  # ms; the SDK's default is 5 s
        ]
        address = f"127.0.0.1:{port}"
        with image_check.locked_down_container("triton", run_args, timings) as container:
            label = "probe triton: grpc_health_probe, grpcurl Infer to Triton, trace, /metrics"
            with step(label, timings):
                image_check.wait_container_serving(container, address, "")
                image_check.wait_container_serving(container, address, f"model/{MODEL}")
                request_id = "image-check-triton"
                request = {
                    "model": MODEL,
                    "prompt": PROMPT,
                    "parameters": {"max_tokens": 4},
                    "request_id": request_id,
                }
                reply = image_check.infer(address, request)
                assert reply["text"] == echo_text(PROMPT, 4), reply
                assert reply["backend"] == "triton", reply
                record = wait_for_record(record_dir, request_id)
                assert record["tokens"] == 4, record
                log(f"{TRITON_MODEL} on the host's tritonserver recorded {request_id}")
                check_traced(container)
                image_check.check_infer_counted(f"127.0.0.1:{metrics_port}")

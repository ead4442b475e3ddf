"""Real `tritonserver` processes for the Triton backend tests, and test helpers.

The `tritonserver` binary and its Python backend come from the `nvidia-pytriton` wheel
(installed with `pip install --no-deps nvidia-pytriton`; see scripts/install_triton.sh).
The test models in tests/triton_models run in Triton's Python backend stub, which embeds
the system Python (Debian: libpython3.11 and python3-numpy).

Every tritonserver binds 127.0.0.1 (or its `address`) port 0; the port is read back from
the process's own listening socket. Its metrics service (Prometheus text over HTTP) is off,
unless a `metrics_port` is given: then it listens there, on the same address. Each one
runs in its own process group, killed by PID at the end, with the Python backend stubs it
started.

Servers:
  main  - vllm_echo, trtllm_echo and plain_identity; most tests (the chat models use
          vllm_echo and trtllm_echo with a chat template from tests/triton/chat_templates)
  pair  - two servers behind one model (`dual`), for balancing and failover
  solo  - one server behind one model (`solo`), killed and restarted by the health test
  guarded - started with --grpc-restricted-protocol: RPCs need a key header
  fixed - model-control-mode none (no repository API) over a copy of vllm_echo and a
          model that fails to load
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inferwire.backends.ort_genai import builtin_model_path
from inferwire.config import load_settings

REPOSITORY = Path(__file__).resolve().parents[1] / "triton_models"
# Chat templates of the chat models: a tokenizer_config.json, and a Jinja file.
CHAT_TEMPLATES = Path(__file__).resolve().parents[1] / "triton" / "chat_templates"
TRITONSERVER = Path(__file__).resolve().parents[2] / "scripts" / "tritonserver"
# The Python backend stub embeds the system Python, whose version picks the stub.
SYSTEM_PYTHON = Path("/usr/bin/python3")


def _pytriton_dir() -> Path | None:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        return None
    directory = Path(spec.origin).parent / "tritonserver"
    return directory if (directory / "bin" / "tritonserver").is_file() else None


TRITON_DIR = _pytriton_dir()
SKIP_REASON = (
    "tritonserver is not installed: pip install --no-deps nvidia-pytriton "
    "(see scripts/install_triton.sh)"
)


def prepare_python_backend(triton_dir: Path) -> None:
    """Put the stub for the system Python where the Python backend looks for it."""
    target = triton_dir / "backends" / "python" / "triton_python_backend_stub"
    if target.is_file():
        return
    version = subprocess.run(
        [str(SYSTEM_PYTHON), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    stub = triton_dir / "python_backend_stubs" / version / "triton_python_backend_stub"
    shutil.copy2(stub, target)


@dataclass
class TritonServer:
    """One `tritonserver` process in its own process group."""

    record_dir: Path
    load_models: tuple[str, ...] = ()
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    repository: Path = REPOSITORY
    model_control_mode: str = "explicit"
    headers: dict[str, str] = field(default_factory=dict)
    address: str = "127.0.0.1"  # a loopback address; the DNS tests use 127.0.0.2 and up
    metrics_port: int | None = None  # None: --allow-metrics=false
    signalled: set[int] = field(default_factory=set)  # signals a test sent on purpose

    @property
    def url(self) -> str:
        return f"{self.address}:{self.port}"

    def start(self) -> None:
        """Start on `port` (0: any free port), and wait until it is ready."""
        assert TRITON_DIR is not None
        self.log_path = self.record_dir / f"tritonserver-{time.monotonic_ns()}.log"
        # Through the wrapper users run too: it keeps the caller's virtualenv away from
        # the Python backend stub (tests/triton/test_triton_environment.py).
        args = [
            str(TRITONSERVER),
            f"--model-repository={self.repository}",
            f"--model-control-mode={self.model_control_mode}",
            "--exit-on-error=false",
            f"--grpc-address={self.address}",
            f"--grpc-port={self.port}",
            "--allow-http=false",
            *self._metrics_args(),
            "--exit-timeout-secs=2",
            # The caller's trace context reaches the models as request parameters.
            "--grpc-header-forward-pattern=traceparent",
            *(f"--load-model={name}" for name in self.load_models),
            *self.extra_args,
        ]
        env = {
            **os.environ,
            "TRITON_DIR": str(TRITON_DIR),
            "INFERWIRE_TRITON_RECORD_DIR": str(self.record_dir),
            **self.extra_env,
        }
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self._end()
                raise AssertionError(f"tritonserver did not start:\n{self.log_path.read_text()}")
            if self.port == 0:
                self.port = listening_port(self.process.pid, exclude={self.metrics_port})
            if self.port and _server_ready(self.url, tuple(self.headers.items())):
                return
            time.sleep(0.05)

    def _metrics_args(self) -> tuple[str, ...]:
        if self.metrics_port is None:
            return ("--allow-metrics=false",)
        return (
            "--allow-metrics=true",
            "--allow-gpu-metrics=false",
            "--allow-cpu-metrics=false",
            f"--metrics-address={self.address}",
            f"--metrics-port={self.metrics_port}",
        )

    @property
    def metrics_url(self) -> str:
        return f"http://{self.address}:{self.metrics_port}/metrics"

    def __enter__(self) -> TritonServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.kill()

    def signal(self, signum: int) -> None:
        """Signal the server and its Python backend stubs (its process group) on purpose."""
        assert self.process is not None
        self.signalled.add(signum)
        os.killpg(self.process.pid, signum)

    def death(self) -> str | None:
        """How the server ended by itself (a signal no test sent, or an exit); None while
        it runs or when a test ended it."""
        if self.process is None or (code := self.process.poll()) is None:
            return None
        if code < 0 and -code in self.signalled:
            return None
        how = f"signal {-code}" if code < 0 else f"exit status {code}"
        assert self.log_path is not None  # set by start(), with the process
        tail = "".join(self.log_path.read_text(errors="replace").splitlines(True)[-12:])
        return f"tritonserver {self.url} (pid {self.process.pid}) ended by {how}:\n{tail}"

    def kill(self) -> None:
        """SIGKILL the server and its Python backend stubs (its process group). Fails when
        the server had already died by itself: a crash is a finding, never teardown noise."""
        if self.process is None:
            return
        death = self.death()
        self._end()
        assert death is None, death

    def _end(self) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        self.process = None
        self.signalled.clear()

    def statistics(self, model: str) -> int:
        """Requests that Triton itself counts as executed for `model`."""
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        with grpc.insecure_channel(self.url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            response = stub.ModelStatistics(service_pb2.ModelStatisticsRequest(name=model))
        return sum(s.inference_stats.success.count for s in response.model_stats)

    def model_ready(self, model: str) -> bool:
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        with grpc.insecure_channel(self.url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            return stub.ModelReady(service_pb2.ModelReadyRequest(name=model), timeout=5).ready

    def unload_model(self, model: str) -> None:
        """Unload `model` straight on Triton, behind the gateway's back; wait until it is."""
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        with grpc.insecure_channel(self.url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            stub.RepositoryModelUnload(service_pb2.RepositoryModelUnloadRequest(model_name=model))
        deadline = time.monotonic() + 30
        while self.model_ready(model):
            assert time.monotonic() < deadline, f"Triton never unloaded {model}"
            time.sleep(0.05)

    def load_model(self, model: str) -> None:
        """Load `model` straight on Triton (explicit mode)."""
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        with grpc.insecure_channel(self.url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            stub.RepositoryModelLoad(service_pb2.RepositoryModelLoadRequest(model_name=model))


def free_port(*addresses: str) -> int:
    """A port free on every one of `addresses` (servers sharing one port on several)."""
    while True:
        with socket.socket() as probe:
            probe.bind((addresses[0], 0))
            port = probe.getsockname()[1]
            try:
                for address in addresses[1:]:
                    with socket.socket() as other:
                        other.bind((address, port))
            except OSError:
                continue
            return port


@contextlib.contextmanager
def all_running(servers: list[TritonServer]) -> Iterator[list[TritonServer]]:
    """Start `servers` side by side (each waits until it is ready); kill them all at the end."""
    try:
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(TritonServer.start, servers))
        yield servers
    finally:
        for server in servers:
            server.kill()


def listening_port(pid: int, exclude: Collection[int | None] = ()) -> int:
    """The TCP port a process listens on, other than `exclude`, from /proc (0 until it
    listens)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                port = int(fields[1].rsplit(":", 1)[1], 16)
                if fields[3] == "0A" and fields[9] in inodes and port not in exclude:  # 0A: LISTEN
                    return port
    return 0


def _server_ready(url: str, metadata: tuple[tuple[str, str], ...]) -> bool:
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    try:
        with grpc.insecure_channel(url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            request = service_pb2.ServerReadyRequest()
            return stub.ServerReady(request, metadata=metadata, timeout=1).ready
    except grpc.RpcError:
        return False


# A server started with --grpc-restricted-protocol wants this header on every RPC.
GUARD_KEY = "secret-key"
GUARD_HEADER = "triton-grpc-protocol-inferwire-key"
GUARD_ARGS = (
    "--grpc-restricted-protocol="
    f"health,metadata,inference,model-config,model-repository:inferwire-key={GUARD_KEY}",
)


def fixed_repository(directory: Path) -> Path:
    """A repository for a server without the repository API: vllm_echo and a broken model."""
    shutil.copytree(REPOSITORY / "vllm_echo", directory / "vllm_echo")
    broken = directory / "broken"
    (broken / "1").mkdir(parents=True)
    (broken / "config.pbtxt").write_text((REPOSITORY / "vllm_echo" / "config.pbtxt").read_text())
    (broken / "1" / "model.py").write_text('raise RuntimeError("broken on purpose")\n')
    return directory


# The models of the Open Inference Protocol tests (tests/triton/test_kserve_tritonclient.py):
# a vllm_echo that streams deltas, as current vLLM backend releases do, and trtllm_unary.
OIP_VLLM_MODEL = "vllm_model"
OIP_TRTLLM_MODEL = "trtllm_model"


def copy_model(directory: Path, source: str, name: str, extra_config: str = "") -> None:
    """Copy test model `source` into `directory` as `name` (symlinks copied as files), with
    `extra_config` appended to its config.pbtxt."""
    shutil.copytree(REPOSITORY / source, directory / name)
    config = directory / name / "config.pbtxt"
    text = config.read_text().replace(f'name: "{source}"', f'name: "{name}"')
    config.write_text(text + extra_config)


def oip_repository(directory: Path) -> Path:
    """A repository with OIP_VLLM_MODEL and OIP_TRTLLM_MODEL."""
    deltas = 'parameters { key: "stream_deltas" value: { string_value: "true" } }\n'
    copy_model(directory, "vllm_echo", OIP_VLLM_MODEL, deltas)
    copy_model(directory, "trtllm_unary", OIP_TRTLLM_MODEL)
    return directory


# The models of the shared-Triton readiness tests (tests/triton/test_triton_shared_readiness.py).
SLOW_LOADING_MODEL = "slow_loading"
FAILING_INIT_MODEL = "failing_init"
SLOW_LOAD_S = 0.5


def shared_repository(directory: Path) -> Path:
    """A repository shared by several models: vllm_echo, a copy of it whose initialize()
    takes SLOW_LOAD_S (Triton's ServerReady is false while it loads), and a model whose
    initialize() raises (ServerReady is false once its load failed)."""
    copy_model(directory, "vllm_echo", "vllm_echo")
    delay = f'parameters {{ key: "load_delay_s" value: {{ string_value: "{SLOW_LOAD_S}" }} }}\n'
    copy_model(directory, "vllm_echo", SLOW_LOADING_MODEL, delay)
    copy_model(directory, "vllm_echo", FAILING_INIT_MODEL)
    (directory / FAILING_INIT_MODEL / "1" / "model.py").write_text(
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        '        raise RuntimeError("failing in initialize() on purpose")\n'
    )
    return directory


def make_settings(servers: dict[str, TritonServer]):
    main = servers["main"].url
    return load_settings(
        server={"address": "127.0.0.1:0", "grace_period_s": 2},
        models=[
            {
                "name": "vllm",
                "backend": "triton",
                "load_on_startup": True,
                "options": {"url": main, "triton_model": "vllm_echo"},
            },
            {
                "name": "trtllm",
                "backend": "triton",
                "load_on_startup": True,
                "options": {
                    "url": main,
                    "triton_model": "trtllm_echo",
                    "tokenizer": str(builtin_model_path()),
                },
            },
            {
                "name": "trtllm_unary",
                "backend": "triton",
                "options": {
                    "url": main,
                    "triton_model": "trtllm_unary",
                    "tokenizer": str(builtin_model_path()),
                },
            },
            {
                "name": "vllm_chat",
                "backend": "triton",
                "load_on_startup": True,
                "options": {
                    "url": main,
                    "triton_model": "vllm_echo",
                    "chat_template": str(CHAT_TEMPLATES / "tokenizer_config.json"),
                    "tokenizer": str(builtin_model_path()),
                },
            },
            {
                "name": "trtllm_chat",
                "backend": "triton",
                "load_on_startup": True,
                "options": {
                    "url": main,
                    "triton_model": "trtllm_echo",
                    "chat_template": str(CHAT_TEMPLATES / "jinja" / "speaker.jinja"),
                },
            },
            {
                "name": "missing_template",
                "backend": "triton",
                "options": {
                    "url": main,
                    "triton_model": "vllm_echo",
                    "chat_template": str(CHAT_TEMPLATES / "no_such_template.jinja"),
                },
            },
            {
                "name": "plain",
                "backend": "triton",
                "options": {"url": main, "triton_model": "plain_identity"},
            },
            {
                "name": "missing",
                "backend": "triton",
                "options": {"url": main, "triton_model": "no_such_model"},
            },
            {
                "name": "dual",
                "backend": "triton",
                "load_on_startup": True,
                "max_concurrency": 16,
                "options": {
                    "urls": [servers["pair_a"].url, servers["pair_b"].url],
                    "triton_model": "vllm_echo",
                },
            },
            {
                "name": "guarded",
                "backend": "triton",
                "options": {
                    "url": servers["guarded"].url,
                    "triton_model": "vllm_echo",
                    "headers": {GUARD_HEADER: GUARD_KEY},
                },
            },
            {
                "name": "unguarded",
                "backend": "triton",
                "options": {"url": servers["guarded"].url, "triton_model": "vllm_echo"},
            },
            {
                "name": "fixed_ready",
                "backend": "triton",
                "options": {"url": servers["fixed"].url, "triton_model": "vllm_echo"},
            },
            {
                "name": "fixed_broken",
                "backend": "triton",
                "options": {"url": servers["fixed"].url, "triton_model": "broken"},
            },
            {
                "name": "solo",
                "backend": "triton",
                "load_on_startup": True,
                "options": {"url": servers["solo"].url, "triton_model": "vllm_echo"},
            },
        ],
    )


async def health_status(health_stub: health_pb2_grpc.HealthStub, service: str) -> int:
    response = await health_stub.Check(health_pb2.HealthCheckRequest(service=service))
    return response.status


def read_record(record_dir: Path, model: str, request_id: str) -> dict | None:
    """What the test model recorded about a request, once the request has ended."""
    path = record_dir / f"{model}-{request_id}.json"
    return json.loads(path.read_text()) if path.is_file() else None


async def wait_for_record(record_dir: Path, model: str, request_id: str) -> dict:
    deadline = time.monotonic() + 30
    while (record := read_record(record_dir, model, request_id)) is None:
        assert time.monotonic() < deadline, f"{model} never recorded request {request_id}"
        await asyncio.sleep(0.02)
    return record


PYTHON = sys.executable


def direct_infer(url: str, model: str, prompt: str) -> str:
    """One request straight to Triton with tritonclient, loading the model first."""
    import numpy as np
    import tritonclient.grpc as triton

    client = triton.InferenceServerClient(url)
    try:
        client.load_model(model)
        inputs = []
        for name, value, datatype in [
            ("text_input", np.array([[prompt.encode()]], dtype=np.object_), "BYTES"),
            ("max_tokens", np.array([[2]], dtype=np.int32), "INT32"),
        ]:
            tensor = triton.InferInput(name, list(value.shape), datatype)
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        result = client.infer(model, inputs)
        return result.as_numpy("text_output").reshape(-1)[0].decode()
    finally:
        client.close()

"""`inferwire` as a real process: the server on 127.0.0.1:0, and the CLI."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

INFERWIRE = Path(sys.executable).with_name("inferwire")
# Servers started here serve metrics and HTTP on free ports, so several can run at once;
# a caller's `env` may set other addresses. A crash prints its Python stack (faulthandler),
# which `ServerProcess.exit_report` shows.
DEFAULT_ENV = {
    "INFERWIRE_SERVER__METRICS_ADDRESS": "127.0.0.1:0",
    "INFERWIRE_SERVER__HTTP_ADDRESS": "127.0.0.1:0",
    "PYTHONFAULTHANDLER": "1",
}


@dataclass
class ServerProcess:
    process: subprocess.Popen[str]
    port: int
    log_lines: list[str]
    http_port: int | None = None  # None: HTTP is off

    @property
    def http_url(self) -> str:
        """`http://127.0.0.1:<port>` of the OpenAI-compatible API."""
        assert self.http_port is not None, "this server serves no HTTP"
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def exit_report(self, lines: int = 15) -> str:
        """How the process ended (None: still running) and what it said: the faulthandler's
        stack after a crash, else its last lines other than access lines."""
        status = self.process.poll()
        if status is not None and status < 0:
            status_text = f"{status} (signal {-status})"
        else:
            status_text = str(status)
        text = self.log_lines
        crash = next((i for i, line in enumerate(text) if "Fatal Python error" in line), None)
        if crash is not None:
            shown = text[crash:]
        else:
            shown = [line for line in text if 'finished"' not in line][-lines:]
        return f"server exit status: {status_text}\n" + "".join(shown)


def _state_dir() -> dict[str, str]:
    """A state directory of the server's own (its default Responses store's file), in
    the test session's (tests/conftest.py), so that no two servers share a store unless
    a test says so (its `env`, or a `server.responses.store` of its own)."""
    session = os.environ.get("INFERWIRE_SERVER__STATE_DIR")
    own = tempfile.mkdtemp(prefix="server-", dir=session) if session else None
    return {"INFERWIRE_SERVER__STATE_DIR": own} if own else {}


def start_server_process(
    *args: str, env: dict[str, str] | None = None, program: Sequence[str] = (str(INFERWIRE),)
) -> ServerProcess:
    """Start `inferwire serve` on 127.0.0.1:0 (metrics too) and wait for its `listening` line.

    `program` runs the CLI (another entry point, such as a test's launcher). A thread
    keeps draining the process's output so its log can never fill the pipe and stall it.
    """
    process = subprocess.Popen(
        [*program, "serve", "--address", "127.0.0.1:0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **DEFAULT_ENV, **_state_dir(), **(env or {})},
    )
    lines: list[str] = []
    listening = threading.Event()

    def drain() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if '"listening"' in line:
                listening.set()

    threading.Thread(target=drain, daemon=True).start()
    deadline = time.monotonic() + 60
    while not listening.wait(0.05):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise AssertionError("inferwire serve did not start:\n" + "".join(lines))
    port = next(json.loads(line)["port"] for line in lines if '"listening"' in line)
    http_port = next(
        (json.loads(line)["port"] for line in lines if '"http listening"' in line), None
    )
    return ServerProcess(process, port, lines, http_port)


def wait_serving(
    server: ServerProcess,
    timeout_s: float = 60,
    poll_s: float = 0.01,
    credentials: grpc.ChannelCredentials | None = None,
) -> None:
    """Block until grpc.health.v1 reports the whole server SERVING (over TLS with
    `credentials`)."""
    deadline = time.monotonic() + timeout_s
    with (
        grpc.secure_channel(server.target, credentials)
        if credentials
        else grpc.insecure_channel(server.target)
    ) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while health.Check(health_pb2.HealthCheckRequest(), timeout=5).status != (
            health_pb2.HealthCheckResponse.SERVING
        ):
            if time.monotonic() > deadline:
                raise AssertionError("server never reported SERVING")
            time.sleep(poll_s)


def start_serving_server(
    *args: str,
    env: dict[str, str] | None = None,
    credentials: grpc.ChannelCredentials | None = None,
    program: Sequence[str] = (str(INFERWIRE),),
) -> ServerProcess:
    """Start `inferwire serve` and wait until its start-up models are loaded; a server
    with TLS (configured through `env`) is called with `credentials`."""
    server = start_server_process(*args, env=env, program=program)
    try:
        wait_serving(server, credentials=credentials)
    except BaseException as exc:
        # A server that dies after `listening` (a failed start-up load, a crash) says why
        # in its own lines and exit status, which the health check's error does not carry;
        # let one that is ending finish, so its status is its own and not our SIGKILL.
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.process.wait(timeout=10)
        stop_server_process(server)
        raise AssertionError(f"inferwire serve never served:\n{server.exit_report(60)}") from exc
    return server


@contextmanager
def serving_with_config(directory: Path, config: str) -> Iterator[ServerProcess]:
    """A serving `inferwire serve` with `config` (YAML or JSON) written in `directory`,
    stopped at the end."""
    path = directory / "inferwire.yaml"
    path.write_text(config)
    server = start_serving_server("--config", str(path))
    try:
        yield server
    finally:
        stop_server_process(server)


def stop_server_process(server: ServerProcess, graceful: bool = False) -> None:
    """Stop by PID: SIGTERM and a drain when `graceful`, else SIGKILL."""
    if server.process.poll() is None:
        if graceful:
            server.process.terminate()
            try:
                server.process.wait(timeout=30)
                return
            except subprocess.TimeoutExpired:
                pass
        server.process.kill()
    server.process.wait(timeout=10)


def run_cli(
    *args: str, timeout: float = 60, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(INFERWIRE), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
        env={**os.environ, **(env or {})},
    )


def wait_cli_serving(target: str, *flags: str, attempts: int = 300) -> None:
    """Block until `inferwire health` (with `flags`, e.g. TLS) reports the server SERVING."""
    for _ in range(attempts):
        if run_cli("health", "--address", target, *flags).returncode == 0:
            return
    raise AssertionError(f"server at {target} never became SERVING {' '.join(flags)}".rstrip())

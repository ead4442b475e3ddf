"""Test helpers shared by every test folder (importable as `support`).

They live outside conftest.py because sub-folders have conftest files of
their own, and two modules both named `conftest` cannot import each other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.rpc import error_details_pb2, status_pb2

INFERWIRE = Path(sys.executable).with_name("inferwire")


@dataclass
class ServerProcess:
    process: subprocess.Popen[str]
    port: int
    log_lines: list[str]

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


def start_server_process(*args: str, env: dict[str, str] | None = None) -> ServerProcess:
    """Start `inferwire serve` on 127.0.0.1:0 and wait for its `listening` log line.

    A thread keeps draining the process's output so its log can never fill the
    pipe and stall it.
    """
    process = subprocess.Popen(
        [str(INFERWIRE), "serve", "--address", "127.0.0.1:0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
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
    return ServerProcess(process, port, lines)


def stop_server_process(server: ServerProcess) -> None:
    if server.process.poll() is None:
        server.process.kill()
    server.process.wait(timeout=10)


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(INFERWIRE), *args], capture_output=True, text=True, timeout=timeout)


def bad_request_fields(error: grpc.aio.AioRpcError) -> list[str]:
    """The field names in an error's google.rpc.BadRequest details."""
    fields: list[str] = []
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                bad_request = error_details_pb2.BadRequest()
                if detail.Unpack(bad_request):
                    fields.extend(v.field for v in bad_request.field_violations)
    return fields

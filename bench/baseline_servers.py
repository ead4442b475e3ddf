"""The bare baseline servers (echo_server, stream_floor_server, triton_proxy): how each
serves in its own process, and how a scenario starts one and finds it.

A baseline server prints its bound port on stdout, then serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import grpc


async def serve_until_signalled(server: grpc.aio.Server) -> None:
    """Listen on a free loopback port, print it, serve until SIGTERM or SIGINT."""
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(0)


@dataclass(frozen=True)
class BaselineProcess:
    pid: int
    target: str


@contextlib.contextmanager
def baseline_server(module: str, *args: str) -> Iterator[BaselineProcess]:
    """`python -m <module> <args>` in its own process, stopped (by PID) on the way out."""
    process = subprocess.Popen(
        [sys.executable, "-m", module, *args], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield BaselineProcess(process.pid, f"127.0.0.1:{port}")
    finally:
        stop_process(process, timeout_s=10)


def stop_process(process: subprocess.Popen, timeout_s: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout_s`; reaped either way."""
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()

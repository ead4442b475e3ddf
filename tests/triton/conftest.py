"""Session fixtures: real `tritonserver` processes and an in-process inferwire in front.

This folder is a package so that its conftest does not clash with tests/conftest.py.

See tests/support/triton.py for how the servers are started and which ones there are.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from inferwire.server import InferwireServer
from tests.support.triton import (
    GUARD_ARGS,
    GUARD_HEADER,
    GUARD_KEY,
    SKIP_REASON,
    TRITON_DIR,
    TritonServer,
    fixed_repository,
    make_settings,
    prepare_python_backend,
)


@pytest.fixture(scope="session")
def triton_dir() -> Path:
    if TRITON_DIR is None:
        pytest.skip(SKIP_REASON)
    prepare_python_backend(TRITON_DIR)
    return TRITON_DIR


@pytest.fixture(scope="session")
def record_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("triton-records")


@pytest.fixture(scope="session")
def triton_servers(
    triton_dir: Path, record_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, TritonServer]]:
    """The servers (see tests.support.triton), started once for the session, killed at the end."""
    servers = {
        # main: models are loaded through inferwire's LoadModel (explicit mode).
        "main": TritonServer(record_dir),
        "pair_a": TritonServer(record_dir),
        "pair_b": TritonServer(record_dir),
        "solo": TritonServer(record_dir),
        # guarded: --grpc-restricted-protocol; inferwire must send the key header.
        "guarded": TritonServer(
            record_dir, extra_args=GUARD_ARGS, headers={GUARD_HEADER: GUARD_KEY}
        ),
        # fixed: loads its whole repository at start; LoadModel cannot load on it.
        "fixed": TritonServer(
            record_dir,
            repository=fixed_repository(tmp_path_factory.mktemp("fixed-repository")),
            model_control_mode="none",
        ),
    }
    with contextlib.ExitStack() as running:
        for server in servers.values():
            running.enter_context(server)
        yield servers


@pytest.fixture(scope="session")
async def gateway(triton_servers: dict[str, TritonServer]) -> AsyncIterator[InferwireServer]:
    server = InferwireServer(make_settings(triton_servers))
    await server.start()
    yield server
    await server.stop(grace_s=1)


# The Triton tier's own channel: tests/conftest.py builds `stub` and `health_stub` on it.
@pytest.fixture(scope="session")
async def channel(gateway: InferwireServer) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel:
        yield channel

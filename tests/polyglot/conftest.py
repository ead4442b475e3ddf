"""Fixtures for the polyglot tests: generated clients built with their real
toolchains and run against a live `inferwire serve` process.

The server is a real process (not the in-process fixture) because each test
blocks on a subprocess; the bundled model is served as `demo`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.process import ServerProcess, start_serving_server, stop_server_process


@pytest.fixture(scope="session")
def live_server() -> Iterator[ServerProcess]:
    server = start_serving_server()
    try:
        yield server
    finally:
        stop_server_process(server)

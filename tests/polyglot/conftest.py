"""Fixtures for the polyglot tests: generated clients built with their real
toolchains and run against a live `inferwire serve` process.

The server is a real process (not the in-process fixture) because each test
blocks on a subprocess; the bundled model is served as `demo`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from inferwire.v1 import inference_pb2 as pb
from tests.support.polyglot import reference_chat_logprobs
from tests.support.process import ServerProcess, start_serving_server, stop_server_process


@pytest.fixture(scope="session")
def live_server() -> Iterator[ServerProcess]:
    server = start_serving_server()
    try:
        yield server
    finally:
        stop_server_process(server)


@pytest.fixture(scope="session")
def chat_reference(live_server: ServerProcess) -> pb.InferResponse:
    """The examples' chat request answered through the Python stubs, for comparison."""
    return reference_chat_logprobs(live_server.target)

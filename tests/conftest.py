"""Marks every test with its tier, taken from its folder (see pyproject's markers), and
gives every tier the same stubs over its own channel.

`pytest -m unit` (or `make check`) runs only the quick tier; the folders are the tiers.
A tier that serves inferwire defines a session-scoped `channel` to its server; `stub`
and `health_stub` are cheap, so they are function-scoped here and always use the
channel of the requesting test's tier.

Servers built in a test process serve metrics and HTTP on free ports, not the default
9464 and 8000, so that several can run at once (tests/support/process.py does the same for
processes), and keep their state (the default Responses store's file) in a temporary
directory removed at exit, never in the user's `~/.local/state` (tests/support/process.py
gives each server process a directory of its own in it).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2_grpc

from inferwire.v1 import inference_pb2_grpc
from tests.support import figures

os.environ.setdefault("INFERWIRE_SERVER__METRICS_ADDRESS", "127.0.0.1:0")
os.environ.setdefault("INFERWIRE_SERVER__HTTP_ADDRESS", "127.0.0.1:0")
if "INFERWIRE_SERVER__STATE_DIR" not in os.environ:
    _STATE_DIR = tempfile.mkdtemp(prefix="inferwire-test-state-")
    atexit.register(shutil.rmtree, _STATE_DIR, ignore_errors=True)
    os.environ["INFERWIRE_SERVER__STATE_DIR"] = _STATE_DIR

TIERS = (
    "unit",
    "engine",
    "realmodel",
    "triton",
    "polyglot",
    "reliability",
    "image",
    "faults",
    "gateway",
)
TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = item.path.relative_to(TESTS).parts[0]
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture
def stub(channel: grpc.aio.Channel) -> inference_pb2_grpc.InferenceServiceStub:
    return inference_pb2_grpc.InferenceServiceStub(channel)


@pytest.fixture
def health_stub(channel: grpc.aio.Channel) -> health_pb2_grpc.HealthStub:
    return health_pb2_grpc.HealthStub(channel)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print what the tests measured but do not assert (tests.support.figures)."""
    for title, lines in figures.FIGURES.items():
        terminalreporter.write_sep("-", title)
        for line in lines:
            terminalreporter.write_line(line)

"""clients/python/example.py, run as a user would, against a live server."""

from __future__ import annotations

import sys

from tests.support.polyglot import CLIENTS, assert_example_output, run_checked
from tests.support.process import ServerProcess


def test_python_example_against_live_server(live_server: ServerProcess) -> None:
    example = CLIENTS / "python" / "example.py"
    result = run_checked(
        [sys.executable, str(example), live_server.target, "demo"], cwd=CLIENTS, timeout=60
    )
    assert_example_output(result.stdout)

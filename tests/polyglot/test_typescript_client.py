"""clients/typescript: built with npm and tsc (--strict, from tsconfig.json),
then its example run with node against a live server."""

from __future__ import annotations

import pytest

from tests.support.polyglot import CLIENTS, assert_example_output, require_tool, run_checked
from tests.support.process import ServerProcess

CLIENT = CLIENTS / "typescript"


@pytest.mark.timeout(900)  # a cold npm cache downloads the packages first
def test_typescript_example_against_live_server(live_server: ServerProcess) -> None:
    node, npm, npx = require_tool("node"), require_tool("npm"), require_tool("npx")
    run_checked([npm, "ci", "--no-audit", "--no-fund", "--prefer-offline"], cwd=CLIENT, timeout=600)
    run_checked([npx, "--no-install", "tsc", "-p", "."], cwd=CLIENT, timeout=300)
    result = run_checked(
        [node, "dist/example.js", live_server.target, "demo"], cwd=CLIENT, timeout=120
    )
    assert_example_output(result.stdout)

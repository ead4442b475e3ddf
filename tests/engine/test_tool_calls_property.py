"""The property of tool calls on `demo` (llguidance's grammar): for 500 random parameter
schemas, `tool_choice: required` at temperature 1, every call's `arguments` parses and
validates against its schema, and the streamed fragments of the same seed concatenate to
the unary call's arguments (constrained requests run on the per-request path, where a
seed gives the same tokens). The counts are printed for the closing note."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from tests.support.process import ServerProcess, serving_with_config
from tests.support.tool_schemas import run_property

SCHEMAS = 500
CONFIG = {
    "server": {"grace_period_s": 1},
    "models": [
        {
            "name": "demo",
            "load_on_startup": True,
            "max_concurrency": 4,
            "options": {"path": "builtin", "batching": "per_request"},
        }
    ],
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving_with_config(tmp_path_factory.mktemp("property"), json.dumps(CONFIG)) as server:
        yield server


@pytest.mark.timeout(900)  # a bound on a hang, not a time asserted: ~2 min on 2 cores
def test_every_required_call_validates_and_streams_as_unary(served: ServerProcess) -> None:
    counts = asyncio.run(run_property(served.http_url + "/v1", "demo", SCHEMAS, first_seed=1))
    print(
        f"demo: {counts.schemas} schemas, {counts.calls} calls, {counts.validated} valid, "
        f"{counts.stream_matches} streamed == unary, {counts.cut} of "
        f"{counts.recursive} recursive calls cut at max_tokens"
    )
    assert counts.failures == []
    assert counts.schemas == SCHEMAS
    assert counts.finished == counts.calls == counts.validated == counts.stream_matches
    assert counts.cut * 2 <= counts.recursive  # most recursive calls end whole

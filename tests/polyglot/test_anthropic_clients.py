"""Anthropic's own clients against a live `inferwire serve` on `demo`, from npm (pinned in
tests/support/node_packages.py, installed under .cache/ on first use): the TypeScript SDK
(`@anthropic-ai/sdk`: create, the stream helper, a tools round trip, countTokens, errors),
and Claude Code (`@anthropic-ai/claude-code`) pointed at the server with
`ANTHROPIC_BASE_URL` and a key. Claude Code's prompt (its system prompt, tools and
environment: some 34,000 tokens) does not fit `demo`'s window of 1024: it gets a clean 400
`invalid_request_error` that says so, never a hang, a 500 or a dropped connection."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from tests.support.node_packages import ANTHROPIC_SDK, CLAUDE_CODE, node_modules
from tests.support.polyglot import require_tool, run_checked
from tests.support.process import ServerProcess

SCRIPT = Path(__file__).parent / "scripts" / "anthropic_sdk.cjs"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
    "additionalProperties": False,
}


@pytest.mark.timeout(900)  # a cold npm cache downloads the package first
def test_the_typescript_sdk_creates_streams_calls_tools_and_counts(
    live_server: ServerProcess,
) -> None:
    modules = node_modules(ANTHROPIC_SDK)
    result = run_checked(
        [require_tool("node"), str(SCRIPT), str(modules), live_server.http_url, "demo"],
        cwd=SCRIPT.parent,
        timeout=300,
    )
    seen: dict[str, Any] = json.loads(result.stdout)
    created, streamed = seen["created"], seen["streamed"]
    assert created["id"].startswith("msg_") and created["stop_reason"] == "max_tokens"
    assert streamed["content"][0]["text"] == seen["streamedText"]
    assert seen["streamedText"] == created["content"][0]["text"]  # greedy both times
    assert streamed["usage"] == created["usage"]
    assert seen["called"]["stop_reason"] == "tool_use"
    use = seen["use"]
    assert use["id"].startswith("toolu_") and use["name"] == "get_weather"
    jsonschema.validate(use["input"], WEATHER)
    assert seen["answered"]["content"][0]["type"] == "text"
    assert seen["counted"]["input_tokens"] == created["usage"]["input_tokens"]
    assert seen["errors"] == {
        "unknown_model": {"status": 404, "type": "not_found_error", "name": "NotFoundError"},
        "image": {"status": 400, "type": "invalid_request_error", "name": "BadRequestError"},
    }


def claude(server: ServerProcess, home: Path, **env: str) -> dict[str, Any]:
    """Claude Code's answer to one prompt (`claude -p ... --output-format json`), run
    against `server` in a home of its own, with its traffic to Anthropic off."""
    binary = node_modules(CLAUDE_CODE) / ".bin" / "claude"
    environment = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": server.http_url,
        "ANTHROPIC_API_KEY": "unused",
        "ANTHROPIC_MODEL": "demo",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": "demo",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        **env,
    }
    result = subprocess.run(
        [str(binary), "-p", "Say hello", "--output-format", "json"],
        cwd=home,
        env=environment,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,  # a hang fails here
    )
    try:
        answer: dict[str, Any] = json.loads(result.stdout)
    except ValueError:
        pytest.fail(f"claude printed no answer:\n{result.stdout}\n{result.stderr}")
    return answer


@pytest.mark.timeout(900)
def test_claude_code_gets_a_clean_400_when_its_prompt_does_not_fit(
    live_server: ServerProcess, tmp_path: Path
) -> None:
    # As it comes: it asks for 32,000 output tokens, more than demo's 1024.
    answer = claude(live_server, tmp_path)
    assert (answer["api_error_status"], answer["api_error_type"]) == (400, "invalid_request_error")
    assert "max_tokens: is 32000; model 'demo' allows at most" in answer["result"]
    # With its output bounded, the prompt itself is too long for the window.
    bounded = claude(live_server, tmp_path, CLAUDE_CODE_MAX_OUTPUT_TOKENS="64")
    assert (bounded["api_error_status"], bounded["api_error_type"]) == (
        400,
        "invalid_request_error",
    )
    assert "context window of 1024 tokens" in bounded["result"], bounded["result"]
    assert httpx.get(live_server.http_url + "/health", timeout=30).status_code == 200
    lines = [json.loads(line) for line in live_server.log_lines if '"POST /v1/messages"' in line]
    assert lines and all(line["status"] < 500 for line in lines)  # no 500, no dropped call

"""The HTTP calls docs/http.md and README.md show, run as they are written (the real `curl`,
the Python `openai` and `anthropic` snippets) against a live `inferwire serve` with the
bundled model, its `localhost:8000` pointed at the test server's port."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.process import ServerProcess, start_serving_server, stop_server_process

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "docs" / "http.md", ROOT / "README.md")
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)


def blocks(language: str) -> list[tuple[Path, str]]:
    return [
        (doc, match[2])
        for doc in DOCS
        for match in BLOCK.finditer(doc.read_text())
        if match[1] == language
    ]


def curl_commands(model: str = "demo") -> list[tuple[Path, str]]:
    """Each `$ curl ...` of a console block, its `\\` continuations joined, that names
    `model` (or, for `demo`, no model of tests/realmodel: those run there)."""
    commands = []
    for doc, block in blocks("console"):
        joined = block.replace("\\\n", " ")
        commands += [(doc, line[2:]) for line in joined.splitlines() if line.startswith("$ curl")]
    if model == "demo":
        return [(doc, c) for doc, c in commands if '"smollm2' not in c]
    return [(doc, c) for doc, c in commands if f'"model": "{model}"' in c]


@pytest.fixture(scope="module")
def served() -> Iterator[ServerProcess]:
    server = start_serving_server()
    try:
        yield server
    finally:
        stop_server_process(server)


def test_the_docs_show_curl_and_python_calls():
    assert len(curl_commands()) >= 4  # http.md's three, and the README's
    assert any("-sN" in command for _, command in curl_commands())
    assert any("OpenAI(" in code for _, code in blocks("python"))


@pytest.mark.parametrize(
    "command",
    [c for _, c in curl_commands()],
    ids=[f"{d.name}:{i}" for i, (d, _) in enumerate(curl_commands())],
)
def test_each_documented_curl_answers_as_shown(served, command):
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    argv = [
        a.replace("localhost:8000", f"127.0.0.1:{served.http_port}") for a in shlex.split(command)
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    if "/v1/messages" in command:
        anthropic_answers_as_shown(command, result.stdout)
    elif "/v1/responses" in command and '"stream": true' in command:
        # Responses' events: `event:` and `data:` pairs, no [DONE], the response last.
        lines = [line for line in result.stdout.splitlines() if line]
        events = [json.loads(line.removeprefix("data: ")) for line in lines[1::2]]
        assert lines[0::2] == [f"event: {event['type']}" for event in events], result.stdout
        assert events[-1]["type"] in ("response.completed", "response.incomplete")
    elif "-N" in argv[1] or '"stream": true' in command:
        events = [line for line in result.stdout.splitlines() if line]
        assert events[-1] == "data: [DONE]", result.stdout
        chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    else:
        answer = json.loads(result.stdout)
        assert answer.get("error") is None, answer  # a response has `"error": null`
        assert answer["object"] in ("list", "text_completion", "chat.completion", "response")


def anthropic_answers_as_shown(command: str, output: str) -> None:
    """Anthropic's Messages: a stream of `event:` and `data:` pairs from `message_start` to
    `message_stop`, a count, a message, or (without max_tokens) the error shown."""
    if '"stream": true' in command:
        lines = [line for line in output.splitlines() if line]
        events = [json.loads(line.removeprefix("data: ")) for line in lines[1::2]]
        assert lines[0::2] == [f"event: {event['type']}" for event in events], output
        assert (events[0]["type"], events[-1]["type"]) == ("message_start", "message_stop")
        return
    answer = json.loads(output)
    if "/count_tokens" in command:
        assert answer["input_tokens"] > 0, answer
    elif '"max_tokens"' not in command:
        assert answer["error"]["message"] == "max_tokens: Field required", answer
    else:
        assert (answer["type"], answer["role"]) == ("message", "assistant"), answer


def test_each_documented_python_snippet_runs(served):
    for doc, code in blocks("python"):
        if "from openai import OpenAI" not in code and "import anthropic" not in code:
            continue
        patched = code.replace("localhost:8000", f"127.0.0.1:{served.http_port}")
        result = subprocess.run(
            [sys.executable, "-c", patched], capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, f"{doc.name}: {result.stderr}"
        assert "prompt_tokens" in result.stdout or "input_tokens" in result.stdout, result.stdout

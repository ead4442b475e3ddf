"""Helpers for the polyglot tier: build the generated clients with their real
toolchains and run their examples against a live `inferwire serve` process."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import jsonschema
import pytest

from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc

REPO = Path(__file__).resolve().parents[2]
CLIENTS = REPO / "clients"
TOOLS_BIN = REPO / ".tools" / "bin"

# The chat request every client's example sends (clients/*/README.md, "Chat with
# log-probabilities"); greedy, so that every client gets the same tokens.
CHAT_MESSAGES = (
    ("system", "You are a player in a Shakespeare play."),
    ("user", "Good morrow! What news from Verona?"),
)
CHAT_MAX_TOKENS = 8
CHAT_TOP_LOGPROBS = 3
LOGPROB_LINE = re.compile(r'(LOGPROB|TOP) (\d+) (-?\d+\.\d{4}) (".*")')
LOGPROB_TOLERANCE = 1e-4  # printed with 4 decimals: off by at most 5e-5


def require_tool(name: str) -> str:
    """Path to a toolchain binary; fail (not skip) when missing: CI installs them all."""
    path = shutil.which(name) or (str(TOOLS_BIN / name) if (TOOLS_BIN / name).exists() else None)
    if path is None:
        pytest.fail(f"{name} is not installed; run scripts/install_tools.sh or .ci/run")
    return path


def run_checked(
    args: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a build or example step; on failure show its whole output."""
    result = subprocess.run(
        args,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, (
        f"{' '.join(args)} exited {result.returncode}\n"
        f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    )
    return result


# The bundled Sonnets adapter of `demo` (docs/adapters.md): every example calls it once,
# changing only the model name it is given.
ADAPTER_MODEL = "demo-sonnets"


def assert_example_output(stdout: str, model: str = "demo") -> None:
    """Check what every language's example prints (see clients/*/README.md):
    INFER <text>, one DELTA <text> per streamed message, STREAM_END, HEALTH
    and the INVALID_ARGUMENT field violation."""
    lines = stdout.splitlines()
    infer = [line for line in lines if line.startswith("INFER ")]
    assert len(infer) == 1 and infer[0][len("INFER ") :].strip(" \"'") != "", stdout
    deltas = [line for line in lines if line.startswith("DELTA ")]
    assert len(deltas) > 1, stdout
    assert any(line.startswith("STREAM_END finish_reason=") for line in lines), stdout
    assert f"HEALTH model/{model} SERVING" in lines, stdout
    assert any(
        line.startswith("ERROR code=INVALID_ARGUMENT field=parameters.top_p ") for line in lines
    ), stdout


# The example's get_weather tool (clients/go/cmd/example/main.go).
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}},
    "required": ["city"],
    "additionalProperties": False,
}


def assert_tool_call_output(stdout: str) -> None:
    """One TOOL_CALL line whose arguments validate against the tool's schema, and the
    TOOL_CALLS finish reason."""
    calls = [line.split(" ", 3) for line in stdout.splitlines() if line.startswith("TOOL_CALL ")]
    assert len(calls) == 1, stdout
    _, call_id, name, arguments = calls[0]
    assert call_id.startswith("id=call_") and name == "name=get_weather", stdout
    jsonschema.validate(json.loads(arguments.removeprefix("arguments=")), WEATHER_SCHEMA)
    assert "TOOL_END finish_reason=FINISH_REASON_TOOL_CALLS" in stdout.splitlines(), stdout


@dataclass
class PrintedToken:
    """One LOGPROB line of an example's output, with the TOP lines under it."""

    token_id: int
    logprob: float
    token: str
    top: list[PrintedToken] = field(default_factory=list)


def reference_chat_logprobs(target: str, model: str = "demo") -> pb.InferResponse:
    """The examples' chat request, sent with the Python stubs: what every client must print."""
    request = pb.InferRequest(
        model=model,
        messages=[pb.ChatMessage(role=role, content=content) for role, content in CHAT_MESSAGES],
        parameters=pb.GenerationParameters(
            max_tokens=CHAT_MAX_TOKENS,
            temperature=0,
            logprobs=True,
            top_logprobs=CHAT_TOP_LOGPROBS,
        ),
    )
    with grpc.insecure_channel(target) as channel:
        response: pb.InferResponse = inference_pb2_grpc.InferenceServiceStub(channel).Infer(
            request, timeout=60
        )
    assert response.logprobs, response
    return response


def parse_chat_logprobs(stdout: str) -> tuple[str, list[PrintedToken]]:
    """The reply text and tokens an example printed: `CHAT <text>`, then the header
    `LOGPROBS tokens=<n> top=<k>`, then per token `LOGPROB <id> <logprob> <text>` and its
    k `TOP` lines (same fields), texts as JSON string literals."""
    lines = stdout.splitlines()
    chat = [line for line in lines if line.startswith("CHAT ")]
    assert len(chat) == 1, stdout
    headers = [i for i, line in enumerate(lines) if line.startswith("LOGPROBS ")]
    assert len(headers) == 1, stdout
    header = re.fullmatch(r"LOGPROBS tokens=(\d+) top=(\d+)", lines[headers[0]])
    assert header and int(header[2]) == CHAT_TOP_LOGPROBS, lines[headers[0]]

    tokens: list[PrintedToken] = []
    for line in lines[headers[0] + 1 :]:
        if not line.startswith(("LOGPROB ", "TOP ")):
            break
        match = LOGPROB_LINE.fullmatch(line)
        assert match, f"unparseable line {line!r}"
        printed = PrintedToken(int(match[2]), float(match[3]), json.loads(match[4]))
        if match[1] == "LOGPROB":
            tokens.append(printed)
        else:
            assert tokens, f"TOP before any LOGPROB: {line!r}"
            tokens[-1].top.append(printed)
    assert len(tokens) == int(header[1]), stdout
    assert sum(line.startswith(("LOGPROB ", "TOP ")) for line in lines) == len(tokens) + sum(
        len(token.top) for token in tokens
    ), f"LOGPROB or TOP lines outside the listing:\n{stdout}"
    return json.loads(chat[0][len("CHAT ") :]), tokens


def assert_chat_logprobs_output(stdout: str, reference: pb.InferResponse) -> None:
    """The example's chat listing parses, holds under greedy decoding (every
    log-probability <= 0, alternatives most likely first, the chosen token the most
    likely), and equals what the Python stubs got for the same request: same text and
    token ids, log-probabilities within 1e-4."""
    text, tokens = parse_chat_logprobs(stdout)
    assert text == reference.text and text != "", (text, reference.text)
    assert len(tokens) == len(reference.logprobs) > 0, stdout
    for printed, expected in zip(tokens, reference.logprobs, strict=True):
        where = f"token {printed}\nreference {expected}"
        assert len(printed.top) == CHAT_TOP_LOGPROBS, where
        logprobs = [printed.logprob, *(alternative.logprob for alternative in printed.top)]
        assert all(logprob <= 0 for logprob in logprobs), where
        top = [alternative.logprob for alternative in printed.top]
        assert top == sorted(top, reverse=True), where
        assert printed.logprob >= max(top), where
        assert printed.token_id == printed.top[0].token_id, where
        assert (printed.token_id, printed.token) == (expected.token_id, expected.token), where
        assert abs(printed.logprob - expected.logprob) <= LOGPROB_TOLERANCE, where
        for alternative, expected_alternative in zip(printed.top, expected.top, strict=True):
            assert alternative.token_id == expected_alternative.token_id, where
            assert alternative.token == expected_alternative.token, where
            assert abs(alternative.logprob - expected_alternative.logprob) <= LOGPROB_TOLERANCE, (
                where
            )


def grpcurl(
    target: str, *args: str, flags: Sequence[str] = ("-plaintext",), data: object = None
) -> subprocess.CompletedProcess[str]:
    """Run the real grpcurl against `target`: `flags` (transport, headers) and `-d data`
    (JSON-encoded unless a string) go before the address, `args` (a verb or a method)
    after it."""
    command = [require_tool("grpcurl"), *flags]
    if data is not None:
        command += ["-d", data if isinstance(data, str) else json.dumps(data)]
    return subprocess.run([*command, target, *args], capture_output=True, text=True, timeout=60)

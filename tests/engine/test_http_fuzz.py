"""Fuzzing the HTTP door of a real `inferwire serve`, as test_fuzz.py does the gRPC one:
random JSON, OpenAI (Responses too), Anthropic (Messages) and vLLM request bodies with
wild fields, raw and cut-short bodies of every content type, methods, paths and headers,
heads httptools cannot parse or that never end, and slow senders. Every answer is a clean
one: a status of `CLEAN` with OpenAI's error body (Anthropic's on its routes; never a
500, never a stack trace), within a client
timeout well above the server's own bounds, and no error in the server's log; afterwards
the server is SERVING and answers the greedy request as before.

`server.http_read_timeout_s` is 2 s here, so that slow senders are cut off quickly. The
statuses seen are printed in pytest's summary (`tests.support.figures`).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import anthropic_fuzz, figures, fuzz, http_fuzz
from tests.support.http_fuzz import body_bytes
from tests.support.process import ServerProcess, start_serving_server, stop_server_process
from tests.support.raw_http import Reply, exchange, slow_sender

READ_TIMEOUT_S = 2.0
CLIENT_TIMEOUT_S = 30.0  # the server's bounds: 2 s to read a request, ~1 s to generate
SLACK_S = 3.0  # on a loaded 2-core CI machine, timers fire late
CONFIG = f"""\
server:
  max_prompt_bytes: 4096
  max_receive_message_bytes: 2097152
  grace_period_s: 1
  http_read_timeout_s: {READ_TIMEOUT_S}
models:
  - {{name: demo, load_on_startup: true, options: {{path: builtin}}}}
  - name: sim
    backend: simulator
    load_on_startup: true
    options: {{time_to_first_token_ms: 1, inter_token_ms: 1, context_length: 4096}}
"""
# 401 needs a tokens file, 499 a client that is gone: neither is a clean answer here.
# 403: a priority above the tenant's; 405: a method a route does not take; 431: a head
# over 16 KiB; 429: a full queue; 503: `sim` does not detokenize (FAILED_PRECONDITION).
CLEAN = {200, 400, 403, 404, 405, 408, 413, 415, 429, 431, 503}
GREEDY = {"model": "demo", "prompt": "KING HENRY:\n", "max_tokens": 24, "temperature": 0}
ERROR_KEYS = {"message", "type", "param", "code"}
CODES: Counter[str] = Counter()
BODIES = {**http_fuzz.BODIES, **anthropic_fuzz.BODIES}
BODY_ROUTES = sorted(BODIES)
FEWER = settings(fuzz.FUZZ_SETTINGS, max_examples=max(fuzz.EXAMPLES // 3, 10))


def error_problem(body: bytes) -> str | None:
    """Why `body` is not OpenAI's error body, or None."""
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return f"the error body is not OpenAI's: {body[:300]!r}"
    if not isinstance(error, dict) or set(error) != ERROR_KEYS:
        return f"the error body is not OpenAI's: {body[:300]!r}"
    if not isinstance(error["message"], str) or "Traceback" in error["message"]:
        return f"the error message is no message: {error['message']!r}"[:500]
    if error["code"] in ("internal", "unknown"):
        return f"the error is {error['code']}: {error['message']!r}"
    return None


def events_problem(text: str) -> str | None:
    """Why `text` is not a finished stream of clean events, or None."""
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    if not events or events[-1] != "[DONE]":
        return f"the stream does not end with [DONE]: {text[-300:]!r}"
    for event in events[:-1]:
        chunk = json.loads(event)
        if "error" in chunk:
            return error_problem(event.encode())
    return None


def responses_events_problem(text: str) -> str | None:
    """Why `text` is not a finished stream of Responses events, each `event:` and `data:`
    with `sequence_number` from 0 and the last a terminal one, or None."""
    events = []
    for block in (block for block in text.split("\n\n") if block):
        name, _, data = block.partition("\n")
        if not name.startswith("event: ") or not data.startswith("data: "):
            return f"not an event: {block[:300]!r}"
        event = json.loads(data.removeprefix("data: "))
        if name.removeprefix("event: ") != event.get("type"):
            return f"the event's name is not its type: {block[:300]!r}"
        if event["type"] == "error" and event.get("code") in ("internal", "unknown"):
            return f"the stream failed: {block[:500]!r}"
        events.append(event)
    if [event.get("sequence_number") for event in events] != list(range(len(events))):
        return f"the sequence numbers do not count from 0: {text[:300]!r}"
    if not events or events[-1]["type"] not in RESPONSES_ENDS:
        return f"the stream does not end with a response: {text[-300:]!r}"
    return None


RESPONSES_ENDS = ("response.completed", "response.incomplete", "response.failed")


def anthropic_error_problem(body: bytes) -> str | None:
    """Why `body` is not Anthropic's error body of a clean refusal, or None."""
    try:
        parsed = json.loads(body)
        error = parsed["error"]
    except (ValueError, KeyError, TypeError):
        return f"the error body is not Anthropic's: {body[:300]!r}"
    if parsed.get("type") != "error" or not isinstance(error, dict):
        return f"the error body is not Anthropic's: {body[:300]!r}"
    if set(error) != {"type", "message"} or error["type"] not in anthropic_fuzz.ERROR_TYPES:
        return f"the error is not a clean refusal: {body[:300]!r}"
    if not isinstance(error["message"], str) or "Traceback" in error["message"]:
        return f"the error message is no message: {error['message']!r}"[:500]
    return None


def anthropic_events_problem(text: str) -> str | None:
    """Why `text` is not a finished stream of Anthropic's events, each `event:` and
    `data:`, the first `message_start` and the last `message_stop` (or a clean `error`)."""
    events = []
    for block in (block for block in text.split("\n\n") if block):
        name, _, data = block.partition("\n")
        if not name.startswith("event: ") or not data.startswith("data: "):
            return f"not an event: {block[:300]!r}"
        event = json.loads(data.removeprefix("data: "))
        if name.removeprefix("event: ") != event.get("type"):
            return f"the event's name is not its type: {block[:300]!r}"
        if event["type"] == "error":
            return anthropic_error_problem(data.removeprefix("data: ").encode())
        events.append(event["type"])
    if not events or events[0] != "message_start" or events[-1] != "message_stop":
        return f"the stream is not a whole message: {text[:300]!r} ... {text[-300:]!r}"
    return None


class Fuzzed:
    """The fuzzed server, a client of it, and the greedy answer from before fuzzing."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        assert server.http_port is not None
        self.port = server.http_port
        self.client = httpx.Client(base_url=server.http_url, timeout=CLIENT_TIMEOUT_S)
        self.greedy_before = self.greedy()
        self._log_read = 0

    def greedy(self) -> str:
        reply = self.client.post("/v1/completions", json=GREEDY)
        assert reply.status_code == 200, reply.text
        text: str = reply.json()["choices"][0]["text"]
        return text

    def send(
        self,
        method: str,
        path: str,
        content: bytes | None = None,
        headers: dict[str, bytes] | None = None,
        label: str | None = None,
        clean: frozenset[int] | set[int] = CLEAN,
    ) -> httpx.Response:
        """One request; fails unless its answer is clean."""
        try:
            reply = self.client.request(method, path, content=content, headers=headers)
        except httpx.TimeoutException:
            self.fail(f"{method} {path}: no answer within {CLIENT_TIMEOUT_S} s")
        except httpx.TransportError as error:
            self.fail(f"{method} {path}: the connection failed: {error!r}")
        CODES[f"{label or path} {reply.status_code}"] += 1
        problem = self.problem(reply, clean)
        if problem is not None:
            self.fail(f"{method} {path} -> {reply.status_code}: {problem}")
        return reply

    def problem(self, reply: httpx.Response, clean: frozenset[int] | set[int]) -> str | None:
        status = reply.status_code
        if status not in clean:
            return f"{status} is not a clean answer: {reply.text[:500]!r}"
        if reply.request.method == "HEAD":
            return None
        if reply.request.method == "POST" and reply.request.url.path in anthropic_fuzz.PATHS:
            if status >= 400:
                return anthropic_error_problem(reply.content)
            if reply.headers.get("content-type", "").startswith("text/event-stream"):
                return anthropic_events_problem(reply.text)
            reply.json()
            return None
        if status >= 400:
            return error_problem(reply.content)
        if reply.headers.get("content-type", "").startswith("text/event-stream"):
            if reply.request.url.path == "/v1/responses":
                return responses_events_problem(reply.text)
            return events_problem(reply.text)
        if reply.headers.get("content-type") == "application/json":
            reply.json()
        return None

    def check_raw(self, reply: Reply | None, label: str) -> None:
        """A raw exchange's answer (None: the server closed without one) is clean."""
        CODES[f"{label} {reply.status if reply else 'closed'}"] += 1
        problem = None
        if reply is not None and reply.status not in CLEAN:
            problem = f"{reply.status} is not a clean answer: {reply.body[:300]!r}"
        elif reply is not None and reply.status >= 400:
            problem = error_problem(reply.body)
        if problem is not None:
            self.fail(f"{label}: {problem}")

    def logged_error(self) -> str | None:
        """The server's first error line since the last look (an unhandled exception,
        which a clean status may hide); looked for after each test, once its lines are in."""
        time.sleep(0.2)
        lines = self.server.log_lines
        new, self._log_read = lines[self._log_read :], len(lines)
        errors = [line for line in new if '"level": "error"' in line or "Traceback" in line]
        return f"the server logged an error:\n{errors[0][:3000]}" if errors else None

    def fail(self, message: str) -> None:
        pytest.fail(f"{message}\n{self.server.exit_report()}")


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    config = tmp_path_factory.mktemp("http-fuzz") / "inferwire.yaml"
    config.write_text(CONFIG)
    server = start_serving_server("--config", str(config))
    try:
        fuzzed = Fuzzed(server)
        try:
            yield fuzzed
        finally:
            fuzzed.client.close()
    finally:
        stop_server_process(server)
        figures.record_counts("HTTP fuzzing: answers by route and status", CODES)


@pytest.fixture(autouse=True)
def quiet_log(fuzzed: Fuzzed) -> Iterator[None]:
    """No test leaves an error in the server's log."""
    yield
    if (error := fuzzed.logged_error()) is not None:
        fuzzed.fail(error)


# ---- bodies --------------------------------------------------------------------------


@pytest.mark.parametrize("shaped", [False, True], ids=["random-json", "request-shaped"])
@pytest.mark.parametrize("path", BODY_ROUTES)
def test_json_bodies_get_a_clean_answer(fuzzed, path, shaped):
    """Random JSON values; and request bodies with one wild field among plausible ones,
    written mostly with `\\u` escapes (lone surrogates too), else as UTF-8 (where a lone
    surrogate is bytes that are not UTF-8)."""

    @fuzz.FUZZ_SETTINGS
    @given(
        value=BODIES[path] if shaped else http_fuzz.json_value,
        escaped=st.sampled_from([True, True, True, False]),
    )
    def send(value: object, escaped: bool) -> None:
        headers = {"content-type": b"application/json"}
        fuzzed.send("POST", path, body_bytes(value, escaped), headers)

    send()


@pytest.mark.parametrize("path", BODY_ROUTES)
def test_raw_bodies_of_any_content_type_get_a_clean_answer(fuzzed, path):
    @fuzz.FUZZ_SETTINGS
    @given(
        content=st.one_of(st.none(), http_fuzz.raw_body(BODIES[path])),
        content_type=http_fuzz.content_type,
    )
    def send(content: bytes | None, content_type: str | None) -> None:
        headers = {} if content_type is None else {"content-type": content_type.encode()}
        fuzzed.send("POST", path, content, headers)

    send()


# ---- methods, paths, headers ----------------------------------------------------------


def test_methods_paths_and_headers_get_a_clean_answer(fuzzed):
    @fuzz.FUZZ_SETTINGS
    @given(method=http_fuzz.method, path=http_fuzz.path, headers=http_fuzz.headers)
    def send(method: str, path: str, headers: dict[str, bytes]) -> None:
        content = json.dumps({"model": "sim", "prompt": "x", "max_tokens": 2}).encode()
        # 307: Starlette's redirect of a route's path with a trailing slash.
        clean = CLEAN | {307}
        fuzzed.send(method, path, content if method == "POST" else None, headers, "paths", clean)

    send()


def test_mangled_request_heads_get_400_with_openai_s_body_or_a_clean_answer(fuzzed):
    request = b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n{"a": 1}\n'

    @FEWER
    @given(
        data=st.one_of(
            st.binary(min_size=1, max_size=256).map(lambda b: b + b"\r\n\r\n"),
            st.builds(
                lambda at, junk: request[:at] + junk + request[at:],
                st.integers(0, len(request)),
                st.binary(min_size=1, max_size=8),
            ),
        )
    )
    def send(data: bytes) -> None:
        # Half-closed after the bytes: a request that is still incomplete ends at once.
        fuzzed.check_raw(exchange(fuzzed.port, data, half_close=True), "raw heads")

    send()


@pytest.mark.parametrize(
    "head",
    [
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 20_000 + b"\r\n",
        b"GET /" + b"a" * (1 << 20) + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 17_000 + b"\r\n\r\n",
    ],
    ids=["1-MiB-header", "20000-headers", "1-MiB-url", "17-KiB-header"],
)
def test_a_head_over_16_kib_gets_431_and_the_connection_closes(fuzzed, head):
    started = time.monotonic()
    reply = exchange(fuzzed.port, head)  # None: reset while sending, the 431 lost with it
    fuzzed.check_raw(reply, "huge heads")
    assert reply is None or reply.status == 431, reply
    assert time.monotonic() - started < SLACK_S
    small = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 15_000 + b"\r\n\r\n"
    assert (small_reply := exchange(fuzzed.port, small)) is not None
    assert small_reply.status == 200


# ---- what the fuzzing found -------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", '{"model": "\\ud800", "prompt": "x"}', "model"),
        ("/v1/completions", '{"model": "demo", "prompt": "a\\udfff"}', "prompt"),
        (
            "/v1/completions",
            '{"model": "demo", "prompt": "x", "request_id": "\\ud800"}',
            "request_id",
        ),
        (
            "/v1/completions",
            '{"model": "sim", "prompt": "x", "guided_regex": "\\uD800"}',
            "guided_regex",
        ),
        ("/v1/completions", '{"model": "sim", "prompt": "x", "stop": ["\\ud800"]}', "stop[0]"),
        (
            "/v1/chat/completions",
            '{"model": "demo", "messages": [{"role": "user", "content": "\\ud800"}]}',
            "messages[0].content",
        ),
        ("/tokenize", '{"model": "demo", "prompt": "\\ud800"}', "prompt"),
        ("/v1/responses", '{"model": "demo", "input": "\\ud800"}', "input"),
        (
            "/v1/responses",
            '{"model": "demo", "input": [{"role": "user", "content": "a\\udfff"}]}',
            "input[0].content",
        ),
        ("/tokenize", '{"model": "sim", "\\udc00": 1, "prompt": "x"}', "body"),
    ],
)
def test_a_lone_surrogate_is_400_naming_its_field(fuzzed, path, body, param):
    reply = fuzzed.send("POST", path, body.encode(), label="regressions")
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert "lone surrogate" in error["message"]
    assert error["param"] == param


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("request_id", ["a\nb", "漢字", "tab\there", "\x7f"])
def test_a_request_id_no_header_can_carry_is_400(fuzzed, request_id, stream):
    body = {"model": "demo", "prompt": "x", "max_tokens": 2, "request_id": request_id}
    content = json.dumps({**body, "stream": stream}).encode()
    reply = fuzzed.send("POST", "/v1/completions", content, label="regressions")
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "request_id"


def test_an_x_request_id_header_comes_back_as_sent(fuzzed):
    headers = {"x-request-id": b"caf\xe9 \xff"}
    content = json.dumps({"model": "demo", "prompt": "x", "max_tokens": 2}).encode()
    reply = fuzzed.send("POST", "/v1/completions", content, headers, "regressions")
    assert reply.status_code == 200 and dict(reply.headers.raw)[b"x-request-id"] == b"caf\xe9 \xff"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_character_without_a_token_is_spelled_from_byte_tokens(fuzzed, path, stream):
    # The demo model's vocabulary has no token for U+0800 (once a 400 from og.Generator):
    # the continuous path spells it from byte tokens under the regex.
    body = {"model": "demo", "max_tokens": 8, "guided_regex": "\u0800", "stream": stream}
    body |= {"messages": [{"role": "user", "content": "0"}]} if "chat" in path else {"prompt": "0"}
    reply = fuzzed.send("POST", path, json.dumps(body).encode(), label="regressions")
    assert reply.status_code == 200, reply.text
    if not stream:
        choice = reply.json()["choices"][0]
        assert (choice["message"]["content"] if "chat" in path else choice["text"]) == "\u0800"
        return
    chunks = [
        json.loads(line[len("data: ") :])
        for line in reply.text.splitlines()
        if line.startswith("data: {")
    ]
    pieces = [
        c["choices"][0]["delta"].get("content") or "" if "chat" in path else c["choices"][0]["text"]
        for c in chunks
    ]
    assert "".join(pieces) == "\u0800"


# ---- bodies cut short and slow senders --------------------------------------------------

BODY_HEAD = (
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 1000\r\n\r\n"
)
CHUNKED_HEAD = b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
SLOW_HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 200
HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


def test_a_body_shorter_than_its_content_length_is_dropped_when_the_client_closes(fuzzed):
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", fuzzed.port)) as sock:
            sock.sendall(BODY_HEAD + b'{"model": "demo", "prompt": ')
    assert fuzzed.send("GET", "/health").status_code == 200


@pytest.mark.parametrize("head", [BODY_HEAD, CHUNKED_HEAD + b"ff\r\n"], ids=["length", "chunked"])
def test_a_body_that_stops_coming_gets_408_within_the_read_timeout(fuzzed, head):
    started = time.monotonic()
    reply = exchange(fuzzed.port, head + b'{"model": "demo", "prompt": ')
    fuzzed.check_raw(reply, "cut-short bodies")
    assert reply is not None and reply.status == 408
    assert json.loads(reply.body)["error"]["code"] == "deadline_exceeded"
    assert READ_TIMEOUT_S - 0.5 < time.monotonic() - started < READ_TIMEOUT_S + SLACK_S


# What a slow sender first sends at once, what it then sends a byte every 0.1 s, the
# answers it gets, and by when the server closes its connection (in read timeouts).
SLOW_SENDERS = {
    "idle": (b"", b"", [], 1),
    "head": (b"", SLOW_HEAD, [], 1),
    "body": (BODY_HEAD, b'{"model": "demo"}', [408], 2),  # then the rest is dropped
    "chunked-body": (CHUNKED_HEAD, b"1\r\na\r\n", [408], 2),
    "head-after-a-request": (HEALTH, SLOW_HEAD, [200], 1),  # on a kept-alive connection
}


def test_slow_senders_are_cut_off_while_other_clients_are_served(fuzzed):
    cap_s = 3 * READ_TIMEOUT_S + 2 * SLACK_S
    outcomes: dict[str, object] = {}

    def run(name: str, first: bytes, drip: bytes) -> None:
        outcomes[name] = slow_sender(fuzzed.port, first, drip, every_s=0.1, cap_s=cap_s)

    threads = [
        threading.Thread(target=run, args=(f"{name}-{i}", first, drip), daemon=True)
        for name, (first, drip, _, _) in SLOW_SENDERS.items()
        for i in range(3)
    ]
    for thread in threads:
        thread.start()
    served, slowest = 0, 0.0
    stream = json.dumps({"model": "sim", "prompt": "x", "max_tokens": 8, "stream": True})
    while any(thread.is_alive() for thread in threads):
        started = time.monotonic()
        assert fuzzed.greedy() == fuzzed.greedy_before
        fuzzed.send("POST", "/v1/completions", stream.encode(), label="beside slow senders")
        fuzzed.send("GET", "/health", label="beside slow senders")
        served, slowest = served + 1, max(slowest, time.monotonic() - started)
    for thread in threads:
        thread.join()
    title = f"HTTP fuzzing: served beside {len(threads)} slow senders"
    figures.record(title, f"{served} rounds, the slowest in {slowest:.2f} s")
    assert served >= 5 and slowest < SLACK_S
    for name, outcome in outcomes.items():
        _, _, statuses, timeouts = SLOW_SENDERS[name.rsplit("-", 1)[0]]
        assert [reply.status for reply in outcome.replies] == statuses, (name, outcome)
        for reply in outcome.replies:
            assert reply.status == 200 or error_problem(reply.body) is None, (name, reply)
        assert outcome.closed_s is not None, f"{name}: still open after {cap_s} s"
        assert outcome.closed_s < timeouts * READ_TIMEOUT_S + SLACK_S, (name, outcome)


def test_after_fuzzing_the_server_is_serving_and_answers_as_before(fuzzed):
    assert fuzzed.send("GET", "/health").status_code == 200
    with grpc.insecure_channel(fuzzed.server.target) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=CLIENT_TIMEOUT_S
        )
    assert check.status == health_pb2.HealthCheckResponse.SERVING
    assert fuzzed.greedy() == fuzzed.greedy_before
    assert fuzzed.server.process.poll() is None, fuzzed.server.exit_report()

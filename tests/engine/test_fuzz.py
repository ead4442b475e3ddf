"""Fuzzing every request message, and raw payloads to every method (inferwire.v1, KServe
v2's inference.GRPCInferenceService, grpc.health.v1), against a real
`inferwire serve`: each reply is a success or a clean client-side code, never INTERNAL,
UNKNOWN or a hang; afterwards the server is SERVING and answers as before.

The server runs as its own process (the fuzzer loads and unloads its models) and is
called with the synchronous client, which Hypothesis drives. The codes seen are
printed in pytest's summary (`tests.support.figures`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import example, given

from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support import figures, fuzz
from tests.support.process import (
    ServerProcess,
    start_serving_server,
    stop_server_process,
)

DEADLINE_S = 10.0
CLEAN = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
CONFIG = """\
server:
  max_prompt_bytes: 4096
  max_receive_message_bytes: 65536
  grace_period_s: 1
models:
  - {name: demo, load_on_startup: true, options: {path: builtin}}
  - {name: spare, options: {path: builtin}}
  - {name: broken, options: {path: /nonexistent/inferwire-model}}
"""
GREEDY = pb.InferRequest(
    model="demo",
    prompt="KING HENRY:\n",
    parameters=pb.GenerationParameters(max_tokens=24, temperature=0),
)
CODES: Counter[str] = Counter()


class Fuzzed:
    """The fuzzed server, a channel to it, and the greedy answer from before fuzzing."""

    def __init__(self, server: ServerProcess, channel: grpc.Channel) -> None:
        self.server = server
        self.channel = channel
        self.stub = inference_pb2_grpc.InferenceServiceStub(channel)
        self.greedy_before = self.stub.Infer(GREEDY, timeout=DEADLINE_S).text

    def send(self, method: str, payload: bytes) -> None:
        """Send one request's bytes; fail unless it succeeds or ends with a clean code."""
        details = ""
        try:
            if method in fuzz.BIDI_METHODS:  # one stream carrying the payload twice
                for _ in self.channel.stream_stream(method)(
                    iter([payload] * 2), timeout=DEADLINE_S
                ):
                    pass
            elif method in fuzz.STREAM_METHODS:
                call = self.channel.unary_stream(method)(payload, timeout=DEADLINE_S)
                for _ in call:
                    if method.endswith("/Watch"):  # never ends by itself; one status answers
                        call.cancel()
                        break
            else:
                self.channel.unary_unary(method)(payload, timeout=DEADLINE_S)
            code = grpc.StatusCode.OK
        except grpc.RpcError as error:
            code, details = error.code(), error.details()
        if code == grpc.StatusCode.CANCELLED and method.endswith("/Watch"):
            code = grpc.StatusCode.OK  # our own cancel after the first status
        CODES[f"{method.rsplit('/', 1)[1]} {code.name}"] += 1
        if code not in CLEAN:
            # Access lines say little when the server went away: its exit status and its
            # other lines do, a crash's faulthandler stack first.
            pytest.fail(f"{method} ended {code.name}: {details}\n{self.server.exit_report()}")


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    config = tmp_path_factory.mktemp("fuzz") / "inferwire.yaml"
    config.write_text(CONFIG)
    server = start_serving_server("--config", str(config))
    try:
        with grpc.insecure_channel(server.target) as channel:
            yield Fuzzed(server, channel)
    finally:
        stop_server_process(server)
        figures.record_counts("fuzzing: calls by method and code", CODES)


@pytest.fixture(autouse=True)
def demo_loaded(fuzzed: Fuzzed) -> None:
    """Each method's fuzzing starts with `demo` loaded, whatever the previous one did."""
    fuzzed.stub.LoadModel(pb.LoadModelRequest(model="demo"), timeout=DEADLINE_S)


ALL_METHODS = sorted({**fuzz.UNARY_METHODS, **fuzz.STREAM_METHODS, **fuzz.BIDI_METHODS}.items())


@pytest.mark.parametrize(("method", "requests"), ALL_METHODS, ids=[m for m, _ in ALL_METHODS])
def test_every_request_message_gets_a_clean_answer(fuzzed, method, requests):
    def send_message(request) -> None:
        fuzzed.send(method, request.SerializeToString())

    if method.endswith(("/Infer", "/InferStream")):
        message_type = pb.InferRequest if method.endswith("/Infer") else pb.InferStreamRequest
        for extreme in fuzz.extreme_parameter_requests(message_type):
            send_message = example(request=extreme)(send_message)
    fuzz.FUZZ_SETTINGS(given(request=requests)(send_message))()


@pytest.mark.parametrize(("method", "requests"), ALL_METHODS, ids=[m for m, _ in ALL_METHODS])
def test_every_raw_payload_gets_a_clean_answer(fuzzed, method, requests):
    @fuzz.FUZZ_SETTINGS
    @given(payload=fuzz.raw_payload(requests))
    def send_bytes(payload: bytes) -> None:
        fuzzed.send(method, payload)

    send_bytes()


def test_after_fuzzing_the_server_is_serving_and_answers_as_before(fuzzed):
    health = health_pb2_grpc.HealthStub(fuzzed.channel)
    check = health.Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE_S)
    assert check.status == health_pb2.HealthCheckResponse.SERVING
    assert fuzzed.stub.Infer(GREEDY, timeout=DEADLINE_S).text == fuzzed.greedy_before
    assert fuzzed.server.process.poll() is None

"""A real `inferwire serve` process: the CLI against it, and graceful shutdown on SIGTERM."""

import asyncio
import json
import re
import signal

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.engine import SLOW_READER_OPTIONS
from tests.support.process import (
    run_cli,
    start_server_process,
    start_serving_server,
    stop_server_process,
    wait_cli_serving,
)
from tests.support.waiting import read_rest


@pytest.fixture(scope="module")
def served():
    server = start_server_process()
    try:
        assert run_cli("health", "--address", server.target).returncode in (0, 1)
        yield server
    finally:
        stop_server_process(server)


def test_serve_on_a_taken_port_exits_1_with_one_line_saying_why(served):
    result = run_cli("serve", "--address", served.target)
    assert result.returncode == 1
    # Only our line: no traceback, and gRPC core's own log of the failed bind is held back.
    assert result.stderr.splitlines() == [
        f"error: could not listen on {served.target}: Address already in use"
    ]


def test_serve_on_a_taken_metrics_port_names_the_setting_and_the_flag_turns_metrics_off(served):
    [port] = [json.loads(line)["port"] for line in served.log_lines if "metrics listening" in line]
    metrics = f"127.0.0.1:{port}"
    result = run_cli("serve", "--address", "127.0.0.1:0", "--metrics-address", metrics)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"error: server.metrics_address: could not serve metrics on {metrics}: "
        "Address already in use"
    ]
    without_metrics = start_server_process("--metrics-address", "")
    try:
        assert not any("metrics listening" in line for line in without_metrics.log_lines)
    finally:
        stop_server_process(without_metrics)


def test_cli_health_exit_codes(served):
    wait_cli_serving(served.target)
    ok = run_cli("health", "--address", served.target)
    assert (ok.returncode, ok.stdout.strip()) == (0, "SERVING")
    assert run_cli("health", "--service", "model/demo", "--address", served.target).returncode == 0
    unknown = run_cli("health", "--service", "model/nope", "--address", served.target)
    assert unknown.returncode == 1
    assert "NOT_FOUND" in unknown.stderr


def test_cli_infer_unary_and_stream(served):
    wait_cli_serving(served.target)
    unary = run_cli(
        "infer", "demo", "Hello", "--max-tokens", "16", "--temperature", "0",
        "--usage", "--address", served.target,
    )  # fmt: skip
    assert unary.returncode == 0, unary.stderr
    assert unary.stdout.strip()
    usage = r"finish_reason=LENGTH prompt_tokens=\d+ completion_tokens=16 queue_ms=\d+\.\d "
    usage += r"ttft_ms=\d+\.\d total_ms=\d+\.\d request_id=[0-9a-f]{32}\n"
    assert re.fullmatch(usage, unary.stderr), unary.stderr
    streamed = run_cli(
        "infer", "demo", "Hello", "--stream", "--max-tokens", "16", "--temperature", "0",
        "--usage", "--address", served.target,
    )  # fmt: skip
    assert streamed.returncode == 0, streamed.stderr
    assert streamed.stdout == unary.stdout
    assert re.fullmatch(usage, streamed.stderr), streamed.stderr


def test_cli_infer_reads_the_prompt_from_standard_input(served):
    wait_cli_serving(served.target)
    args = ("--max-tokens", "16", "--temperature", "0", "--address", served.target)
    from_argument = run_cli("infer", "demo", "KING HENRY:\n", *args)
    from_stdin = run_cli("infer", "demo", "-", *args, stdin="KING HENRY:\n")
    assert from_stdin.returncode == 0, from_stdin.stderr
    assert from_stdin.stdout == from_argument.stdout
    assert from_stdin.stdout.strip()


def test_cli_reports_invalid_argument_with_each_field_once(served):
    wait_cli_serving(served.target)
    result = run_cli("infer", "demo", "", "--stop", "", "--address", served.target)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[0] == "error: INVALID_ARGUMENT: 2 invalid fields"
    assert [line.split(":")[0] for line in lines[1:]] == ["  prompt", "  parameters.stop[0]"]


def test_cli_models_unload_and_load(served):
    wait_cli_serving(served.target)
    listed = run_cli("models", "list", "--address", served.target)
    assert "demo" in listed.stdout and "MODEL_STATE_READY" in listed.stdout
    assert "adapter of demo" in listed.stdout  # demo-sonnets, in the default configuration
    refused = run_cli("models", "unload", "demo", "--address", served.target)
    assert refused.returncode == 1 and "demo-sonnets" in refused.stderr, refused.stderr
    unloaded = run_cli("models", "unload", "demo-sonnets", "--address", served.target)
    assert "MODEL_STATE_UNLOADED" in unloaded.stdout
    unloaded = run_cli("models", "unload", "demo", "--address", served.target)
    assert "MODEL_STATE_UNLOADED" in unloaded.stdout
    assert run_cli("health", "--service", "model/demo", "--address", served.target).returncode == 1
    refused = run_cli("infer", "demo", "Hi", env={"INFERWIRE_ADDRESS": served.target})
    assert refused.returncode == 1 and "FAILED_PRECONDITION" in refused.stderr
    assert refused.stderr.endswith("\nhint: inferwire models load demo\n")
    loaded = run_cli("models", "load", "demo", "--address", served.target)
    assert "MODEL_STATE_READY" in loaded.stdout
    assert run_cli("health", "--service", "model/demo", "--address", served.target).returncode == 0
    loaded = run_cli("models", "load", "demo-sonnets", "--address", served.target)
    assert "MODEL_STATE_READY" in loaded.stdout and "adapter of demo" in loaded.stdout


async def test_sigterm_drains_inflight_stream_refuses_new_calls_and_exits_zero():
    server = start_server_process("--grace-period", "20")
    try:
        async with (
            grpc.aio.insecure_channel(server.target) as channel,
            grpc.aio.insecure_channel(server.target, options=SLOW_READER_OPTIONS) as slow,
        ):
            health = health_pb2_grpc.HealthStub(channel)
            await health.Check(health_pb2.HealthCheckRequest(service=""), wait_for_ready=True)
            watch = health.Watch(health_pb2.HealthCheckRequest(service="model/demo"))
            while (await watch.read()).status != health_pb2.HealthCheckResponse.SERVING:
                pass
            stub = inference_pb2_grpc.InferenceServiceStub(channel)
            stream = inference_pb2_grpc.InferenceServiceStub(slow).InferStream(
                pb.InferStreamRequest(
                    model="demo",
                    prompt="Hello",
                    parameters=pb.GenerationParameters(max_tokens=1000, temperature=0),
                )
            )
            first = await stream.read()

            server.process.send_signal(signal.SIGTERM)
            # 1. Health turns NOT_SERVING, and the Watch stream ends.
            after = [m.status for m in await read_rest(watch)]
            assert after == [health_pb2.HealthCheckResponse.NOT_SERVING]
            # 2. New RPCs are refused.
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                for _ in range(100):
                    await stub.ListModels(pb.ListModelsRequest(), timeout=5)
                    await asyncio.sleep(0.05)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            # 3. The in-flight stream still finishes in full.
            rest = await read_rest(stream)
            assert rest[-1].finish_reason == pb.FINISH_REASON_LENGTH
            assert rest[-1].usage.completion_tokens == 1000
            assert "".join(m.text for m in [first, *rest])
        # 4. The process exits 0.
        assert await asyncio.to_thread(server.process.wait, 30) == 0
        assert any('"stopped"' in line for line in server.log_lines)
    finally:
        stop_server_process(server)


MISSING_MODEL = (
    "models:\n  - name: ghost\n    load_on_startup: true\n    options: {path: /nonexistent/m}\n"
)


@pytest.mark.parametrize(
    ("config", "flags", "message"),
    [
        (
            "models:\n  - name: m\n    backend: tensorflow\n",
            [],
            "unknown backend 'tensorflow'",
        ),
        ("server: [\n  bad", [], "line 2, column 6: not valid YAML: expected ',' or ']'"),
        (
            "",
            ["--log-level", "LOUD"],
            "server.log_level: Input should be 'CRITICAL', 'ERROR', 'WARNING', 'INFO' or 'DEBUG'",
        ),
        ("", ["--address", "localhost"], "server.address: must be host:port with a port"),
        ("server:\n  grace_period_s: -1\n", [], "server.grace_period_s: Input should be"),
    ],
)
def test_serve_with_a_bad_config_exits_2_with_one_line_naming_the_problem(
    tmp_path, config, flags, message
):
    path = tmp_path / "inferwire.yaml"
    path.write_text(config)
    result = run_cli("serve", "--config", str(path), *flags)
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("error: invalid configuration: ")
    assert message in line
    assert "pydantic" not in line and "type=" not in line and "input_value" not in line


def test_serve_exits_1_naming_a_startup_model_that_failed_to_load(tmp_path):
    config = tmp_path / "inferwire.yaml"
    config.write_text(MISSING_MODEL)
    result = run_cli("serve", "--config", str(config), "--address", "127.0.0.1:0")
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert [line for line in lines if line.startswith("error:")] == [
        "error: model 'ghost' failed to load: /nonexistent/m/genai_config.json not found; "
        "options.path must be a directory in ONNX Runtime GenAI format"
    ]
    assert any('"stopped"' in line for line in lines[:-1])  # it drained before exiting


def test_a_server_that_never_serves_is_reported_with_its_own_status_and_words(tmp_path):
    # The test helper: a server that exits after listening is not blamed on the health
    # check's "connection refused", nor read as killed by the helper's own SIGKILL.
    config = tmp_path / "inferwire.yaml"
    config.write_text(MISSING_MODEL)
    with pytest.raises(AssertionError) as caught:
        start_serving_server("--config", str(config))
    report = str(caught.value)
    assert "server exit status: 1\n" in report
    assert "/nonexistent/m/genai_config.json not found" in report


def test_serve_stays_up_not_serving_when_exit_on_startup_failure_is_off(tmp_path):
    config = tmp_path / "inferwire.yaml"
    config.write_text(MISSING_MODEL)
    server = start_server_process(
        "--config", str(config), env={"INFERWIRE_SERVER__EXIT_ON_STARTUP_FAILURE": "false"}
    )
    try:
        for _ in range(300):  # the start-up load runs once the port is open
            listed = run_cli("models", "list", "--address", server.target)
            if "MODEL_STATE_LOADING" not in listed.stdout:
                break
        assert "MODEL_STATE_FAILED" in listed.stdout
        health = run_cli("health", "--address", server.target)
        assert (health.returncode, health.stdout) == (1, "NOT_SERVING\n")
        assert server.process.poll() is None
    finally:
        stop_server_process(server)

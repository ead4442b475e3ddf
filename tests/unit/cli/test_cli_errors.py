"""What the CLI says when a newcomer gets something wrong: a `hint:` for each call that
could not connect or was refused for want of a token, and usage errors (exit 2), said
before any call, for files and values the server would refuse. In-process (CliRunner),
against fake-backed servers of their own, with TLS certificates from tests.support.certs.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner, Result

from inferwire.cli import app
from inferwire.config import load_settings
from inferwire.core.errors import InvalidArgumentError
from inferwire.core.requests import InferenceRequest
from inferwire.core.sampling import GenerationParams
from inferwire.core.validation import RequestLimits, validate_inference_request
from inferwire.server import InferwireServer
from tests.support.auth import start_server, tokens_yaml
from tests.support.certs import CertificateAuthority, Pki, write_pki
from tests.support.fake_backend import FAKE_BACKEND, FakeBackends, serving_fakes

runner = CliRunner()
UNREACHABLE = "127.0.0.1:1"  # nothing listens there
# Usage errors come in a rich box: wide enough that no path is wrapped, and no token or
# TLS file from the environment the tests run in.
CLEAN_ENV: dict[str, str | None] = {
    "COLUMNS": "1000",
    "INFERWIRE_TOKEN": None,
    "INFERWIRE_TLS_CA": None,
    "INFERWIRE_TLS_CERT": None,
    "INFERWIRE_TLS_KEY": None,
}


def invoke(*args: str) -> Result:
    return runner.invoke(app, list(args), env={"INFERWIRE_ADDRESS": UNREACHABLE, **CLEAN_ENV})


async def invoke_at(port: int, *args: str) -> Result:
    argv = [*args, "--address", f"127.0.0.1:{port}"]
    return await asyncio.to_thread(runner.invoke, app, argv, env=CLEAN_ENV)


def usage_error(result: Result) -> str:
    """The usage error's text on one line, without its box."""
    assert result.exit_code == 2, result.output
    boxed = [line.strip("│ ") for line in result.stderr.splitlines() if line.startswith("│")]
    return " ".join(" ".join(boxed).split())


def hint(result: Result) -> str:
    assert result.exit_code == 1, result.output
    [line] = [line for line in result.stderr.splitlines() if line.startswith("hint: ")]
    return line.removeprefix("hint: ")


# Connections that fail


def test_a_call_where_nothing_listens_asks_whether_the_server_runs_there():
    result = invoke("models", "list")
    assert result.stderr.startswith("error: UNAVAILABLE: ")
    assert hint(result) == (
        f"nothing answers at {UNREACHABLE}: is the server running, and is this its address "
        "(--address or INFERWIRE_ADDRESS)?"
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return write_pki(tmp_path_factory.mktemp("pki"))


def settings_with_tls(pki: Pki | None, mutual: bool = False) -> Any:
    tls = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)} if pki else {}
    if pki and mutual:
        tls["client_ca_file"] = str(pki.ca)
    return load_settings(
        server={
            "address": "127.0.0.1:0",
            "metrics_address": "",
            "health_check_interval_s": 3600,
            "tls": tls,
        },
        models=[{"name": "m", "backend": FAKE_BACKEND, "load_on_startup": True}],
    )


async def test_tls_mistakes_get_a_hint_naming_the_flags_to_give_or_leave_out(pki, tmp_path):
    ca = ["--tls-ca", str(pki.ca)]
    client = ["--tls-cert", str(pki.client_cert), "--tls-key", str(pki.client_key)]
    stranger = CertificateAuthority("another CA")
    stranger_ca = stranger.write(tmp_path, "stranger")
    stranger_cert, stranger_key = stranger.issue_client().write(tmp_path, "stranger-client")
    stranger_client = ["--tls-cert", str(stranger_cert), "--tls-key", str(stranger_key)]
    async with serving_fakes(settings_with_tls(pki, mutual=True)) as (server, _):
        plaintext = await invoke_at(server.port, "models", "list")
        assert plaintext.stderr.startswith("error: UNAVAILABLE: ")
        assert hint(plaintext) == (
            "the server may need TLS: give --tls-ca (and --tls-cert and --tls-key if it "
            "asks for a client certificate)"
        )
        no_certificate = await invoke_at(server.port, "models", "list", *ca)
        assert hint(no_certificate) == (
            "the server may ask for a client certificate: give --tls-cert and --tls-key"
        )
        other_ca = await invoke_at(server.port, "health", "--tls-ca", str(stranger_ca), *client)
        assert hint(other_ca) == "the server's certificate is not signed by a CA in --tls-ca"
        refused = await invoke_at(server.port, "health", *ca, *stranger_client)
        assert hint(refused) == "the server may not accept the client certificate in --tls-cert"
        mutual = await invoke_at(server.port, "health", *ca, *client)
        assert (mutual.exit_code, mutual.stdout) == (0, "SERVING\n")
    async with serving_fakes(settings_with_tls(None)) as (server, _):
        tls_to_plaintext = await invoke_at(server.port, "health", *ca)
        assert hint(tls_to_plaintext) == (
            "the server may not use TLS: call it without --tls-ca, --tls-cert and --tls-key"
        )


# Tokens


@pytest.fixture
async def token_server(tmp_path: Path) -> Any:
    path = tmp_path / "tokens.yaml"
    path.write_text(
        tokens_yaml(
            {
                "admin": ("admin-token", ["admin"], None),
                "none": ("sees-nothing", ["infer"], ["no-such-model-*"]),
            }
        )
    )
    server: InferwireServer = await start_server(path)
    try:
        yield server
    finally:
        await server.stop(grace_s=0)


async def test_a_call_without_a_token_is_hinted_at_the_flag_and_the_variable(token_server):
    result = await invoke_at(token_server.port, "models", "list")
    assert result.stderr.startswith("error: UNAUTHENTICATED: ")
    assert hint(result) == (
        "the server asks for a bearer token: give --token TOKEN or set INFERWIRE_TOKEN"
    )
    wrong = await invoke_at(token_server.port, "models", "list", "--token", "wrong")
    assert wrong.exit_code == 1 and "hint:" not in wrong.stderr  # a token was given


@pytest.mark.parametrize("pasted", ["Bearer admin-token", "bearer admin-token"])
async def test_a_token_pasted_with_its_scheme_is_used_without_it_and_a_hint(token_server, pasted):
    result = await invoke_at(token_server.port, "models", "list", "--token", pasted)
    assert result.exit_code == 0, result.output
    assert result.stdout.split()[0] == "m"
    assert result.stderr == "hint: give the token without the 'Bearer ' prefix; it was dropped\n"


async def test_models_list_says_when_the_token_sees_no_model(token_server):
    result = await invoke_at(token_server.port, "models", "list", "--token", "sees-nothing")
    assert (result.exit_code, result.stdout) == (0, "")
    assert result.stderr == (
        "no model is visible to this token (its `models:` patterns match none)\n"
    )


# Values and files refused before the call


def core_refuses_top_p(value: float) -> bool:
    request = InferenceRequest(
        request_id="", model="m", prompt="p", params=GenerationParams(top_p=value)
    )
    try:
        validate_inference_request(request, RequestLimits(max_prompt_bytes=1))
    except InvalidArgumentError:
        return True
    return False


@pytest.mark.parametrize("value", ["0", "-0.5", "1e-9", "0.5", "1", "1.000001", "nan"])
def test_top_p_is_refused_here_exactly_when_the_server_would_refuse_it(value):
    result = invoke("infer", "m", "hi", "--top-p", value)
    if core_refuses_top_p(float(value)):
        assert usage_error(result).startswith("Invalid value for '--top-p': must be in (0, 1]")
    else:  # sent, and the (absent) server is the only problem
        assert result.exit_code == 1 and "UNAVAILABLE" in result.stderr


def test_top_p_help_states_the_range_the_server_accepts():
    help_text = " ".join(runner.invoke(app, ["infer", "--help"], env=CLEAN_ENV).stdout.split())
    assert "0 < P <= 1" in help_text and "0<=x<=1" not in help_text
    assert core_refuses_top_p(0.0) and not core_refuses_top_p(1.0)


def test_a_json_schema_that_is_not_json_is_refused_with_its_line_and_column(tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text('{\n  "type": object\n}\n')
    with pytest.raises(json.JSONDecodeError):  # the file really is not JSON
        json.loads(schema.read_text())
    assert usage_error(invoke("infer", "m", "hi", "--json-schema", str(schema))) == (
        f"Invalid value for '--json-schema': {schema} is not valid JSON at line 2 column 11: "
        "Expecting value"
    )


FILE_FLAGS = [
    ["infer", "m", "--prompt-file"],
    ["infer", "m", "hi", "--json-schema"],
    ["infer", "m", "hi", "--lark-grammar"],
    ["health", "--tls-ca"],
    ["serve", "--config"],
]


@pytest.mark.parametrize("command", FILE_FLAGS, ids=lambda c: c[-1])
@pytest.mark.parametrize(("name", "why"), [("absent", "No such file or directory"), (".", "")])
def test_every_file_flag_refuses_a_missing_file_or_a_directory_in_one_style(
    tmp_path, command, name, why
):
    path = tmp_path / name if name != "." else tmp_path
    why = why or "Is a directory"
    flag = command[-1]
    assert usage_error(invoke(*command, str(path))) == (
        f"Invalid value for '{flag}': cannot read {path}: {why}"
    )


def test_tls_client_files_are_refused_in_the_same_style(tmp_path):
    key = tmp_path / "client.key"
    key.write_text("")
    result = invoke("health", "--tls-cert", str(tmp_path), "--tls-key", str(key))
    assert usage_error(result) == (
        f"Invalid value for '--tls-cert': cannot read {tmp_path}: Is a directory"
    )


# What `serve` says of its settings


def test_serve_metrics_address_flag_sets_the_setting_it_names():
    result = invoke("serve", "--metrics-address", "nowhere")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: invalid configuration: server.metrics_address: ")


async def test_a_taken_metrics_port_is_an_error_naming_the_setting():
    async with serving_fakes(settings_with_tls(None)) as (first, _):
        settings = settings_with_tls(None)
        settings.server.metrics_address = f"127.0.0.1:{first.port}"  # its gRPC port: in use
        second = InferwireServer(settings, backend_factory=FakeBackends())
        with pytest.raises(OSError) as error:
            await second.start()
        await second.stop(grace_s=0)
    assert str(error.value) == (
        f"server.metrics_address: could not serve metrics on 127.0.0.1:{first.port}: "
        "Address already in use"
    )


# Messages that say what is wrong


async def test_a_model_name_with_a_character_not_allowed_names_that_character(fake_server):
    result = await invoke_at(fake_server[0].port, "infer", "demo/x", "hi")
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "error: INVALID_ARGUMENT: 1 invalid field",
        "  model: '/' (character 5) is not allowed: a model name holds only letters, digits, "
        "'.', '_' and '-'",
    ]


def test_token_new_quotes_the_digest_as_the_docs_ask():
    result = runner.invoke(app, ["token", "new", "--name", "n", "--scope", "infer"])
    token, *entry = result.stdout.splitlines()
    [parsed] = yaml.safe_load("\n".join(entry))
    assert f'  sha256: "{parsed["sha256"]}"' in entry
    assert len(parsed["sha256"]) == 64 and token not in result.stdout.split("\n", 1)[1]

"""TLS and mutual TLS with the real tools: grpcurl, grpc_health_probe and the Go client
example, against live `inferwire serve` processes configured with test certificates."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import grpc
import pytest

from tests.polyglot.test_grpc_tools import PROBE_SERVING, SERVICE, json_messages
from tests.support.auth import tokens_yaml
from tests.support.certs import Pki, write_pki
from tests.support.polyglot import (
    CLIENTS,
    assert_example_output,
    grpcurl,
    require_tool,
    run_checked,
)
from tests.support.process import ServerProcess, start_serving_server, stop_server_process

GO_CLIENT = CLIENTS / "go"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return write_pki(tmp_path_factory.mktemp("pki"))


def serving(pki: Pki, mutual: bool) -> Iterator[ServerProcess]:
    credentials = grpc.ssl_channel_credentials(
        pki.ca.read_bytes(),
        pki.client_key.read_bytes() if mutual else None,
        pki.client_cert.read_bytes() if mutual else None,
    )
    server = start_serving_server(env=pki.server_env(mutual), credentials=credentials)
    try:
        yield server
    finally:
        stop_server_process(server)


@pytest.fixture(scope="module")
def tls_server(pki: Pki) -> Iterator[ServerProcess]:
    yield from serving(pki, mutual=False)


@pytest.fixture(scope="module")
def mtls_server(pki: Pki) -> Iterator[ServerProcess]:
    yield from serving(pki, mutual=True)


def grpcurl_flags(pki: Pki, mutual: bool) -> list[str]:
    flags = ["-cacert", str(pki.ca)]
    return [*flags, "-cert", str(pki.client_cert), "-key", str(pki.client_key)] if mutual else flags


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
def test_grpcurl_lists_describes_and_infers_over_tls(request, pki, mutual):
    server = request.getfixturevalue("mtls_server" if mutual else "tls_server")
    flags = grpcurl_flags(pki, mutual)
    listed = grpcurl(server.target, "list", flags=flags)
    assert listed.returncode == 0, listed.stderr
    assert SERVICE in listed.stdout.split()
    described = grpcurl(server.target, "describe", f"{SERVICE}.Infer", flags=flags)
    assert described.returncode == 0, described.stderr
    request_json = '{"model":"demo","prompt":"Hello","parameters":{"maxTokens":4}}'
    inferred = grpcurl(server.target, f"{SERVICE}/Infer", flags=[*flags, "-d", request_json])
    assert inferred.returncode == 0, inferred.stderr
    (response,) = json_messages(inferred.stdout)
    assert response["usage"]["completionTokens"] == 4


def test_grpcurl_without_a_client_certificate_is_refused_by_the_mtls_server(mtls_server, pki):
    refused = grpcurl(mtls_server.target, "list", flags=["-cacert", str(pki.ca)])
    assert refused.returncode != 0


def built_go_example() -> str:
    """Build the Go example (once per run: go caches it) and return its path."""
    run_checked(
        [require_tool("go"), "build", "-buildvcs=false", "-o", "bin/example", "./cmd/example"],
        cwd=GO_CLIENT,
        timeout=540,
    )
    return str(GO_CLIENT / "bin" / "example")


def probe(target: str, *args: str) -> subprocess.CompletedProcess[str]:
    command = [require_tool("grpc_health_probe"), "-addr", target, "-rpc-timeout", "5s", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


def test_grpc_health_probe_over_tls_and_mutual_tls(tls_server, mtls_server, pki):
    tls_flags = ["-tls", "-tls-ca-cert", str(pki.ca)]
    client = ["-tls-client-cert", str(pki.client_cert), "-tls-client-key", str(pki.client_key)]
    for target, flags in ((tls_server.target, tls_flags), (mtls_server.target, tls_flags + client)):
        result = probe(target, *flags, "-service", "model/demo")
        assert result.returncode == PROBE_SERVING, result.stdout + result.stderr
    assert probe(mtls_server.target, *tls_flags).returncode != PROBE_SERVING


@pytest.mark.timeout(600)  # a cold build compiles grpc-go: about 90 s on 2 busy cores
def test_go_example_over_tls_with_a_token(tls_server, mtls_server, pki):
    example = built_go_example()
    tls = ["-tls-ca", str(pki.ca), "-token", "test-token"]
    result = run_checked([example, *tls, tls_server.target, "demo"], cwd=GO_CLIENT, timeout=60)
    assert_example_output(result.stdout)

    mutual = [*tls, "-tls-cert", str(pki.client_cert), "-tls-key", str(pki.client_key)]
    result = run_checked([example, *mutual, mtls_server.target], cwd=GO_CLIENT, timeout=60)
    assert_example_output(result.stdout)

    plaintext_token = subprocess.run(
        [example, "-token", "t", tls_server.target], capture_output=True, text=True, timeout=60
    )
    assert plaintext_token.returncode == 1
    assert "-token needs TLS" in plaintext_token.stderr


@pytest.fixture(scope="module")
def secured_server(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """TLS plus a tokens file: `apps` may infer on every model."""
    tokens_file = tmp_path_factory.mktemp("tokens") / "tokens.yaml"
    tokens_file.write_text(tokens_yaml({"apps": (APP_TOKEN, ["infer"], None)}))
    credentials = grpc.ssl_channel_credentials(pki.ca.read_bytes())
    env = {**pki.server_env(), "INFERWIRE_SERVER__AUTH__TOKENS_FILE": str(tokens_file)}
    server = start_serving_server(env=env, credentials=credentials)
    try:
        yield server
    finally:
        stop_server_process(server)


APP_TOKEN = "iw-test-app-token-0123456789abcdef0123456789"


@pytest.mark.timeout(600)
def test_go_example_and_tools_call_a_tls_plus_token_server(secured_server, pki):
    example = built_go_example()
    result = run_checked(
        [example, "-tls-ca", str(pki.ca), "-token", APP_TOKEN, secured_server.target, "demo"],
        cwd=GO_CLIENT,
        timeout=60,
    )
    assert_example_output(result.stdout)
    wrong = subprocess.run(
        [example, "-tls-ca", str(pki.ca), "-token", "not-a-token", secured_server.target],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert wrong.returncode == 1
    assert "Unauthenticated" in wrong.stderr or "UNAUTHENTICATED" in wrong.stderr, wrong.stderr

    request_json = '{"model":"demo","prompt":"Hello","parameters":{"maxTokens":4}}'
    flags = ["-cacert", str(pki.ca), "-d", request_json]
    bearer = ["-H", f"authorization: Bearer {APP_TOKEN}"]
    inferred = grpcurl(secured_server.target, f"{SERVICE}/Infer", flags=[*flags, *bearer])
    assert inferred.returncode == 0, inferred.stderr
    refused = grpcurl(secured_server.target, f"{SERVICE}/Infer", flags=flags)
    assert "Unauthenticated" in refused.stderr, refused.stderr
    # Probes and reflection stay open without a token.
    assert grpcurl(secured_server.target, "list", flags=["-cacert", str(pki.ca)]).returncode == 0
    probed = probe(secured_server.target, "-tls", "-tls-ca-cert", str(pki.ca), "-service", "")
    assert probed.returncode == PROBE_SERVING, probed.stdout + probed.stderr

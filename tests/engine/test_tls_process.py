"""`inferwire serve` with TLS and mutual TLS as a real process, and the CLI against it
with --tls-ca, --tls-cert and --tls-key; a bad key is a configuration error (status 2)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.certs import CertificateAuthority, Pki, write_pki
from tests.support.process import (
    ServerProcess,
    run_cli,
    start_server_process,
    stop_server_process,
    wait_cli_serving,
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return write_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def mutual_server(pki: Pki) -> Iterator[ServerProcess]:
    server = start_server_process(env=pki.server_env(mutual=True))
    try:
        yield server
    finally:
        stop_server_process(server)


def test_cli_calls_a_mutual_tls_server_with_its_certificate(mutual_server, pki):
    mutual = ["--tls-ca", str(pki.ca), "--tls-cert", str(pki.client_cert)]
    mutual += ["--tls-key", str(pki.client_key)]
    target = ["--address", mutual_server.target]
    wait_cli_serving(mutual_server.target, *mutual)
    listed = run_cli("models", "list", *target, *mutual)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split()[:3] == ["demo", "onnxruntime-genai", "MODEL_STATE_READY"]
    infer = run_cli("infer", "demo", "Hello", "--max-tokens", "8", *target, *mutual)
    assert infer.returncode == 0, infer.stderr
    assert infer.stdout.strip()
    # The same through the environment, as INFERWIRE_ADDRESS works for --address.
    env = {"INFERWIRE_TLS_CA": str(pki.ca), "INFERWIRE_TLS_CERT": str(pki.client_cert)}
    env["INFERWIRE_TLS_KEY"] = str(pki.client_key)
    assert run_cli("health", *target, env=env).stdout == "SERVING\n"

    without_certificate = run_cli("health", *target, "--tls-ca", str(pki.ca))
    assert without_certificate.returncode == 1
    assert without_certificate.stderr.startswith("error: UNAVAILABLE: ")
    plaintext = run_cli("health", *target)
    assert plaintext.returncode == 1


def test_cli_calls_a_tls_server_with_the_ca_alone(pki):
    server = start_server_process(env=pki.server_env())
    try:
        wait_cli_serving(server.target, "--tls-ca", str(pki.ca))
        listed = run_cli("models", "list", "--address", server.target, "--tls-ca", str(pki.ca))
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.startswith("demo ")
    finally:
        stop_server_process(server)


def test_serve_with_a_key_of_another_certificate_exits_2_naming_the_file(pki, tmp_path):
    other_key = CertificateAuthority().issue_server().write(tmp_path, "other")[1]
    env = {**pki.server_env(), "INFERWIRE_SERVER__TLS__KEY_FILE": str(other_key)}
    result = run_cli("serve", "--address", "127.0.0.1:0", env=env)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: invalid configuration: server.tls.key_file: {other_key} does not match "
        f"the certificate in {pki.server_cert}"
    ]

"""TLS and mutual TLS on the listener, certificate rotation, and their start-up errors.

Servers of their own over fake backends, with certificates made by tests.support.certs.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from typer.testing import CliRunner, Result

from inferwire.cli import app
from inferwire.config import Settings, load_settings
from inferwire.core.errors import ConfigurationError
from inferwire.edge.certificates import CertificateFiles, is_loopback
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc
from tests.support.certs import CertificateAuthority, Issued, served_certificate_serial
from tests.support.fake_backend import FAKE_BACKEND, FakeBackends, serving_fakes

runner = CliRunner()


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority()


@pytest.fixture(scope="module")
def other_ca() -> CertificateAuthority:
    return CertificateAuthority("another CA")


def settings_for(address: str = "127.0.0.1:0", **tls: Path) -> Settings:
    return load_settings(
        server={
            "address": address,
            "health_check_interval_s": 3600,
            "tls": {k: str(v) for k, v in tls.items()},
        },
        models=[{"name": "m", "backend": FAKE_BACKEND, "load_on_startup": True}],
    )


def credentials(ca: CertificateAuthority, client: Issued | None = None) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=ca.cert_pem,
        private_key=client.key_pem if client else None,
        certificate_chain=client.cert_pem if client else None,
    )


async def list_models(port: int, creds: grpc.ChannelCredentials) -> list[str]:
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        response = await stub.ListModels(pb.ListModelsRequest(), timeout=5)
    return [m.name for m in response.models]


async def refused(port: int, creds: grpc.ChannelCredentials) -> bool:
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await list_models(port, creds)
    return failure.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.fixture
def server_files(tmp_path: Path, ca: CertificateAuthority) -> dict[str, Path]:
    cert, key = ca.issue_server().write(tmp_path, "server")
    return {"cert_file": cert, "key_file": key}


async def test_tls_handshake_succeeds_with_the_right_ca_and_fails_with_another(
    server_files, ca, other_ca
):
    async with serving_fakes(settings_for(**server_files)) as (server, _):
        assert await list_models(server.port, credentials(ca)) == ["m"]
        assert await refused(server.port, credentials(other_ca))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as plaintext:
            with pytest.raises(grpc.aio.AioRpcError):
                await inference_pb2_grpc.InferenceServiceStub(plaintext).ListModels(
                    pb.ListModelsRequest(), timeout=5
                )


async def test_health_address_answers_plaintext_probes_beside_a_tls_listener(server_files, ca):
    settings = settings_for(**server_files)
    settings.server.health_address = "127.0.0.1:0"
    async with serving_fakes(settings) as (server, _):
        assert server.health_port is not None and server.health_port != server.port
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.health_port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", "model/m"):
                request = health_pb2.HealthCheckRequest(service=service)
                reply = await health.Check(request, timeout=5)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            # Only health is served there: inference stays behind TLS.
            with pytest.raises(grpc.aio.AioRpcError) as refused_call:
                await inference_pb2_grpc.InferenceServiceStub(channel).ListModels(
                    pb.ListModelsRequest(), timeout=5
                )
            assert refused_call.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert await list_models(server.port, credentials(ca)) == ["m"]


async def test_mutual_tls_refuses_clients_without_a_certificate_from_the_client_ca(
    tmp_path, server_files, ca, other_ca
):
    client_ca = CertificateAuthority("client CA")
    settings = settings_for(**server_files, client_ca_file=client_ca.write(tmp_path, "clients"))
    async with serving_fakes(settings) as (server, _):
        assert await list_models(server.port, credentials(ca, client_ca.issue_client())) == ["m"]
        assert await refused(server.port, credentials(ca))
        assert await refused(server.port, credentials(ca, other_ca.issue_client()))


def kubernetes_volume(directory: Path, version: str, issued: Issued) -> None:
    """Lay out or update files as a Kubernetes Secret volume does: the names are links
    into `..data`, itself a link to a versioned folder, swapped atomically by rename."""
    issued.write(directory / version, "tls")
    os.symlink(version, directory / "..data_tmp")
    os.replace(directory / "..data_tmp", directory / "..data")
    for name in ("tls.crt", "tls.key"):
        if not (directory / name).is_symlink():
            os.symlink(f"..data/{name}", directory / name)


@pytest.mark.parametrize("layout", ["kubernetes_symlink_swap", "overwritten_in_place"])
async def test_rotated_certificate_serves_new_connections_and_open_streams_finish(
    tmp_path, ca, layout
):
    first, second = ca.issue_server(), ca.issue_server()
    if layout == "kubernetes_symlink_swap":
        kubernetes_volume(tmp_path, "..v1", first)
    else:
        first.write(tmp_path, "tls")
    files = {"cert_file": tmp_path / "tls.crt", "key_file": tmp_path / "tls.key"}
    async with serving_fakes(settings_for(**files)) as (server, backends):
        assert await asyncio.to_thread(served_certificate_serial, "127.0.0.1", server.port) == (
            first.serial
        )
        backends["m"].generation_gate.close()
        async with grpc.aio.secure_channel(f"127.0.0.1:{server.port}", credentials(ca)) as ch:
            stream = inference_pb2_grpc.InferenceServiceStub(ch).InferStream(
                pb.InferStreamRequest(model="m", prompt="hi"), timeout=10
            )
            await asyncio.wait_for(backends["m"].started.wait(), 5)

            if layout == "kubernetes_symlink_swap":
                kubernetes_volume(tmp_path, "..v2", second)
            else:
                second.write(tmp_path, "tls")

            serial = await asyncio.to_thread(served_certificate_serial, "127.0.0.1", server.port)
            assert serial == second.serial
            assert await list_models(server.port, credentials(ca)) == ["m"]
            backends["m"].generation_gate.open()
            messages = [message async for message in stream]
        assert "".join(m.text for m in messages) == "Hello, world"
        assert messages[-1].finish_reason == pb.FINISH_REASON_STOP


async def test_a_replaced_client_ca_applies_to_new_connections(tmp_path, server_files, ca):
    old_ca, new_ca = CertificateAuthority("old clients"), CertificateAuthority("new clients")
    client_ca_file = old_ca.write(tmp_path, "clients")
    async with serving_fakes(settings_for(**server_files, client_ca_file=client_ca_file)) as (s, _):
        assert await list_models(s.port, credentials(ca, old_ca.issue_client())) == ["m"]
        new_ca.write(tmp_path, "clients")
        assert await list_models(s.port, credentials(ca, new_ca.issue_client())) == ["m"]
        assert await refused(s.port, credentials(ca, old_ca.issue_client()))


def test_half_rotated_files_keep_the_previous_certificate_until_both_are_replaced(
    tmp_path, ca, caplog
):
    first, second = ca.issue_server(), ca.issue_server()
    cert, key = first.write(tmp_path, "tls")
    files = CertificateFiles(settings_for(cert_file=cert, key_file=key).server.tls)
    assert files.changed() is None  # nothing changed: no configuration, no read

    cert.write_bytes(second.cert_pem)  # the key still belongs to the first certificate
    caplog.set_level(logging.WARNING, logger="inferwire.edge.certificates")
    assert files.changed() is None
    assert files.changed() is None
    [warning] = [r for r in caplog.records if r.name == "inferwire.edge.certificates"]
    assert f"{key} does not match the certificate in {cert}" in warning.reason

    key.write_bytes(second.key_pem)
    assert files.changed() is not None
    assert files.changed() is None


def write_bytes(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        ("missing_cert", "server.tls.cert_file: cannot read {cert}: No such file or directory"),
        ("garbage_cert", "server.tls.cert_file: {cert} is not a PEM certificate file"),
        ("garbage_key", "server.tls.key_file: {key} is not a PEM private key"),
        ("mismatched_key", "server.tls.key_file: {key} does not match the certificate in {cert}"),
        ("garbage_ca", "server.tls.client_ca_file: {ca} is not a PEM certificate file"),
        ("unreadable_key", "server.tls.key_file: cannot read {key}: Permission denied"),
    ],
)
def test_unusable_tls_files_are_a_configuration_error_naming_the_file(
    tmp_path, ca, broken, message
):
    cert, key = ca.issue_server().write(tmp_path, "server")
    ca_file = ca.write(tmp_path)
    if broken == "missing_cert":
        cert = tmp_path / "absent.crt"
    elif broken == "garbage_cert":
        write_bytes(cert, b"not a certificate\n")
    elif broken == "garbage_key":
        write_bytes(key, b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    elif broken == "mismatched_key":
        write_bytes(key, ca.issue_server().key_pem)
    elif broken == "garbage_ca":
        write_bytes(ca_file, b"\x00\x01binary")
    elif broken == "unreadable_key":
        if os.geteuid() == 0:
            pytest.skip("root reads any file")
        key.chmod(0)
    settings = settings_for(cert_file=cert, key_file=key, client_ca_file=ca_file)
    with pytest.raises(ConfigurationError) as error:
        InferwireServer(settings, backend_factory=FakeBackends())
    text = str(error.value)
    assert "\n" not in text
    assert text.startswith(message.format(cert=cert, key=key, ca=ca_file)), text


@pytest.mark.parametrize(
    ("tls", "why"),
    [
        ({"cert_file": "a.crt"}, "server.tls: cert_file and key_file are set together"),
        ({"client_ca_file": "ca.crt"}, "server.tls: client_ca_file (mutual TLS) needs cert_file"),
    ],
)
def test_incomplete_tls_settings_are_refused(tls, why):
    with pytest.raises(ConfigurationError, match=rf"^{__import__('re').escape(why)}"):
        load_settings(server={"tls": tls})


def test_tls_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("INFERWIRE_SERVER__TLS__CERT_FILE", "/etc/tls/tls.crt")
    monkeypatch.setenv("INFERWIRE_SERVER__TLS__KEY_FILE", "/etc/tls/tls.key")
    tls = load_settings().server.tls
    assert (tls.cert_file, tls.key_file, tls.client_ca_file) == (
        Path("/etc/tls/tls.crt"),
        Path("/etc/tls/tls.key"),
        None,
    )


def plaintext_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING and "server.tls.cert_file" in r.getMessage()
    ]


@pytest.mark.parametrize(
    ("address", "with_tls", "warnings"),
    [("0.0.0.0:0", False, 1), ("127.0.0.1:0", False, 0), ("0.0.0.0:0", True, 0)],
)
async def test_plaintext_off_loopback_is_warned_about_once_naming_the_setting(
    caplog, server_files, address, with_tls, warnings
):
    caplog.set_level(logging.INFO)
    async with serving_fakes(settings_for(address, **(server_files if with_tls else {}))):
        pass
    assert len(plaintext_warnings(caplog)) == warnings


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1:50051", True),
        ("[::1]:50051", True),
        ("localhost:50051", True),
        ("unix:/run/inferwire.sock", True),
        ("0.0.0.0:50051", False),
        ("[::]:50051", False),
        ("10.0.0.7:50051", False),
        ("inferwire.example:50051", False),
    ],
)
def test_loopback_addresses(address, loopback):
    assert is_loopback(address) is loopback


async def test_cli_client_commands_use_the_tls_flags_and_repeat_them_in_hints(tmp_path, ca):
    server_cert, server_key = ca.issue_server().write(tmp_path, "server")
    client_cert, client_key = ca.issue_client().write(tmp_path, "client")
    settings = settings_for(
        cert_file=server_cert, key_file=server_key, client_ca_file=ca.write(tmp_path)
    )
    flags = ["--tls-ca", str(tmp_path / "ca.crt")]
    mutual = [*flags, "--tls-cert", str(client_cert), "--tls-key", str(client_key)]

    async def cli(*args: str) -> Result:
        argv = [*args, "--address", f"127.0.0.1:{server.port}"]
        return await asyncio.to_thread(runner.invoke, app, argv, env={"INFERWIRE_TLS_CA": None})

    async with serving_fakes(settings) as (server, _):
        listed = await cli("models", "list", *mutual)
        assert listed.exit_code == 0, listed.output
        assert listed.stdout.split()[0] == "m"
        assert (await cli("health", *mutual)).stdout == "SERVING\n"
        unknown = await cli("infer", "nope", "hi", *mutual)
        assert unknown.exit_code == 1
        hint = f"hint: inferwire models list --address 127.0.0.1:{server.port} {' '.join(mutual)}"
        assert hint in unknown.stderr.splitlines()
        without_certificate = await cli("models", "list", *flags)
        assert without_certificate.exit_code == 1
        assert without_certificate.stderr.startswith("error: UNAVAILABLE: ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tls-cert", "c.crt"], "Invalid value for '--tls-cert' and '--tls-key': give both"),
        (["--tls-ca", "/nonexistent/ca.crt"], "Invalid value for '--tls-ca': cannot read"),
    ],
)
def test_cli_refuses_incomplete_or_unreadable_tls_flags_before_calling(args, message):
    result = runner.invoke(app, ["health", "--address", "127.0.0.1:1", *args])
    assert result.exit_code == 2
    assert message in " ".join(result.stderr.replace("│", " ").split())

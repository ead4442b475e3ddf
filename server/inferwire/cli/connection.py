"""What every client command shares: the server to call (--address, --token, --tls-*,
--timeout), its channel, and the hint that goes with a failed call."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import grpc
import typer

from inferwire.cli.failures import fail, print_hint
from inferwire.cli.files import read_bytes

DEFAULT_TARGET = "localhost:50051"
ADDRESS_ENV = "INFERWIRE_ADDRESS"
TOKEN_ENV = "INFERWIRE_TOKEN"
TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV = (
    "INFERWIRE_TLS_CA",
    "INFERWIRE_TLS_CERT",
    "INFERWIRE_TLS_KEY",
)
BEARER = "Bearer "


def _token_alone(token: str | None) -> str | None:
    """A token pasted with its scheme would be sent as `Bearer Bearer ...`: drop it, and say so."""
    if token and token[: len(BEARER)].lower() == BEARER.lower():
        print_hint(f"give the token without the {BEARER!r} prefix; it was dropped")
        return token[len(BEARER) :].strip()
    return token


AddressOption = Annotated[
    str,
    typer.Option(
        "--address", "-a", envvar=ADDRESS_ENV, metavar="HOST:PORT", help="Server to call."
    ),
]
TimeoutOption = Annotated[
    float, typer.Option("--timeout", min=0, metavar="SECONDS", help="RPC deadline.")
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar=TOKEN_ENV,
        metavar="TOKEN",
        show_default=False,
        show_envvar=True,
        callback=_token_alone,
        help="Bearer token sent as `authorization: Bearer TOKEN` (see `inferwire token new`); "
        "a leading 'Bearer ' is dropped, with a hint.",
    ),
]


def _pem_file_option(flag: str, envvar: str, help: str) -> Any:
    return typer.Option(flag, envvar=envvar, metavar="PATH", help=help)


TlsCaOption = Annotated[
    Path | None,
    _pem_file_option(
        "--tls-ca",
        TLS_CA_ENV,
        "PEM CA certificates to verify the server's certificate with; turns TLS on.",
    ),
]
TlsCertOption = Annotated[
    Path | None,
    _pem_file_option(
        "--tls-cert",
        TLS_CERT_ENV,
        "PEM client certificate, for mutual TLS (with --tls-key); turns TLS on.",
    ),
]
TlsKeyOption = Annotated[
    Path | None, _pem_file_option("--tls-key", TLS_KEY_ENV, "PEM private key of --tls-cert.")
]


class ClientTls(NamedTuple):
    """The client commands' --tls-ca, --tls-cert and --tls-key; all None: plaintext."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def flags(self) -> list[tuple[str, str, Path | None]]:
        """(flag, environment variable, value) of each option."""
        return [
            ("--tls-ca", TLS_CA_ENV, self.ca),
            ("--tls-cert", TLS_CERT_ENV, self.cert),
            ("--tls-key", TLS_KEY_ENV, self.key),
        ]


PLAINTEXT = ClientTls()


def channel_credentials(tls: ClientTls) -> grpc.ChannelCredentials | None:
    """TLS credentials from the PEM files given, or None (plaintext) when none is given.

    Without --tls-ca the server is verified against the system's CA certificates;
    --tls-cert and --tls-key add a client certificate (mutual TLS).
    """
    if tls == PLAINTEXT:
        return None
    if (tls.cert is None) != (tls.key is None):
        raise typer.BadParameter(
            "give both, for mutual TLS", param_hint="'--tls-cert' and '--tls-key'"
        )
    contents = {flag: read_bytes(path, flag) if path else None for flag, _, path in tls.flags()}
    return grpc.ssl_channel_credentials(
        root_certificates=contents["--tls-ca"],
        private_key=contents["--tls-key"],
        certificate_chain=contents["--tls-cert"],
    )


class Target(NamedTuple):
    """The server a client command calls, and how: address, TLS files and bearer token."""

    address: str = DEFAULT_TARGET
    tls: ClientTls = PLAINTEXT
    token: str | None = None

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Every call's metadata: the bearer token, when one is given."""
        return (("authorization", f"{BEARER}{self.token}"),) if self.token else ()

    def command_line(self, *words: str) -> str:
        """The inferwire command to run next, against the same server, the same way."""
        given: list[tuple[str, str, str | None]] = [
            ("--address", self.address, os.environ.get(ADDRESS_ENV, DEFAULT_TARGET))
        ]
        given += [
            (flag, str(path), os.environ.get(env)) for flag, env, path in self.tls.flags() if path
        ]
        for flag, value, default in given:
            if value != default:
                words = (*words, flag, value)
        return " ".join(("inferwire", *words))

    @contextlib.contextmanager
    def connect(self, model: str | None = None) -> Iterator[grpc.Channel]:
        """A channel to the server; a failed RPC inside prints its status and exits 1.

        `model` is the model the RPC runs on, for the hint to load it when it is not loaded.
        """
        credentials = channel_credentials(self.tls)
        with (
            grpc.secure_channel(self.address, credentials)
            if credentials
            else grpc.insecure_channel(self.address)
        ) as channel:
            try:
                yield channel
            except grpc.RpcError as error:
                fail(error, self._hint(error, model))

    def _hint(self, error: grpc.RpcError, model: str | None) -> str | None:
        code = error.code()
        if code == grpc.StatusCode.NOT_FOUND:
            return self.command_line("models", "list")
        if code == grpc.StatusCode.FAILED_PRECONDITION and model:
            return self.command_line("models", "load", model)
        if code == grpc.StatusCode.UNAUTHENTICATED and not self.token:
            return f"the server asks for a bearer token: give --token TOKEN or set {TOKEN_ENV}"
        if code == grpc.StatusCode.UNAVAILABLE:
            return self._unavailable_hint(error.details() or "")
        return None

    def _unavailable_hint(self, details: str) -> str | None:
        """Why the channel could not be opened, read from gRPC core's last error."""
        if "Connection refused" in details:
            return (
                f"nothing answers at {self.address}: is the server running, and is this "
                f"its address (--address or {ADDRESS_ENV})?"
            )
        if "WRONG_VERSION_NUMBER" in details and self.tls != PLAINTEXT:
            return "the server may not use TLS: call it without --tls-ca, --tls-cert and --tls-key"
        if "CERTIFICATE_VERIFY_FAILED" in details:
            where = "--tls-ca" if self.tls.ca else "the system's CA certificates (give --tls-ca)"
            return f"the server's certificate is not signed by a CA in {where}"
        if "Socket closed" not in details:
            return None
        if self.tls == PLAINTEXT:
            return (
                "the server may need TLS: give --tls-ca (and --tls-cert and --tls-key "
                "if it asks for a client certificate)"
            )
        if self.tls.cert is None:
            return "the server may ask for a client certificate: give --tls-cert and --tls-key"
        return "the server may not accept the client certificate in --tls-cert"


def client_command(timeout: float) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a client command --address, --timeout (default `timeout`), --token and --tls-*,
    passed to it as `target` and `timeout`."""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        common = [
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=option
            )
            for name, option, default in (
                ("address", AddressOption, DEFAULT_TARGET),
                ("timeout", TimeoutOption, timeout),
                ("token", TokenOption, None),
                ("tls_ca", TlsCaOption, None),
                ("tls_cert", TlsCertOption, None),
                ("tls_key", TlsKeyOption, None),
            )
        ]
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name not in ("target", "timeout")]

        @functools.wraps(command)
        def with_target(
            *args: Any,
            address: str,
            timeout: float,
            token: str | None,
            tls_ca: Path | None,
            tls_cert: Path | None,
            tls_key: Path | None,
            **kwargs: Any,
        ) -> None:
            target = Target(address, ClientTls(tls_ca, tls_cert, tls_key), token)
            command(*args, target=target, timeout=timeout, **kwargs)

        with_target.__signature__ = signature.replace(parameters=[*own, *common])  # type: ignore[attr-defined]
        return with_target

    return decorate

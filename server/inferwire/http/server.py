"""uvicorn on the server's own event loop: one process, one core, one set of models.

`HttpServer` binds `server.http_address` (port 0 picks a free port), serves the Starlette
app with uvicorn's httptools protocol (h11 without it), and stops in step with the gRPC
listener: new connections are refused, requests in flight (streams included) get the
grace period, then what is left is cancelled.

TLS uses the same `server.tls` files as gRPC and rotates with them: the TLS context's SNI
callback asks `CertificateFiles.changed` before each handshake and swaps in a new context
when the files changed. With a client CA, client certificates are required, and a
connection's certificate subjects (CN, then the subject alternative names) reach the
request (`TLS_SUBJECTS` in the ASGI state) for `server.auth.certificate_tenants`.

A connection that has not sent a whole request's headers within `HEADER_TIMEOUT_S` is
closed, so slow senders (slowloris) cannot hold connections open.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import socket
import ssl
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from inferwire.addresses import split_host_port
from inferwire.edge.certificates import CertificateFiles
from inferwire.http.calls import TLS_SUBJECTS

log = logging.getLogger(__name__)

HEADER_TIMEOUT_S = 30.0

if importlib.util.find_spec("httptools") is not None:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Protocol
else:  # pragma: no cover  (httptools is a dependency; h11 is uvicorn's own fallback)
    from uvicorn.protocols.http.h11_impl import H11Protocol as _Protocol  # type: ignore[assignment]


def _subjects(certificate: dict[str, Any]) -> list[str]:
    subjects = [
        value for rdn in certificate.get("subject", ()) for key, value in rdn if key == "commonName"
    ]
    subjects += [value for _, value in certificate.get("subjectAltName", ())]
    return subjects


class _Protocol_WithCertificate(_Protocol):
    """uvicorn's protocol, plus the client certificate's subjects and a header deadline."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # asyncio sets TCP_NODELAY only on sockets it made itself (proto IPPROTO_TCP); ours
        # come from a socket we bound, so without this Nagle holds every small event after
        # a keep-alive connection's first few (once the client delays its ACKs), and a
        # stream arrives in one piece up to 40 ms late (docs/performance.md).
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ssl_object = transport.get_extra_info("ssl_object")
        certificate = ssl_object.getpeercert() if ssl_object is not None else None
        if certificate:
            # Each request's ASGI state is a copy of this: the subjects ride with them.
            self.app_state = {**self.app_state, TLS_SUBJECTS: tuple(_subjects(certificate))}
        self._header_deadline = self.loop.call_later(HEADER_TIMEOUT_S, self._close_if_silent)

    def _close_if_silent(self) -> None:
        if self.cycle is None and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._header_deadline.cancel()
        super().connection_lost(exc)


class _RotatingContext:
    """A server TLS context over `server.tls`, replaced when its files change."""

    def __init__(self, files: CertificateFiles) -> None:
        self._files = files
        self.context = self._make()

    def _make(self) -> ssl.SSLContext:
        settings = self._files.settings
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        assert settings.cert_file is not None and settings.key_file is not None
        context.load_cert_chain(settings.cert_file, settings.key_file)
        if settings.client_ca_file is not None:
            context.load_verify_locations(settings.client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        context.set_alpn_protocols(["http/1.1"])
        context.sni_callback = self._before_handshake
        return context

    def _before_handshake(self, ssl_object: ssl.SSLObject, name: str | None, _: Any) -> None:
        if self._files.changed() is not None:
            try:
                self.context = self._make()
            except (OSError, ssl.SSLError):
                log.exception("TLS: the new certificate files do not load; keeping the old ones")
        ssl_object.context = self.context


class HttpServer:
    """The HTTP listener: `start()` binds and serves, `stop()` drains."""

    def __init__(self, app: ASGIApp, address: str, tls: CertificateFiles | None) -> None:
        self.address = address
        self._app = app
        self._tls = _RotatingContext(tls) if tls is not None else None
        self._server: uvicorn.Server | None = None
        self._ticks: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None

    def _bind(self) -> socket.socket:
        host, port = split_host_port(self.address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as error:
            sock.close()
            raise OSError(
                f"server.http_address: could not listen on {self.address}: "
                f"{error.strerror or error}"
            ) from None
        sock.listen(1024)
        sock.setblocking(False)
        return sock

    async def start(self, grace_s: float) -> int:
        """Serve on the running loop; returns the bound port."""
        self._socket = self._bind()
        tls = self._tls
        config = uvicorn.Config(
            self._app,
            http=_Protocol_WithCertificate,
            lifespan="off",
            log_config=None,
            access_log=False,  # the edge writes the access line
            server_header=False,
            timeout_graceful_shutdown=int(max(grace_s, 1)),
            ssl_context_factory=(lambda _config, _default: tls.context) if tls else None,
        )
        config.load()
        self._server = uvicorn.Server(config)
        # What uvicorn.Server.serve does before its startup, less taking the signals:
        # SIGTERM is the house's, which drains both doors.
        self._server.lifespan = config.lifespan_class(config)
        await self._server.startup(sockets=[self._socket])
        self._ticks = asyncio.create_task(self._server.main_loop(), name="http-ticks")
        port: int = self._socket.getsockname()[1]
        return port

    async def stop(self) -> None:
        """Refuse new connections; let requests in flight finish within the grace period."""
        server, self._server = self._server, None
        if server is None:
            return
        server.should_exit = True
        if self._ticks is not None:
            await self._ticks
        await server.shutdown(sockets=[self._socket] if self._socket else None)
